"""Shell completion for ``tidegate``, generated from its argparse parser (so it never drifts from
the commands): ``eval "$(tidegate completion bash)"`` in ``~/.bashrc``, or
``eval "$(tidegate completion zsh)"`` in ``~/.zshrc`` (zsh runs the bash script through
``bashcompinit``). Completes subcommands, their options and the choices of choice arguments."""

from __future__ import annotations

import argparse
import shlex


def command_tree(parser: argparse.ArgumentParser, path: str = "") -> dict[str, list[str]]:
    """For each command path (``""``, ``"override"``, ``"override pin"``...) the words that may
    follow it: subcommands, option strings and choices."""
    words: list[str] = []
    tree: dict[str, list[str]] = {}
    for action in parser._actions:  # argparse has no public walk of its tree
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                words.append(name)
                tree.update(command_tree(child, f"{path} {name}".strip()))
        elif action.option_strings:
            words.extend(o for o in action.option_strings if o.startswith("--"))
        elif action.choices:
            words.extend(str(c) for c in action.choices)
    tree[path] = sorted(set(words))
    return tree


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    tree = command_tree(parser)
    cases = "\n".join(f"        {shlex.quote(path or '_')}) words={shlex.quote(' '.join(ws))} ;;"
                      for path, ws in sorted(tree.items()))
    body = f"""_tidegate_complete() {{
    local cur path="" w i words
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${{COMP_WORDS[i]}}"
        case "$w" in -*) continue ;; esac
        case "${{path:+$path }}$w" in
{_known(tree)}) path="${{path:+$path }}$w" ;;
        esac
    done
    case "${{path:-_}}" in
{cases}
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -o default -F _tidegate_complete tidegate"""
    if shell == "zsh":
        return "autoload -U +X bashcompinit && bashcompinit\n" + body
    return body


def _known(tree: dict[str, list[str]]) -> str:
    return "            " + "|".join(shlex.quote(p) for p in sorted(tree) if p)
