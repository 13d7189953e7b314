"""What scripts rely on: the exit statuses the README documents are the ones the CLI uses, and the
durations and instants the commands accept."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from controller.client import EXIT_CODES
from controller.timespec import parse_duration_s, parse_when

README = Path(__file__).resolve().parents[2] / "README.md"
NOW = datetime(2026, 11, 2, 12, 0, tzinfo=timezone.utc)


def test_the_readme_documents_every_exit_status() -> None:
    text = README.read_text()
    for code, meaning in EXIT_CODES.items():
        assert f"| {code} | {meaning} |" in text


@pytest.mark.parametrize("text,seconds", [("90", 90), ("90s", 90), ("30m", 1800), ("2h", 7200), ("7d", 604800),
                                          ("1w", 604800), ("1.5h", 5400)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration_s(text) == seconds
    assert parse_when(text, NOW) == datetime.fromtimestamp(NOW.timestamp() - seconds, tz=timezone.utc)


@pytest.mark.parametrize("text,needle", [("0s", "duration"), ("7 days", "is not a time"),
                                         ("2026-11-02T09:00:00", "no timezone")])
def test_bad_instants_say_what_to_type(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        parse_when(text, NOW)


def test_instants() -> None:
    assert parse_when("now", NOW) == NOW
    assert parse_when("2026-11-02T09:00:00Z", NOW) == datetime(2026, 11, 2, 9, tzinfo=timezone.utc)


@pytest.mark.parametrize("text", ["99999999999d", "0001-01-01T00:00:00+05:00"])
def test_instants_out_of_range_are_errors_not_crashes(text: str) -> None:
    with pytest.raises(ValueError, match="year 1|out of range"):
        parse_when(text, NOW)
