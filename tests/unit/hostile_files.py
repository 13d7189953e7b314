"""Hostile policy files and the Kubernetes ConfigMap mount layout, shared by the unit and
integration tests of policy loading."""

from __future__ import annotations

from pathlib import Path

SECRET = "aws_secret_access_key: wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
"""A line of a file outside the policies directory that must never show anywhere."""


def laughs(levels: int, width: int = 10) -> str:
    """A "billion laughs" document: each level is ``width`` aliases of the one before, so the
    last one stands for ``width ** levels`` strings."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def configmap_mount(d: Path, files: dict[str, str]) -> None:
    """The layout the kubelet gives a mounted ConfigMap: ``name -> ..data/name``,
    ``..data -> ..2026_11_23_22_30_00.123456789``, the files in the timestamped directory."""
    stamp = d / "..2026_11_23_22_30_00.123456789"
    stamp.mkdir(parents=True)
    for name, text in files.items():
        (stamp / name).write_text(text)
        (d / name).symlink_to(Path("..data") / name)
    (d / "..data").symlink_to(stamp.name)
