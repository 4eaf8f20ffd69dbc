"""The bisection engine on in-memory sides: it names each planted difference and costs one scan per side."""

from __future__ import annotations

import math

import pytest

from exactly_once_provider.reconcile.engine import grid_width, reconcile, summary_table
from exactly_once_provider.reconcile.scope import key_ranges


class MemorySide:
    """A side over a list of (key, hash) rows; answers like the SQL sides do."""

    def __init__(self, label, rows):
        self.label, self.data = label, list(rows)

    def _in(self, ranges):
        return [r for r in self.data if ranges is None or any(lo <= r[0] < hi for lo, hi in ranges)]

    def key_bounds(self):
        keys = [k for k, _ in self.data]
        return (min(keys), max(keys)) if keys else (None, None)

    def segments(self, base, width, ranges):
        out = {}
        for key, digest in self._in(ranges):
            seg = math.floor((key - base) / width)
            n, total = out.get(seg, (0, 0))
            out[seg] = (n + 1, total + digest)
        return out

    def rows(self, ranges):
        return self._in(ranges)


ROWS = [(k, k * 7919 % 100_003) for k in range(1, 50_001)]


def test_equal_sides_cost_one_full_scan_each():
    report = reconcile(MemorySide("source", ROWS), MemorySide("sink", ROWS))
    assert report.clean and report.differences == []
    assert report.full_scans == 2
    assert [q.kind for q in report.queries] == ["bounds", "segments", "segments"]
    assert report.source_rows == report.sink_rows == 50_000
    assert report.source_checksum == report.sink_checksum == sum(h for _, h in ROWS)


@pytest.mark.parametrize("kind", ["changed", "missing", "extra", "duplicate"])
def test_a_single_planted_difference_is_named_by_its_key(kind):
    sink = list(ROWS)
    if kind == "changed":
        sink[31_336] = (31_337, 1)
    elif kind == "missing":
        del sink[31_336]
    elif kind == "extra":
        sink.append((70_001, 5))
    else:
        sink.append(ROWS[31_336])
    report = reconcile(MemorySide("source", ROWS), MemorySide("sink", sink))
    key = 70_001 if kind == "extra" else 31_337
    assert [(d.key, d.kind) for d in report.differences] == [(key, kind)]
    assert report.full_scans == 2  # bisection levels touch only the mismatching ranges
    assert not report.clean
    assert f"{key}" in summary_table(report)


def test_in_flight_keys_are_reported_but_not_mismatches():
    sink = [(k, h + 1 if k in (10, 20_000) else h) for k, h in ROWS]
    report = reconcile(MemorySide("source", ROWS), MemorySide("sink", sink), in_flight_keys={10})
    assert [(d.key, d.kind) for d in report.differences] == [(10, "in_flight"), (20_000, "changed")]
    assert report.mismatches == 1


def test_empty_source_and_sink_rows_beyond_it():
    report = reconcile(MemorySide("source", []), MemorySide("sink", [(3, 1), (-40, 2)]))
    assert sorted((d.key, d.kind) for d in report.differences) == [(-40, "extra"), (3, "extra")]


def test_a_scope_compares_only_its_keys_and_every_query_stays_inside_it():
    sink = [(k, h + 1 if k in (1_234, 40_000) else h) for k, h in ROWS]  # one difference in scope, one outside
    scope = [(1_000, 1_300), (7_000, 7_001)]
    report = reconcile(MemorySide("source", ROWS), MemorySide("sink", sink), scope=scope)
    assert [(d.key, d.kind) for d in report.differences] == [(1_234, "changed")]
    assert report.full_scans == 0 and report.source_rows == report.sink_rows == 301
    assert all(q.rows <= 301 for q in report.queries)


def test_an_empty_scope_compares_nothing():
    report = reconcile(MemorySide("source", ROWS), MemorySide("sink", []), scope=[])
    assert report.clean and report.queries[1:] == [] and report.source_rows == 0


def test_key_ranges_join_runs_and_close_the_smallest_gaps():
    assert key_ranges([]) == []
    assert key_ranges({5, 3, 4, 10, 12}) == [(3, 6), (10, 11), (12, 13)]
    assert key_ranges({1, 3, 100, 102, 1000}, max_ranges=3) == [(1, 4), (100, 103), (1000, 1001)]
    even = range(0, 10_000, 2)
    ranges = key_ranges(even, max_ranges=10)
    assert len(ranges) == 10 and all(any(lo <= k < hi for lo, hi in ranges) for k in even)
    assert sum(hi - lo for lo, hi in ranges) < 10_000


def test_grid_width_is_a_power_of_the_fanout():
    assert grid_width(1, 1_000_000, 16, 256) == 4096
    assert grid_width(5, 5, 16, 256) == 1


class MeetingSide(MemorySide):
    """A side whose every scan waits for the other side's scan to start: sequential sides would never meet."""

    def __init__(self, label, rows, barrier):
        super().__init__(label, rows)
        self.barrier = barrier

    def segments(self, base, width, ranges):
        self.barrier.wait()  # BrokenBarrierError after the timeout if the other side is not scanning too
        return super().segments(base, width, ranges)

    def rows(self, ranges):
        self.barrier.wait()
        return super().rows(ranges)


def test_both_sides_scan_at_the_same_time():
    import threading

    barrier = threading.Barrier(2, timeout=10)
    sink = list(ROWS)
    sink[31_336] = (31_337, 1)
    report = reconcile(MeetingSide("source", ROWS, barrier), MeetingSide("sink", sink, barrier))
    assert [(d.key, d.kind) for d in report.differences] == [(31_337, "changed")]
    assert report.levels >= 2  # every bisection level and the key fetch met too


def test_a_failing_side_fails_the_reconciliation_after_the_other_side_ends():
    class Failing(MemorySide):
        def segments(self, base, width, ranges):
            raise RuntimeError("sink unreachable")

    with pytest.raises(RuntimeError, match="sink unreachable"):
        reconcile(MemorySide("source", ROWS), Failing("sink", ROWS))
