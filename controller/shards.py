"""Sharding models over daemon replicas: models hash into a fixed number of buckets, replicas share
the buckets, a replica acts only on the models of the buckets it holds.

Why: one daemon's tick grows with the number of models it acts on; past a few thousand models the
work is split between replicas, the way Knative's autoscaler splits its keys: a fixed set of
buckets, each a ``coordination.k8s.io/v1`` Lease, and each key (here a model) belongs to exactly
one bucket by a hash of its name. Holding a bucket's Lease is what allows acting on its models, so
two replicas never act on one model (the Lease has one holder, and a holder stops acting once its
last renewal is older than the lease duration, before anyone else may take it over).

Knative lets every replica race for every bucket; here each replica also aims at a fair share so
buckets rebalance when replicas join: every replica writes a heartbeat into one members Lease, the
live members (heartbeat younger than the lease duration) split the buckets evenly by balanced
rendezvous hashing (:func:`assignment`), a replica releases a held bucket whose target is another live
member and takes the buckets it targets once they are free (released, or expired because their
holder died). The I/O is ``providers.leader.KubernetesBucketElector``; this module is the pure part.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Collection, Iterable, Mapping
from datetime import datetime, timedelta
from typing import TypeVar

T = TypeVar("T")


def bucket_of(model: str, buckets: int) -> int:
    """The bucket of ``model`` among ``buckets``: a stable hash (the same on every host and Python
    run, unlike ``hash()``) modulo the bucket count."""
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    return int.from_bytes(hashlib.sha256(model.encode()).digest()[:8], "big") % buckets


def models_in(held: Collection[int], models: Iterable[str], buckets: int) -> list[str]:
    """The models of the buckets in ``held``, in the order given."""
    return [m for m in models if bucket_of(m, buckets) in held]


def bucket_lease_name(name: str, index: int, buckets: int) -> str:
    """The Lease of bucket ``index``: ``NAME-bucket-03-of-16`` (the chart's Role names each)."""
    width = len(str(buckets - 1))
    return f"{name}-bucket-{index:0{width}d}-of-{buckets}"


def members_lease_name(name: str) -> str:
    """The Lease whose annotation holds every replica's heartbeat."""
    return f"{name}-members"


def _weight(bucket: int, member: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{bucket}/{member}".encode()).digest()[:8], "big")


def assignment(members: Iterable[str], buckets: int) -> dict[int, str]:
    """Which live member each bucket should be held by: balanced rendezvous hashing. Every member
    gets ``buckets // n`` or one more (the first ``buckets % n`` by identity get one more); pairs
    (bucket, member) are taken by descending hash weight while the member has room. A member's
    weights do not depend on the others, so when one joins or leaves most buckets stay where they
    are (round-robin by index would reshuffle nearly all of them, each move a tick of standstill
    for its models)."""
    return dict(_assignment(tuple(sorted(set(members))), buckets))


@functools.lru_cache(maxsize=64)
def _assignment(ordered: tuple[str, ...], buckets: int) -> tuple[tuple[int, str], ...]:
    """:func:`assignment`, cached (every round asks again; members change rarely)."""
    if not ordered:
        return ()
    base, extra = divmod(buckets, len(ordered))
    room = {m: base + (1 if i < extra else 0) for i, m in enumerate(ordered)}
    pairs = sorted(((_weight(b, m), b, m) for b in range(buckets) for m in ordered), reverse=True)
    out: dict[int, str] = {}
    for _, b, m in pairs:
        if b not in out and room[m] > 0:
            out[b] = m
            room[m] -= 1
    return tuple(sorted(out.items()))


def target_buckets(identity: str, members: Iterable[str], buckets: int) -> frozenset[int]:
    """The buckets ``identity`` should hold when ``members`` are the live replicas
    (:func:`assignment`); ``identity`` always counts itself live."""
    return frozenset(b for b, m in assignment(set(members) | {identity}, buckets).items() if m == identity)


def live_members(heartbeats: Mapping[str, datetime], now: datetime, lease_duration_s: float) -> list[str]:
    """Members whose last heartbeat is younger than the lease duration."""
    horizon = timedelta(seconds=lease_duration_s)
    return sorted(m for m, at in heartbeats.items() if at <= now + horizon and now - at < horizon)


__all__ = ["assignment", "bucket_lease_name", "bucket_of", "live_members", "members_lease_name", "models_in",
           "target_buckets"]
