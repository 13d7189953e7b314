"""The local journal: intents (and their outcomes) written while the database cannot take them.

A file of JSON lines on a volume of the daemon's own (the chart mounts one), each append flushed
and ``fsync``'d before it returns, so an intent the daemon acts on survives a kill -9 or a power
loss. The first line names the journal (a random id); every later line is an entry:

- ``{"kind": "intent", "handle": -N, "dry_run": ..., "z": ...}``: one decision with its signals,
  ``{"decision": codec.decision_to_json(...), "signals": codec.signals_to_json(...)}`` compressed
  (zlib, base64) with the decision's history cut to what the log stores of it (this tick's point,
  scale step and rule state). ``handle`` is the negative id the tick uses for it until the
  database gives it a real one.
- ``{"kind": "outcome", "decision_id": ID, "actions": [...], "outcome": ..., "detail": ...,
  "applied_replicas": ...}``: what came of an intent; ``ID`` is a handle of this journal or the
  id of a decision already in the database.

When the database answers again the recorder replays the entries in file order in one transaction
(``Repository.replay_journal``) that also records the journal's id, and only then removes the
file: a daemon killed between the commit and the removal finds the id already replayed and removes
the file without writing its entries twice. A line torn by a crash during its own append (the
intent it held was never acted on: acting waits for the append to return) is skipped with a
warning.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import stat
import uuid
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from controller.core.model import Action, Decision, History, ModelSignals
from controller.db import codec
from controller.logs import log

logger = logging.getLogger("tidegate.journal")

__all__ = ["Journal"]


def _pack(doc: dict[str, Any]) -> str:
    return base64.b64encode(zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 6)).decode()


def _unpack(text: str) -> dict[str, Any]:
    return dict(json.loads(zlib.decompress(base64.b64decode(text))))


def _this_tick(d: Decision) -> Decision:
    """The decision with only what its tick added to the history (what the log keeps of it)."""
    h = d.history
    return replace(d, history=History(recommendations=tuple(p for p in h.recommendations if p[0] == d.at),
                                      scale_events=tuple(e for e in h.scale_events if e.at == d.at),
                                      rule_state=h.rule_state))


class Journal:
    """Append-only, fsync'd JSON-lines journal at ``path`` (created on the first append)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._next_handle = -1 - sum(1 for e in self.entries()[1] if e.get("kind") == "intent")

    def __len__(self) -> int:
        return len(self.entries()[1])

    def exists(self) -> bool:
        """The journal holds something (a regular, non-empty file)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_size > 0

    def entries(self) -> tuple[str | None, list[dict[str, Any]]]:
        """``(journal_id, entries)`` in file order (intents unpacked: ``decision`` and ``signals``
        as JSON); ``(None, [])`` when there is no journal."""
        if not self.exists():
            return None, []
        journal_id: str | None = None
        out: list[dict[str, Any]] = []
        with open(self.path, encoding="utf-8") as f:
            for n, line in enumerate(f, start=1):
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    log(logger, logging.WARNING, "journal line torn by a crash; skipped", path=str(self.path), line=n)
                    continue
                if "journal" in entry:
                    journal_id = str(entry["journal"])
                elif "z" in entry:
                    out.append({**{k: v for k, v in entry.items() if k != "z"}, **_unpack(entry["z"])})
                else:
                    out.append(entry)
        return journal_id, out

    def append_intents(self, items: Sequence[tuple[Decision, ModelSignals]], dry_run: bool) -> list[int]:
        """Journal a tick's intents; returns their handles (negative ids). Raises ``OSError`` when
        the journal cannot be written (disk full, read-only volume)."""
        handles = list(range(self._next_handle, self._next_handle - len(items), -1))
        self._append([
            {"kind": "intent", "handle": h, "dry_run": dry_run,
             "z": _pack({"decision": codec.decision_to_json(_this_tick(d)), "signals": codec.signals_to_json(sig)})}
            for h, (d, sig) in zip(handles, items)
        ])
        self._next_handle -= len(items)
        return handles

    def append_outcomes(self, items: Sequence[tuple[int, Sequence[Action], str, str | None, int | None]]) -> None:
        """Journal outcomes (``(decision_id_or_handle, actions, outcome, detail, applied_replicas)``)."""
        self._append([
            {"kind": "outcome", "decision_id": i, "actions": [codec.action_to_json(a) for a in actions],
             "outcome": outcome, "detail": detail, "applied_replicas": applied}
            for i, actions, outcome, detail, applied in items
        ])

    def _append(self, entries: list[dict[str, Any]]) -> None:
        new = not self.exists()
        lines = [json.dumps({"journal": uuid.uuid4().hex, "version": 1})] if new else []
        lines += [json.dumps(e, separators=(",", ":")) for e in entries]
        data = ("\n".join(lines) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            size = os.fstat(fd).st_size
            try:
                os.write(fd, data)
                os.fsync(fd)
            except OSError:
                # a half-written line would be read as torn; better none (best effort: the disk
                # may refuse this too)
                try:
                    if stat.S_ISREG(os.fstat(fd).st_mode):
                        os.ftruncate(fd, size)
                except OSError:
                    pass
                raise
        finally:
            os.close(fd)
        if new:
            self._sync_dir()

    def _sync_dir(self) -> None:
        try:
            fd = os.open(self.path.parent, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def remove(self) -> None:
        """Delete the journal (after its replay was committed); only a regular file is removed."""
        if self.exists():
            self.path.unlink()
            self._sync_dir()
        self._next_handle = -1
