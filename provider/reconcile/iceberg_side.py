"""An Iceberg sink side read in the task with pyiceberg: the current table at one pinned snapshot, no Spark.

pyiceberg plans the snapshot's data files (pruned by their column bounds to the scope's key ranges) and reads
them; each row is hashed in Python as the delta-rs side hashes a Delta table's (:func:`~.deltars_side.hashed_side`),
so the engine compares the same canonical text on both sides. The table is read as any Iceberg reader reads it
(the snapshot's manifests, tombstones left out), not through the sink's own commit code.
"""

from __future__ import annotations

from typing import Any

from exactly_once_provider.full_load.columns import Column
from exactly_once_provider.reconcile.deltars_side import MAX_PUSHED_SPANS, PairsSide, hashed_side, sink_names
from exactly_once_provider.reconcile.engine import Ranges, split_ranges
from exactly_once_provider.reconcile.keys import Key


def ranges_filter(key: str, ranges: Ranges) -> Any:
    """Return a pyiceberg row filter that prunes files to ``ranges`` (AlwaysFalse for none; see
    :func:`~.deltars_side.ranges_predicate`: many spans push only their outer bounds)."""
    from pyiceberg.expressions import AlwaysFalse, And, GreaterThanOrEqual, In, LessThan, Or

    if not ranges:
        return AlwaysFalse()
    singles, spans = split_ranges(ranges)
    if len(spans) > MAX_PUSHED_SPANS:
        return And(GreaterThanOrEqual(key, int(ranges[0][0])), LessThan(key, int(ranges[-1][1])))
    terms = [In(key, {int(x) for x in singles})] if singles else []
    terms += [And(GreaterThanOrEqual(key, int(lo)), LessThan(key, int(hi))) for lo, hi in spans]
    return terms[0] if len(terms) == 1 else Or(*terms)


def iceberg_side(
    table: Any,
    snapshot_id: int | None,
    key: Key,
    columns: list[Column],
    sink_key: str | None = None,
    deleted_column: str | None = None,
    scope: Ranges | None = None,
) -> PairsSide:
    """Return the Iceberg table's side at ``snapshot_id``, read with pyiceberg.

    :param table: the pyiceberg table (loaded through the sink's catalog, its S3 settings included).
    :param snapshot_id: the snapshot to read (pinned before the source snapshot opens); None: the table has none.
    :param key: the key (a hashed key is filtered to ``scope`` after hashing: the scan reads every row).
    :param columns: the compared columns (the key first, as on every side).
    :param sink_key: a single integer key's column on the sink; default the source key's name.
    :param deleted_column: tombstone column (the current table's ``_eo_deleted``): rows where it is true are absent.
    :param scope: read only the keys in these ranges; None reads the whole table (held in memory: 2 ints a row).
    """
    from pyiceberg.expressions import AlwaysTrue, And, EqualTo

    ordered, names = sink_names(key, columns, sink_key)
    held = {f.name for f in table.schema().fields}
    missing = sorted(set(names + ([deleted_column] if deleted_column else [])) - held)
    if missing:
        raise ValueError(
            f"The Iceberg table {'.'.join(table.name())} has no column(s) {missing}: reconcile the columns it has "
            "(pass columns=[...]) or reload it."
        )
    if snapshot_id is None:  # created, nothing committed yet: no rows
        return hashed_side([], key, ordered, scope)
    row_filter: Any = AlwaysTrue()
    if deleted_column:
        row_filter = EqualTo(deleted_column, False)
    if scope is not None and not key.hashed:
        row_filter = And(row_filter, ranges_filter(names[0], scope))
    scan = table.scan(row_filter=row_filter, selected_fields=tuple(names), snapshot_id=snapshot_id)
    # pyiceberg returns the selected columns in the table's order: put them in the compared order
    batches = (batch.select(names) for batch in scan.to_arrow_batch_reader())
    return hashed_side(batches, key, ordered, scope)
