"""The local journal: intents (and their outcomes) written while the database cannot take them.

A file of JSON lines on a volume of the daemon's own (the chart mounts one), each append written
whole and ``fsync``'d before it returns, so an intent the daemon acts on survives a kill -9 or a
power loss. The first line names the journal (a random id) and the format of the daemon that
started it (``version``; readers go by each line's ``kind``). Every later line is an entry:

- ``{"kind": "intents", "handle": -N, "n": ..., "dry_run": ..., "z": ...}``: a tick's ``n``
  decisions, all in one line, one ``fsync`` and one compressed block (zlib, base64) of the JSON
  list of ``{"decision": codec.decision_to_json(...), "signals": codec.signals_to_json(...)}``, each
  decision's history cut to what the log stores of it (this tick's point, scale step and rule
  state), plus ``"skipped": detail`` for a decision stored ``skipped`` at once though it actuates
  (a shadow decision). The decisions of one tick share most of their text (the same keys, pools,
  policies and reason codes), so one block of them is several times smaller than each compressed
  on its own (``python bench/journal_size.py``). Their handles (the negative ids the tick uses
  until the database gives them real ones) are ``-N``, ``-N - 1``, ... in order.
- ``{"kind": "intent", "handle": -N, "dry_run": ..., "z": ...}``: one decision a line, as daemons
  before the tick's block wrote them; still read, so a daemon upgraded during an outage replays
  the journal its predecessor left.
- ``{"kind": "outcome", "decision_id": ID, "actions": [...], "outcome": ..., "detail": ...,
  "applied_replicas": ...}``: what came of an intent; ``ID`` is a handle of this journal or the
  id of a decision already in the database.

When the database answers again the recorder replays the entries in file order
(``Repository.replay_journal``, which decodes them a line at a time as it writes them: nothing is
decoded while the database is away): whole at start, a slice a tick while the daemon runs, each
slice in one transaction that also records the journal's id and the byte offset it reached, and
only once the last is committed removes the file: a daemon killed between a commit and the next
slice, or the removal, goes on from that offset without writing any entry twice. A slice ends
only before a tick's intents line, so the outcomes it holds name intents it holds. A line torn
by a crash during its own append (the intents it held were never acted on: acting waits for the
append to return) is skipped with a warning; the next append starts on a line of its own. An
append the disk refuses (full, read-only) raises ``OSError`` and leaves the file as it was (best
effort: a short write is cut back), so the tick acts on nothing it could not record.

What waits in it (``decisions``, ``outcomes``, ``since``: ``/v1/status``'s ``journal`` and the
status page's flag) is counted as it is appended; a journal found at start is read once for it,
decoding only its first intents line (the time of its oldest decision).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import stat
import uuid
import zlib
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator, Sequence

from controller.core.model import Action, Decision, History, ModelSignals
from controller.db import codec
from controller.logs import log

logger = logging.getLogger("tidegate.journal")

__all__ = ["Journal", "JournalLine"]

VERSION = 2
"""The format this daemon starts journals in: a tick's intents one line (``kind: intents``)."""


def _pack(doc: Any) -> str:
    # level 9: ~10 % smaller than 6 on a tick's block, ~20 ms for 1,000 decisions (5 MB of JSON)
    return base64.b64encode(zlib.compress(codec.dump_json(doc), 9)).decode()


def _unpack(text: str) -> Any:
    return json.loads(zlib.decompress(base64.b64decode(text)))  # json: orjson reads an int beyond 64 bits as a float


def _this_tick(d: Decision) -> Decision:
    """The decision with only what its tick added to the history (what the log keeps of it)."""
    h = d.history
    return replace(d, history=History(recommendations=tuple(p for p in h.recommendations if p[0] == d.at),
                                      scale_events=tuple(e for e in h.scale_events if e.at == d.at),
                                      rule_state=h.rule_state))


@dataclass(frozen=True)
class JournalLine:
    """One line of a journal, read: its entries (none for the header or a torn line), the byte
    offset just after it, and whether it is a tick's intents (``kind: intents``). A replay may
    stop before such a line: the outcomes of the lines before it name only intents before it."""

    end: int
    tick: bool
    entries: list[dict[str, Any]]


