"""The pure part of sharding (controller.shards): which bucket a model is in, which buckets each
live replica should hold, who counts as live."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.shards import (
    assignment, bucket_lease_name, bucket_of, live_members, members_lease_name, models_in, target_buckets,
)

members_st = st.sets(st.text("abcdefghij-0123456789", min_size=1, max_size=12), min_size=1, max_size=12)


@given(members=members_st, buckets=st.integers(1, 64))
def test_every_bucket_has_one_owner_and_shares_differ_by_at_most_one(members: set[str], buckets: int) -> None:
    owners = assignment(members, buckets)
    assert set(owners) == set(range(buckets)) and set(owners.values()) <= members
    shares = Counter(owners.values())
    counts = [shares.get(m, 0) for m in members]
    assert max(counts) - min(counts) <= 1
    # each member's own view of its share agrees with the whole assignment
    for m in members:
        assert target_buckets(m, members, buckets) == {b for b, o in owners.items() if o == m}


@given(members=members_st, buckets=st.integers(1, 64))
def test_the_assignment_does_not_depend_on_order(members: set[str], buckets: int) -> None:
    assert assignment(sorted(members), buckets) == assignment(sorted(members, reverse=True), buckets)


@settings(max_examples=50, derandomize=True)
@given(members=st.sets(st.text("abcdef", min_size=1, max_size=6), min_size=2, max_size=8), buckets=st.integers(8, 64))
def test_a_replica_leaving_moves_few_buckets_besides_its_own(members: set[str], buckets: int) -> None:
    """Balanced rendezvous: the survivors keep most of what they held; round-robin by index would
    move nearly every bucket."""
    before = assignment(members, buckets)
    gone = sorted(members)[0]
    after = assignment(members - {gone}, buckets)
    moved_between_survivors = sum(1 for b, o in before.items() if o != gone and after[b] != o)
    assert moved_between_survivors <= buckets // 2, (before, after)


def test_a_replica_alone_targets_every_bucket_and_counts_itself_live() -> None:
    assert target_buckets("a", [], 5) == {0, 1, 2, 3, 4}
    assert target_buckets("a", ["b"], 4) | target_buckets("b", ["a"], 4) == {0, 1, 2, 3}


def test_bucket_of_is_stable_and_spreads_models() -> None:
    assert bucket_of("llama3-70b-fp8", 16) == bucket_of("llama3-70b-fp8", 16)  # no per-process hash seed
    counts = Counter(bucket_of(f"m{i}", 10) for i in range(10_000))
    assert set(counts) == set(range(10)) and min(counts.values()) > 900
    assert models_in({0, 1}, [f"m{i}" for i in range(100)], 10) == [
        f"m{i}" for i in range(100) if bucket_of(f"m{i}", 10) in (0, 1)]
    with pytest.raises(ValueError, match="buckets must be >= 1"):
        bucket_of("m", 0)


def test_lease_names_are_padded_to_the_bucket_count() -> None:
    assert bucket_lease_name("tg", 3, 12) == "tg-bucket-03-of-12"
    assert bucket_lease_name("tg", 3, 5) == "tg-bucket-3-of-5"
    assert bucket_lease_name("tg", 99, 100) == "tg-bucket-99-of-100"
    assert members_lease_name("tg") == "tg-members"


def test_members_are_live_while_their_heartbeat_is_younger_than_the_lease() -> None:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    beats = {"a": now, "b": now - timedelta(seconds=14.9), "c": now - timedelta(seconds=15),
             "d": now + timedelta(seconds=60)}  # a clock far ahead: not trusted
    assert live_members(beats, now, 15) == ["a", "b"]
