"""Source vs sink by key range: counts and checksums per segment, bisecting mismatches down to keys.

The algorithm (data-diff style, docs/pitfalls.md#reconciliation), on a single integer key ``k``:

1. The source's ``MIN(k)``/``MAX(k)`` (two index lookups) fix a grid of segments ``floor((k - base) / w)``
   whose width ``w`` is a power of ``fanout`` such that at most ``max_segments`` segments cover the range.
2. ONE grouped query per side over the whole table returns ``(segment, count, sum of row hashes)``; a sink
   key outside the source's range simply lands in a segment of its own. When nothing differs, that is the
   whole cost: one full scan per side.
3. Segments whose count or hash sum differ are split ``fanout`` ways, every mismatching segment of a level
   in ONE query per side (``w`` shrinks by ``fanout`` each level, so the sub-grids line up).
4. Segments of width ``<= leaf_width`` are fetched key by key on both sides and each key is classified:
   ``missing`` (source only), ``extra`` (sink only), ``duplicate`` (the sink holds it more than once),
   ``changed`` (both, different hash), or ``in_flight`` when the key is in ``in_flight_keys`` (changed at the
   source after the sink's position: see :mod:`exactly_once_provider.reconcile.position`); ``in_flight``
   keys are reported, never counted as mismatches.

Both sides answer each step at the same time (two threads: each side is its own database or engine, and the
drivers release the GIL while they wait), so a step costs the slower side, not the sum of both.

Every query is recorded in :attr:`Report.queries` with its scope, so the cost is measured, not guessed.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

T = TypeVar("T")

Ranges = list[tuple[int, int]]  # half-open key ranges [lo, hi)
MISMATCH_KINDS = ("missing", "extra", "duplicate", "changed")
# Differences that are no mismatch: changed after the sink's position, or a key the pipeline dead-lettered.
EXPLAINED_KINDS = ("in_flight", "dead_lettered")


class Side(Protocol):
    """One side of the comparison (the source or the sink); see :mod:`.sides`."""

    label: str

    def key_bounds(self) -> tuple[int | None, int | None]:
        """Return ``(MIN(k), MAX(k))``, both None for an empty side."""

    def segments(self, base: int, width: int, ranges: Ranges | None) -> dict[int, tuple[int, int]]:
        """Return ``{segment: (rows, sum of row hashes)}`` of the keys in ``ranges`` (None = all)."""

    def rows(self, ranges: Ranges) -> list[tuple[int, int]]:
        """Return ``(key, row hash)`` of every row in ``ranges``."""


@dataclass(frozen=True)
class Query:
    """One query a reconciliation issued: which side, what it did and over how much of the key range."""

    side: str
    kind: str  # "bounds", "segments" or "rows"
    full_scan: bool
    ranges: int
    rows: int
    seconds: float


@dataclass(frozen=True)
class Difference:
    """One differing key."""

    key: int
    kind: str  # missing | extra | duplicate | changed | in_flight | dead_lettered (:mod:`.letters`)
    source_rows: int
    sink_rows: int
    label: str | None = None  # a hashed key's text (:mod:`.keys`): ``key`` is then its hash


@dataclass
class Report:
    """What a reconciliation found and what it cost."""

    source_rows: int = 0
    sink_rows: int = 0
    source_checksum: int = 0
    sink_checksum: int = 0
    differences: list[Difference] = field(default_factory=list)
    queries: list[Query] = field(default_factory=list)
    levels: int = 0
    seconds: float = 0.0

    def count(self, kind: str) -> int:
        return sum(1 for d in self.differences if d.kind == kind)

    @property
    def mismatches(self) -> int:
        """Differing keys that are real (``in_flight`` keys excluded)."""
        return sum(1 for d in self.differences if d.kind in MISMATCH_KINDS)

    @property
    def clean(self) -> bool:
        return self.mismatches == 0

    @property
    def full_scans(self) -> int:
        """Queries that read the whole table of a side (the ``<= 3 full count scans`` budget)."""
        return sum(1 for q in self.queries if q.full_scan)

    def summary(self) -> dict:
        return {
            "source_rows": self.source_rows,
            "sink_rows": self.sink_rows,
            "source_checksum": f"{self.source_checksum:x}",
            "sink_checksum": f"{self.sink_checksum:x}",
            **{kind: self.count(kind) for kind in (*MISMATCH_KINDS, *EXPLAINED_KINDS)},
            "clean": self.clean,
            "queries": len(self.queries),
            "full_scans": self.full_scans,
            "levels": self.levels,
            "seconds": round(self.seconds, 3),
        }


class _Recorder:
    """Wrap a side so that every call lands in the report's query list."""

    def __init__(self, side: Side, report: Report) -> None:
        self.side, self.report = side, report

    def _note(self, kind: str, full: bool, ranges: int, rows: int, started: float) -> None:
        self.report.queries.append(Query(self.side.label, kind, full, ranges, rows, time.monotonic() - started))

    def key_bounds(self) -> tuple[int | None, int | None]:
        started = time.monotonic()
        bounds = self.side.key_bounds()
        self._note("bounds", False, 0, 0, started)
        return bounds

    def segments(self, base: int, width: int, ranges: Ranges | None) -> dict[int, tuple[int, int]]:
        started = time.monotonic()
        found = self.side.segments(base, width, ranges)
        self._note("segments", ranges is None, len(ranges or ()), sum(c for c, _ in found.values()), started)
        return found

    def rows(self, ranges: Ranges) -> list[tuple[int, int]]:
        started = time.monotonic()
        found = self.side.rows(ranges)
        self._note("rows", False, len(ranges), len(found), started)
        return found