class Journal:
    """Append-only, fsync'd JSON-lines journal at ``path`` (created on the first append)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        lowest, self._outcomes, self._since = self._scan()
        self._next_handle = lowest - 1

    def exists(self) -> bool:
        """The journal holds something (a regular, non-empty file)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_size > 0

    def journal_id(self) -> str | None:
        """The id its first line gives the journal (``None``: no journal, or that line torn)."""
        if not self.exists():
            return None
        with open(self.path, encoding="utf-8") as f:
            try:
                header = json.loads(f.readline())
            except json.JSONDecodeError:
                return None
        return str(header["journal"]) if "journal" in header else None

    def entries(self) -> Iterator[dict[str, Any]]:
        """The entries in file order, one per intent (``kind: intent``, its ``handle``,
        ``dry_run``, ``decision`` and ``signals`` as JSON, ``skipped`` where set) or outcome,
        whichever format the lines are in; decoded as they are read, one line at a time (a
        replay holds one tick's decisions, not the whole journal)."""
        for line in self.read_from(0):
            yield from line.entries

    def read_from(self, offset: int) -> Iterator[JournalLine]:
        """The lines from byte ``offset`` (the start of a line: 0, or a ``JournalLine.end``) on,
        each with its entries decoded as it is read (:meth:`entries`'s)."""
        for end, doc in self._lines(offset):
            if doc is None or "journal" in doc:
                yield JournalLine(end, False, [])
            elif doc.get("kind") == "intents":
                yield JournalLine(end, True, [
                    {"kind": "intent", "handle": int(doc["handle"]) - k, "dry_run": doc["dry_run"], **item}
                    for k, item in enumerate(_unpack(doc["z"]))])
            elif "z" in doc:
                yield JournalLine(end, False, [{**{k: v for k, v in doc.items() if k != "z"}, **_unpack(doc["z"])}])
            else:
                yield JournalLine(end, False, [doc])

    def size(self) -> int:
        """Bytes in the journal (0: none, or not a regular file); one ``stat``: it runs every tick."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return 0
        return st.st_size if stat.S_ISREG(st.st_mode) else 0

    def _lines(self, offset: int = 0) -> Iterator[tuple[int, dict[str, Any] | None]]:
        """Each line from byte ``offset``, parsed (its intents still packed), with the offset just
        after it; a torn one is ``None``, with a warning."""
        if not self.exists():
            return
        with open(self.path, "rb") as f:
            f.seek(offset)
            end = offset
            for raw in f:
                start, end = end, end + len(raw)
                try:
                    yield end, dict(json.loads(raw))
                except (ValueError, TypeError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                    log(logger, logging.WARNING, "journal line torn by a crash; skipped", path=str(self.path),
                        offset=start)
                    yield end, None

    def _scan(self) -> tuple[int, int, datetime | None]:
        """What the journal holds, read once when it is opened: the lowest handle of its intents
        (0: none), from the lines' ``handle`` and ``n``; its outcomes; and when its oldest intent
        was decided, from the first intents line (the only one decoded)."""
        low, outcomes, since = 0, 0, None
        for _, entry in self._lines():
            if entry is None:
                continue
            kind = entry.get("kind")
            if kind == "intents":
                low = min(low, int(entry["handle"]) - int(entry["n"]) + 1)
            elif kind == "intent":
                low = min(low, int(entry["handle"]))
            elif kind == "outcome":
                outcomes += 1
            if since is None and kind in ("intents", "intent"):
                body: Any = _unpack(entry["z"]) if "z" in entry else entry
                first = body[0] if kind == "intents" else body  # a tick's block, or one intent
                since = codec.decode_datetime(first["decision"]["at"])
        return low, outcomes, since

    def decisions(self) -> int:
        """Decisions (intents) the journal holds: its handles run from -1 down, one each."""
        return -1 - self._next_handle

    def outcomes(self) -> int:
        """Outcomes the journal holds (of its own intents, or of decisions already in the log)."""
        return self._outcomes

    def since(self) -> datetime | None:
        """When the oldest decision the journal holds was made (the daemon's clock; ``None``: it
        holds none)."""
        return self._since

    def append_intents(self, items: Sequence[tuple[Decision, ModelSignals]], dry_run: bool,
                       skipped: Sequence[str | None] = ()) -> list[int]:
        """Journal a tick's intents as one line; returns their handles (negative ids).
        ``skipped``: per item, the outcome detail of one stored ``skipped`` at once though it
        actuates (``Repository.record_decisions``). Raises ``OSError`` when the journal cannot be
        written (disk full, read-only volume)."""
        if not items:
            return []
        block = [{"decision": codec.decision_to_json(_this_tick(d)), "signals": codec.signals_to_json(sig),
                  **({} if detail is None else {"skipped": detail})}
                 for (d, sig), detail in zip(items, skipped or [None] * len(items), strict=True)]
        self._append([{"kind": "intents", "handle": self._next_handle, "n": len(block), "dry_run": dry_run,
                       "z": _pack(block)}])
        handles = list(range(self._next_handle, self._next_handle - len(items), -1))
        self._next_handle -= len(items)
        if self._since is None:
            self._since = items[0][0].at
        return handles

    def append_outcomes(self, items: Sequence[tuple[int, Sequence[Action], str, str | None, int | None]]) -> None:
        """Journal outcomes (``(decision_id_or_handle, actions, outcome, detail, applied_replicas)``)."""
        self._append([
            {"kind": "outcome", "decision_id": i, "actions": [codec.action_to_json(a) for a in actions],
             "outcome": outcome, "detail": detail, "applied_replicas": applied}
            for i, actions, outcome, detail, applied in items
        ])
        self._outcomes += len(items)

    def _append(self, entries: list[dict[str, Any]]) -> None:
        """Write ``entries`` as lines, whole, and ``fsync`` them; on any error cut the file back
        to what it held (best effort: the disk may refuse this too) and raise."""
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)  # read: its last byte
        try:
            st = os.fstat(fd)
            size, regular = st.st_size, stat.S_ISREG(st.st_mode)
            lines = [codec.dump_json(e) for e in entries]
            if size == 0:
                lines.insert(0, codec.dump_json({"journal": uuid.uuid4().hex, "version": VERSION}))
            elif regular and os.pread(fd, 1, size - 1) != b"\n":
                lines.insert(0, b"")  # the torn end of a crashed append: left on a line of its own
            data = memoryview(b"\n".join(lines) + b"\n")
            try:
                while data:  # a write may take part of it (the disk filling up), then refuse the rest
                    data = data[os.write(fd, data):]
                os.fsync(fd)
            except OSError:
                # a half-written line would be read as torn, its intents lost after acting on them
                try:
                    if regular:
                        os.ftruncate(fd, size)
                except OSError:
                    pass
                raise
        finally:
            os.close(fd)
        if size == 0:
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
        self._next_handle, self._outcomes, self._since = -1, 0, None
