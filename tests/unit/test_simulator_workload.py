"""Workload readers and rescaling (controller.sim.workload): formats, determinism, conservation."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from controller.sim.scenario import SHARED_DATA
from controller.sim.load import LoadCurve, LoadShape
from controller.sim.workload import (
    CurveSeries,
    RateSeries,
    RequestTrace,
    TokenDistribution,
    causal_attainment_bound,
    peak_rate_per_s,
    rate_profile,
    read_azure_trace,
    read_rate_series,
)
from tests.unit.simulator_fixtures import TOKENS, step_trace, write_azure_csv


def test_azure_reader_parses_times_and_tokens(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:17:04.0319600,3180,8\n"
                 "2023-11-16 18:17:03.9799600,4808,10\n"
                 "2023-11-16 18:17:05.5000000,34,0\n")
    tr = read_azure_trace(f)
    # sorted by time, relative to the first request, 100 ns precision kept
    assert tr.arrival_s.tolist() == pytest.approx([0.0, 0.052, 1.52004], abs=1e-6)
    assert tr.prompt_tokens.tolist() == [4808, 3180, 34]
    assert tr.output_tokens.tolist() == [10, 8, 1]  # a zero-token answer still yields one token
    # counts written through a float column (pandas, spreadsheets) read as the same whole numbers
    g = tmp_path / "floats.csv"
    g.write_text(f.read_text().replace(",3180,8", ",3180.0,8.0"))
    assert read_azure_trace(g).prompt_tokens.tolist() == [4808, 3180, 34]


def test_azure_reader_reads_the_2024_traces_utc_offsets(tmp_path: Path) -> None:
    # the 2024 release writes an offset on every stamp, and drops the fraction where it is zero
    f = tmp_path / "week.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2024-05-12 00:00:00.001163+00:00,1452,3\n"
                 "2024-05-12 00:00:00+00:00,584,3\n"
                 "2024-05-12 00:00:01.5+00:00,862,38\n")
    tr = read_azure_trace(f)  # filterwarnings=error: numpy's deprecated tz parsing would fail here
    assert tr.arrival_s.tolist() == pytest.approx([0.0, 0.001163, 1.5], abs=1e-9)
    assert tr.prompt_tokens.tolist() == [584, 1452, 862]
    # an offset is applied: the same instants written in three offsets are one trace
    g = tmp_path / "zones.csv"
    g.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2024-05-12 02:00:01.5+02:00,862,38\n"
                 "2024-05-11T19:00:00-05:00,584,3\n"
                 "2024-05-12T00:00:00.001163Z,1452,3\n")
    assert read_azure_trace(g).arrival_s.tolist() == pytest.approx(tr.arrival_s.tolist(), abs=1e-9)
    h = tmp_path / "compact.csv"
    h.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-12 01:00:00+0100,1,1\n2024-05-12 00:00:02+0000,1,1\n")
    assert read_azure_trace(h).arrival_s.tolist() == [0.0, 2.0]
    # a trace start is an instant too: the idle lead before the first request is kept
    start = np.datetime64("2024-05-11T23:59:00", "ns")
    assert read_azure_trace(f, start=start).arrival_s[0] == pytest.approx(60.0)


def test_azure_reader_takes_a_spreadsheet_export_and_seconds(tmp_path: Path) -> None:
    # a byte-order mark and CRLF line ends (Excel's CSV UTF-8), the header in another case
    f = tmp_path / "excel.csv"
    f.write_bytes(b"\xef\xbb\xbftimestamp,contexttokens,generatedtokens\r\n"
                  b"2023-11-16 18:17:03.9799600,4808,10\r\n2023-11-16 18:17:04.0319600,3180,8\r\n")
    assert read_azure_trace(f).arrival_s.tolist() == pytest.approx([0.0, 0.052], abs=1e-9)
    # seconds since any origin (a trace converted from another format): times from the first
    g = tmp_path / "seconds.csv"
    g.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n12.5,100,10\n10.0,200,20\n11,300,30\n")
    tr = read_azure_trace(g)
    assert tr.arrival_s.tolist() == [0.0, 1.0, 2.5]
    assert tr.prompt_tokens.tolist() == [200, 300, 100]
    with pytest.raises(ValueError, match="seconds, not dates"):
        read_azure_trace(g, start=np.datetime64("2024-01-01T00:00:00", "ns"))


def test_azure_reader_reads_in_chunks_as_it_reads_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A week of the 2024 traces holds 17-27 million rows: they are read in chunks (arrays, not a
    list of every row), with the same trace as one chunk and a refused row still named by its
    line (blank lines counted)."""
    import controller.sim.workload as workload

    rng = np.random.default_rng(3)
    t = np.sort(rng.random(50) * 100.0)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"{np.datetime64('2024-05-10T00:00:00', 'us') + np.timedelta64(int(x * 1e6), 'us')}+02:00,{i + 1},{i % 7}"
              for i, x in enumerate(t[::-1])]
    f = tmp_path / "t.csv"
    f.write_text("\n".join(lines[:20] + [""] + lines[20:]) + "\n")
    whole = read_azure_trace(f)
    monkeypatch.setattr(workload, "CHUNK_ROWS", 7)
    chunked = read_azure_trace(f)
    assert np.array_equal(whole.arrival_s, chunked.arrival_s) and np.allclose(whole.arrival_s, t - t[0], atol=1e-6)
    assert np.array_equal(whole.prompt_tokens, chunked.prompt_tokens)
    bad = lines[:20] + [""] + lines[20:40] + ["2024-05-10 00:00:99+02:00,1,1"] + lines[40:]
    f.write_text("\n".join(bad) + "\n")
    with pytest.raises(ValueError, match=":42: cannot parse the TIMESTAMP"):
        read_azure_trace(f)


