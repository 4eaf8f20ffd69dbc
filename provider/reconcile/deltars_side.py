"""A Delta sink side read in the task with delta-rs (``deltalake``): no Spark application to start.

An incremental reconciliation (``scope="changed"``) compares a few thousand keys; starting a Spark application
for them cost an increment of the history -> stream template most of its wall time. This side reads only the
rows in the scope's key ranges at one pinned table version through delta-rs' own engine (``DeltaTable.scan``,
which prunes files by their statistics and honours deletion vectors and column mapping), hashes each row in
Python to the same canonical text the SQL dialects render (:func:`canonical.python_text`), and answers the
engine's questions from the ``(key, hash)`` pairs in memory. It is also an independent reader of the table the
provider's own commits write: a reconciliation through it checks the table as a foreign reader sees it.
"""

from __future__ import annotations

import bisect
from typing import Any

import pyarrow as pa

from exactly_once_provider.full_load.columns import Column
from exactly_once_provider.reconcile.canonical import SPARK, python_row_hash
from exactly_once_provider.reconcile.engine import Ranges, split_ranges
from exactly_once_provider.reconcile.keys import Key

MAX_PUSHED_SPANS = 64


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def ranges_predicate(key: str, ranges: Ranges) -> str:
    """Return a DataFusion SQL predicate that prunes files and row groups to ``ranges`` (FALSE for none).

    The singles go into one IN list; the wider ranges are ORed when few, else only their outer bounds are pushed
    down (a long OR chain would strain the SQL planner): the rows are filtered exactly after the read anyway.
    """
    if not ranges:
        return "FALSE"
    singles, spans = split_ranges(ranges)
    k = _quote(key)
    if len(spans) > MAX_PUSHED_SPANS:
        return f"({k} >= {int(ranges[0][0])} AND {k} < {int(ranges[-1][1])})"
    terms = [f"{k} IN ({', '.join(str(int(x)) for x in singles)})"] if singles else []
    terms += [f"({k} >= {int(lo)} AND {k} < {int(hi)})" for lo, hi in spans]
    return "(" + " OR ".join(terms) + ")"


class PairsSide:
    """A side answered from ``(key, row hash)`` pairs held in memory, sorted by key."""

    label = "sink"

    def __init__(self, pairs: list[tuple[int, int]]) -> None:
        self.labels: dict[int, str] = {}  # a hashed key's text
        self.load(pairs)

    def load(self, pairs: list[tuple[int, int]]) -> None:
        self.pairs = sorted(pairs)
        self.keys = [k for k, _ in self.pairs]

    def close(self) -> None:
        self.pairs, self.keys = [], []

    def key_bounds(self) -> tuple[int | None, int | None]:
        return (self.keys[0], self.keys[-1]) if self.keys else (None, None)

    def _in(self, ranges: Ranges | None):
        if ranges is None:
            yield from self.pairs
            return
        for lo, hi in ranges:
            yield from self.pairs[bisect.bisect_left(self.keys, lo) : bisect.bisect_left(self.keys, hi)]

    def segments(self, base: int, width: int, ranges: Ranges | None) -> dict[int, tuple[int, int]]:
        found: dict[int, list[int]] = {}
        for key, digest in self._in(ranges):
            seg = found.setdefault((key - base) // width, [0, 0])
            seg[0] += 1
            seg[1] += digest
        return {s: (n, total) for s, (n, total) in found.items()}

    def rows(self, ranges: Ranges) -> list[tuple[int, int]]:
        return list(self._in(ranges))


def delta_rs_side(
    path: str,
    version: int,
    key: Key,
    columns: list[Column],
    sink_key: str | None = None,
    deleted_column: str | None = None,
    scope: Ranges | None = None,
    storage_options: dict[str, str] | None = None,
) -> PairsSide:
    """Return the Delta table's side at ``version``, read with delta-rs.

    :param path: the Delta table.
    :param version: the table version to read (pinned before the source snapshot opens).
    :param key: the key (a hashed key is filtered to ``scope`` here, after hashing: the scan reads every row).
    :param columns: the compared columns (the key is hashed first, as on every side).
    :param sink_key: a single integer key's column on the sink; default the source key's name.
    :param deleted_column: tombstone column: rows where it is true are absent.
    :param scope: read only the keys in these ranges; None reads the whole table (held in memory: 2 ints a row).
    :param storage_options: delta-rs storage options (object storage).
    """
    from deltalake import DeltaTable

    ordered, names = sink_names(key, columns, sink_key)
    table = DeltaTable(path, version=version, storage_options=storage_options)
    missing = sorted(set(names) - {f.name for f in table.schema().fields})
    if missing:
        raise ValueError(
            f"The Delta table {path} (version {version}) has no column(s) {missing}: reconcile the "
            "columns it has (pass columns=[...]) or reload it."
        )
    conditions = [f"NOT {_quote(deleted_column)}"] if deleted_column else []
    if scope is not None and not key.hashed:
        conditions.append(ranges_predicate(names[0], scope))
    # delta-rs hands back an Arrow C stream (arro3); pyarrow reads it without a copy
    reader = pa.RecordBatchReader.from_stream(table.scan(columns=names, predicate=" AND ".join(conditions) or None))
    return hashed_side(reader, key, ordered, scope)


def sink_names(key: Key, columns: list[Column], sink_key: str | None) -> tuple[list[Column], list[str]]:
    """Return the compared columns, key first, and their names in the sink (a single integer key may be renamed)."""
    ordered = list(key.columns) + [c for c in columns if c.name not in key.names]
    names = [c.name for c in ordered]
    if sink_key and not key.hashed:
        names[0] = sink_key
    elif sink_key and sink_key != names[0]:
        key.expression(SPARK, sink_key)  # raises: a renamed key works for a single integer key only
    return ordered, names


def hashed_side(batches: Any, key: Key, ordered: list[Column], scope: Ranges | None) -> PairsSide:
    """Return the side of ``batches`` (Arrow record batches of the ``ordered`` columns): each row's key and hash.

    :param batches: the rows read, already without tombstones; a key outside ``scope`` is dropped here (a
        pushed-down predicate may be wider).
    :param key: the key.
    :param ordered: the compared columns, key first (:func:`sink_names`).
    :param scope: the key ranges compared; None: every key.
    """
    width = len(key.columns)
    side = PairsSide([])
    pairs: list[tuple[int, int]] = []
    for batch in batches:
        values = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
        for row in zip(*values):
            k = key.of_values(row[:width])
            if scope is not None and not _in_ranges(k, scope):
                continue
            pairs.append((k, python_row_hash(row, ordered)))
            if key.hashed:
                side.labels[k] = key.label(row[:width])
    side.load(pairs)
    return side


def _in_ranges(k: int, ranges: Ranges) -> bool:
    i = bisect.bisect_right(ranges, (k, float("inf"))) - 1
    return i >= 0 and ranges[i][0] <= k < ranges[i][1]