def split_ranges(ranges: Ranges) -> tuple[list[int], Ranges]:
    """Return ``(single keys, wider ranges)`` of ``ranges``: a predicate tests the singles with one IN list (a hash
    set, one index probe each) and ORs only the wider ranges, so thousands of changed keys stay one flat term."""
    singles = [lo for lo, hi in ranges if hi - lo == 1]
    return singles, [(lo, hi) for lo, hi in ranges if hi - lo > 1]


def grid_width(lo: int, hi: int, fanout: int, max_segments: int) -> int:
    """Return the smallest power of ``fanout`` that covers ``[lo, hi]`` with at most ``max_segments`` segments."""
    width = 1
    while (hi - lo) // width + 1 > max_segments:
        width *= fanout
    return width


def _both(pool: ThreadPoolExecutor, left: Callable[[], T], right: Callable[[], T]) -> tuple[T, T]:
    """Run ``left`` in a worker thread and ``right`` here; return both results (``right``'s error first)."""
    pending = pool.submit(left)
    try:
        right_result = right()
    except BaseException:
        wait([pending])  # a side never runs on behind a failed step
        raise
    return pending.result(), right_result


def reconcile(
    source: Side,
    sink: Side,
    *,
    fanout: int = 16,
    max_segments: int = 256,
    leaf_width: int = 16,
    in_flight_keys: Iterable[int] = (),
    scope: Ranges | None = None,
) -> Report:
    """Compare ``source`` and ``sink`` and return the :class:`Report`.

    :param source: the source side.
    :param sink: the sink side.
    :param fanout: how many sub-segments a mismatching segment splits into (>= 2).
    :param max_segments: at most this many segments in the first, full-table pass.
    :param leaf_width: segments this narrow (in key values) are compared key by key.
    :param in_flight_keys: keys changed at the source after the sink's position (reported, not mismatches).
    :param scope: compare only the keys in these ranges (an incremental reconciliation); None: the whole table.
    """
    if fanout < 2 or max_segments < 1 or leaf_width < 1:
        raise ValueError("fanout must be >= 2, max_segments and leaf_width >= 1.")
    started = time.monotonic()
    report = Report()
    src, dst = _Recorder(source, report), _Recorder(sink, report)
    in_flight = set(in_flight_keys)
    lo, hi = src.key_bounds()
    base = lo if lo is not None else 0
    width = grid_width(base, hi if hi is not None else base, fanout, max_segments)
    if scope is not None and not scope:
        report.seconds = time.monotonic() - started
        return report  # nothing changed: nothing to compare
    level_ranges: Ranges | None = scope  # None: the whole table
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="reconcile-source") as pool:
        while True:
            report.levels += 1
            # both lambdas are called before the loop goes on: B023 (late binding) cannot bite
            source_segments = lambda: src.segments(base, width, level_ranges)  # noqa: B023
            sink_segments = lambda: dst.segments(base, width, level_ranges)  # noqa: B023
            left, right = _both(pool, source_segments, sink_segments)
            if report.levels == 1:
                report.source_rows, report.source_checksum = (sum(v[i] for v in left.values()) for i in (0, 1))
                report.sink_rows, report.sink_checksum = (sum(v[i] for v in right.values()) for i in (0, 1))
            differing = sorted(s for s in set(left) | set(right) if left.get(s) != right.get(s))
            ranges = _within([(base + s * width, base + (s + 1) * width) for s in differing], scope)
            if not ranges:
                break
            if width <= leaf_width:
                _compare_keys(*_both(pool, lambda: src.rows(ranges), lambda: dst.rows(ranges)), in_flight, report)  # noqa: B023
                break
            level_ranges, width = ranges, max(1, width // fanout)
    labels = {**getattr(sink, "labels", {}), **getattr(source, "labels", {})}
    if labels:
        report.differences = [replace(d, label=labels.get(d.key)) for d in report.differences]
    report.seconds = time.monotonic() - started
    return report


def _within(ranges: Ranges, scope: Ranges | None) -> Ranges:
    """Return ``ranges`` cut to ``scope`` (both sorted, half-open); None scope: ``ranges`` as they are."""
    if scope is None:
        return ranges
    cut = [(max(lo, a), min(hi, b)) for lo, hi in ranges for a, b in scope if a < hi and lo < b]
    return [(lo, hi) for lo, hi in cut if lo < hi]


def _compare_keys(
    source_rows: list[tuple[int, int]], sink_rows: list[tuple[int, int]], in_flight: set[int], report: Report
) -> None:
    left: dict[int, Counter] = defaultdict(Counter)
    right: dict[int, Counter] = defaultdict(Counter)
    for key, digest in source_rows:
        left[key][digest] += 1
    for key, digest in sink_rows:
        right[key][digest] += 1
    for key in sorted(set(left) | set(right)):
        a, b = left.get(key, Counter()), right.get(key, Counter())
        if a == b:
            continue
        n_a, n_b = sum(a.values()), sum(b.values())
        if key in in_flight:
            kind = "in_flight"
        elif n_b == 0:
            kind = "missing"
        elif n_a == 0:
            kind = "extra"
        elif n_b > n_a:
            kind = "duplicate"
        else:
            kind = "changed"
        report.differences.append(Difference(key, kind, n_a, n_b))


def summary_table(report: Report, title: str = "reconciliation") -> str:
    """Return a readable fixed-width table of the report (for the task log and the demo)."""
    s = report.summary()
    rows = [
        ("", "source", "sink"),
        ("rows", s["source_rows"], s["sink_rows"]),
        ("checksum", s["source_checksum"], s["sink_checksum"]),
    ]
    lines = [f"{title}: {'CLEAN' if report.clean else 'MISMATCH'}"]
    lines += [f"  {str(a):<10} {str(b):>20} {str(c):>20}" for a, b, c in rows]
    lines.append("  " + "  ".join(f"{k} {s[k]}" for k in (*MISMATCH_KINDS, *EXPLAINED_KINDS)))
    lines.append(f"  cost: {s['queries']} queries, {s['full_scans']} full scans, {s['levels']} levels, {s['seconds']}s")
    shown = list(report.differences)[:20]
    if shown:
        lines.append(f"  {'key':>14} {'kind':<10} {'source':>6} {'sink':>6}")
        lines += [f"  {d.label or d.key:>14} {d.kind:<10} {d.source_rows:>6} {d.sink_rows:>6}" for d in shown]
        if len(report.differences) > len(shown):
            lines.append(f"  ... {len(report.differences) - len(shown)} more")
    return "\n".join(lines)
