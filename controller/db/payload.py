"""The bulky part of a decision row, small: signals, recommendations, trace and rule state in one
zlib-compressed JSON document per row, compressed against the previous row of the same model.

A decision's signals, trace and rule state differ little from the previous tick's (the forecast
rule's state is a sliding window of samples: one new sample a tick). So each row's document is
compressed with the previous row's document as zlib's preset dictionary (``zdict``): only what
changed costs bytes. Every ``KEYFRAME_EVERY`` rows of a model (and after every restart of the
writer) a row is compressed on its own (a keyframe), so decoding a row reads at most that many
rows of its model. Rows point at their dictionary (``payload_prev``) and keyframe (``payload_base``)
by id, never by position: rows of other writers, journal replays or deletions in between do not
break a chain, and the retention job keeps every row a kept row depends on.

Recommendations are stored without their ``state`` where it is the decision's ``rule_state[rule]``
(the pipeline's rule: stored once, restored on decoding). Rows written before this format keep
their JSON columns and decode as they always did.
"""

from __future__ import annotations

import json
import zlib

from controller.db.codec import dump_json
from typing import Any, Callable, Mapping

__all__ = ["KEYFRAME_EVERY", "encode", "decode", "split_state", "join_state"]

KEYFRAME_EVERY = 60
"""Rows of one model per keyframe (5 minutes of 5 s ticks): decoding a row reads at most this many
rows; a keyframe costs a few KB (the forecast rule's state), shared by the rows that follow."""


def _raw(doc: Mapping[str, Any]) -> bytes:
    # a copy of its own size: orjson's bytes keep the whole buffer it grew while encoding (32 KB
    # under a 5 KB document, tracemalloc), and each model's last document is kept (the next row's
    # dictionary)
    return bytes(memoryview(dump_json(doc, sort_keys=True)))


def encode(doc: Mapping[str, Any], previous: bytes | None) -> tuple[bytes, bytes]:
    """``(compressed, raw)``: ``doc`` compressed against ``previous`` (a raw document; ``None``: a
    keyframe). Keep ``raw`` as the next row's ``previous``."""
    raw = _raw(doc)
    c = zlib.compressobj(6, zlib.DEFLATED, 15, 9, zlib.Z_DEFAULT_STRATEGY, previous) if previous \
        else zlib.compressobj(6)
    return c.compress(raw) + c.flush(), raw


def decode_raw(compressed: bytes, previous: bytes | None) -> bytes:
    d = zlib.decompressobj(15, previous) if previous else zlib.decompressobj()
    return d.decompress(compressed) + d.flush()


def decode(row_id: int, rows: Mapping[int, tuple[bytes, int | None]], cache: dict[int, bytes],
           fetch: Callable[[int], tuple[bytes, int | None]] | None = None) -> dict[str, Any]:
    """Row ``row_id``'s document. ``rows``: id -> ``(payload, payload_prev)`` of the row and the
    rows its chain goes through; ``cache``: raw documents already decoded (filled as it goes)."""
    chain = []
    i: int | None = row_id
    while i is not None and i not in cache:
        entry = rows.get(i) or (fetch(i) if fetch is not None else None)
        if entry is None:
            raise LookupError(f"decision {row_id}: row {i} of its payload chain is missing")
        chain.append((i, entry))
        i = entry[1]
    for j, (payload, prev) in reversed(chain):
        cache[j] = decode_raw(payload, None if prev is None else cache[prev])
    return json.loads(cache[row_id])  # not orjson: it reads an integer beyond 64 bits as a float


def split_state(recommendations: list[dict[str, Any]], rule_state: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Recommendations without a ``state`` equal to their rule's in ``rule_state`` (the pipeline
    makes them equal: the state is then stored once)."""
    return [{k: v for k, v in r.items() if k != "state" or v != rule_state.get(r["rule"], {})}
            for r in recommendations]


def join_state(recommendations: list[dict[str, Any]], rule_state: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Recommendations with their state back (their rule's in ``rule_state`` where not stored)."""
    return [r if "state" in r else {**r, "state": rule_state.get(r["rule"], {})} for r in recommendations]