@pytest.mark.parametrize("text, needle", [
    ("a,b,c\n1,2,3\n", "expected header"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:04,x,3\n", ":2: cannot parse"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests"),
    # the line of a stamp numpy refuses, not only the value
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:04,1,3\nyesterday,1,3\n", ":3: cannot parse the TIMESTAMP"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:04,-5,3\n", ":2: negative token count"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:04,1619.5,3\n", ":2: cannot parse.*not a whole number"),
    # a column of seconds with a date in it, and one with a value that is no time at all
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n1.5,1,3\n2023-11-16 18:17:04,1,3\n", ":3: TIMESTAMP .* not a number of seconds"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n1.5,1,3\ninf,1,3\n", ":3: TIMESTAMP 'inf' is not a number of seconds"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-12 00:00:00+00:00,1,3\n2024-05-12 00:00:61+00:00,1,3\n",
     ":3: cannot parse the TIMESTAMP '2024-05-12 00:00:61'"),
])
def test_azure_reader_rejects_bad_files(tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "bad.csv"
    f.write_text(text)
    with pytest.raises(ValueError, match=needle):
        read_azure_trace(f)


def test_azure_roundtrip_through_csv(tmp_path: Path) -> None:
    tr = step_trace(30.0, 60.0, 1.0, 5.0, seed=4)
    back = read_azure_trace(write_azure_csv(tmp_path / "x.csv", tr))
    assert len(back) == len(tr)
    assert np.allclose(back.arrival_s, tr.arrival_s - tr.arrival_s[0], atol=1e-6)
    assert (back.prompt_tokens == tr.prompt_tokens).all()


def test_rate_series_reader_orders_bins_and_converts_to_per_second(tmp_path: Path) -> None:
    f = tmp_path / "r.csv"
    f.write_text("Time (min),Requests\n1,120\n0,60\n2,0\n")
    rs = read_rate_series(f, TOKENS)
    assert rs.bin_s == 60.0
    assert rs.rate_per_s.tolist() == [1.0, 2.0, 0.0]
    assert rs.expected_requests == pytest.approx(180.0)
    assert rs.rate_at(61.0) == 2.0 and rs.rate_at(-1) == 0.0 and rs.rate_at(999) == 0.0


def test_rate_series_to_requests_is_seeded_and_keeps_the_rate() -> None:
    rs = RateSeries("r", 60.0, np.array([5.0, 0.0, 20.0]), TOKENS)
    a = rs.to_requests(np.random.default_rng(7))
    b = rs.to_requests(np.random.default_rng(7))
    c = rs.to_requests(np.random.default_rng(8))
    assert np.array_equal(a.arrival_s, b.arrival_s) and np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert not np.array_equal(a.arrival_s, c.arrival_s)
    per_bin = np.bincount((a.arrival_s // 60).astype(int), minlength=3)
    assert per_bin[1] == 0
    assert 300 - 4 * 300**0.5 < per_bin[0] < 300 + 4 * 300**0.5
    assert 1200 - 4 * 1200**0.5 < per_bin[2] < 1200 + 4 * 1200**0.5
    # tokens come in the distribution's own (prompt, output) pairs
    pairs = set(zip(TOKENS.prompt_tokens.tolist(), TOKENS.output_tokens.tolist()))
    assert set(zip(a.prompt_tokens.tolist(), a.output_tokens.tolist())) <= pairs


def test_time_scale_compresses_and_keeps_request_count() -> None:
    tr = step_trace(100.0, 200.0, 1.0, 3.0)
    half = tr.time_scale(0.5)
    assert len(half) == len(tr)
    assert half.duration_s == pytest.approx(tr.duration_s / 2)
    rs = RateSeries("r", 60.0, np.array([1.0, 2.0]), TOKENS)
    fast = rs.time_scale(0.5)
    assert fast.bin_s == 30.0 and fast.expected_requests == pytest.approx(rs.expected_requests)
    with pytest.raises(ValueError):
        tr.time_scale(0)


@pytest.mark.parametrize("factor", [0.25, 1.0, 2.0, 3.5])
def test_load_scale_multiplies_requests(factor: float) -> None:
    tr = step_trace(300.0, 600.0, 2.0, 6.0, seed=2)
    scaled = tr.load_scale(factor, np.random.default_rng(0))
    assert len(scaled) == pytest.approx(factor * len(tr), rel=0.08)
    assert np.all(np.diff(scaled.arrival_s) >= 0)
    again = tr.load_scale(factor, np.random.default_rng(0))
    assert np.array_equal(scaled.arrival_s, again.arrival_s)
    # the shape is kept: the second half still carries about 3x the first
    first = np.count_nonzero(scaled.arrival_s < 300)
    second = len(scaled) - first
    assert 2.2 < second / max(first, 1) < 4.0


def test_load_scale_spreads_copies_over_the_gaps_of_a_sparse_trace() -> None:
    # a request every 10 s, scaled x50: each gap carries about 50 requests, spread over it, not a
    # burst of 50 in its first second (which no fleet serves within a TTFT target)
    n = 360
    tr = RequestTrace("sparse", np.arange(n) * 10.0, np.full(n, 500), np.full(n, 100))
    scaled = tr.load_scale(50.0, np.random.default_rng(3))
    assert len(scaled) == 50 * n
    per_second = np.bincount(scaled.arrival_s.astype(np.int64))
    assert per_second.max() <= 20  # 5 a second on average; Poisson-like, never the 50-request clump
    per_gap = np.bincount((scaled.arrival_s // 10.0).astype(np.int64))
    assert np.all(per_gap[:-1] == 50)  # each gap keeps its share: the rate at the trace's resolution
    # a dense trace (gaps under a second) keeps the sub-second jitter of before
    dense = RequestTrace("dense", np.arange(n) * 0.1, np.full(n, 500), np.full(n, 100))
    out = dense.load_scale(3.0, np.random.default_rng(3))
    assert out.arrival_s.max() <= dense.arrival_s.max() + 1.0


def test_peak_rate_and_profile() -> None:
    rs = RateSeries("r", 60.0, np.array([1.0, 4.0, 2.0, 2.0]), TOKENS)
    assert peak_rate_per_s(rs, 60) == 4.0
    assert peak_rate_per_s(rs, 120) == 2.5
    assert rate_profile(rs, 120.0, 240.0).tolist() == pytest.approx([2.5, 2.0])
    assert rate_profile(rs, 30.0, 120.0).tolist() == pytest.approx([1.0, 1.0, 4.0, 4.0])
    tr = RequestTrace("t", np.array([0.5, 1.0, 1.5, 61.0]), np.ones(4, int), np.ones(4, int))
    assert peak_rate_per_s(tr, 60) == pytest.approx(3 / 60)


def test_quantile_grid_preserves_means() -> None:
    rng = np.random.default_rng(1)
    d = TokenDistribution(rng.integers(10, 5000, 1000), rng.integers(1, 500, 1000))
    pp, oo = d.quantile_grid(64)
    assert pp.mean() == pytest.approx(d.mean_prompt, rel=0.01)
    assert oo.mean() == pytest.approx(d.mean_output, rel=0.01)
    assert np.all(np.diff(pp) >= 0)


@pytest.mark.skipif(not SHARED_DATA.exists(), reason=f"shared data folder {SHARED_DATA} is absent (fresh clone)")
def test_shared_azure_and_maf_traces_read() -> None:
    tr = read_azure_trace(SHARED_DATA / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv")
    assert len(tr) == 8819
    assert tr.prompt_tokens.mean() == pytest.approx(2047.8, abs=1.0)
    assert tr.duration_s == pytest.approx(3435.9, abs=1.0)
    rs = read_rate_series(SHARED_DATA / "maf_rate_series" / "requests_per_minute_first_400h.csv", tr.tokens())
    assert len(rs.rate_per_s) == 24000 and rs.duration_s == 400 * 3600


def test_causal_bound_counts_what_exceeds_every_earlier_bin() -> None:
    # requests per minute: the warm fleet holds the first 2 minutes' peak (10); 30 in minute 3 is
    # busier than anything seen (10 of it served), the repeat in minute 5 is covered once the
    # capacity ordered at minute 3 is ready.
    per_min = np.array([5.0, 10.0, 30.0, 0.0, 30.0, 8.0])
    w = RateSeries("steps", 60.0, per_min / 60.0, TOKENS)
    total = per_min.sum()
    assert causal_attainment_bound(w, w.duration_s, 60.0, warm_s=120.0) == pytest.approx((total - 20) / total)
    # with capacity ready 3 minutes after it is ordered, the repeat at minute 5 is late too
    late = causal_attainment_bound(w, w.duration_s, 60.0, warm_s=120.0, ready_after_s=180.0)
    assert late == pytest.approx((total - 40) / total)
    # a load no busier than its start is fully servable; no load at all is trivially met
    flat = RateSeries("flat", 60.0, np.full(30, 2.0), TOKENS)
    assert causal_attainment_bound(flat, flat.duration_s, 60.0, ready_after_s=600.0) == 1.0
    assert causal_attainment_bound(RateSeries("zero", 60.0, np.zeros(5), TOKENS), 300.0) == 1.0


def test_a_curve_series_reads_the_same_rates_as_the_series_built_up_front() -> None:
    curve = LoadCurve(LoadShape(3.0, 26.0, 600.0, burst_every_s=300.0, burst_factor=2.0, burst_duration_s=60.0), 7, "m")
    bins, bin_s = 240, 5.0
    built = RateSeries("load", bin_s, np.array([curve.arrivals(i * bin_s, (i + 1) * bin_s) / bin_s
                                                for i in range(bins)]), TOKENS, repeats=True)
    lazy = CurveSeries("load", bin_s, bins, curve.arrivals, TOKENS, repeats=True)
    times = [0.0, 4.9, 5.0, 299.0, 1199.9, 1200.0, 1234.5, 5 * 1200.0 + 17.0, -1.0]
    assert [lazy.rate_at(t) for t in times] == [built.rate_at(t) for t in times]  # repeating, 0 before the start
    assert lazy.duration_s == built.duration_s == 1200.0
    assert np.array_equal(lazy.head(61.0).rate_per_s, built.head(61.0).rate_per_s)
    assert np.array_equal(lazy.rate_per_s, built.rate_per_s)


def test_rate_series_reader_keeps_gaps_and_refuses_bad_rows_with_their_line(tmp_path: Path) -> None:
    f = tmp_path / "gaps.csv"
    f.write_text("Time (min),Requests\n10,60\n12,120\n15,60\n")  # idle minutes left out of an export
    rs = read_rate_series(f, TOKENS)
    assert rs.rate_per_s.tolist() == [1.0, 0.0, 2.0, 0.0, 0.0, 1.0]
    assert rs.expected_requests == pytest.approx(240.0)
    for body, line, what in (("0,10\n1,nan\n", 3, "not a number"), ("0,10\n1,-5\n", 3, "not a number >= 0"),
                             ("0,10\n0,20\n", 3, "given twice (first on line 2)"), ("0,10\n0.5,20\n", 3, "whole number")):
        bad = tmp_path / "bad.csv"
        bad.write_text("Time (min),Requests\n" + body)
        with pytest.raises(ValueError, match=rf"bad\.csv:{line}: .*{re.escape(what)}"):
            read_rate_series(bad, TOKENS)
