"""The current table: the full load's rows with every later change merged in, one row per source key.

The history -> stream pipeline keeps ONE table per source table (``mode="current"`` of the Kafka -> Delta job).
Its columns are the source columns, typed as the full load loads them
(:func:`exactly_once_provider.full_load.columns.arrow_type`), then two of the provider's:

* ``_eo_version`` (bigint): the source version of the row. A full-load row carries its chunk's snapshot
  (:func:`snapshot_version`), a changed row the version of its newest change
  (the change record's ``version``). A change is merged only if its version is
  newer than the row's: a replayed or older change never overwrites a newer state, whatever the order of
  full reloads, restarts and replays.
* ``_eo_deleted`` (boolean): the key was deleted at ``_eo_version``. Deletes stay as tombstones rather than
  being removed: the tombstone's version is what keeps an older change of that key (still in Kafka after a
  full reload, or replayed) from bringing the row back, even for a moment. Readers select
  ``WHERE NOT _eo_deleted`` (Spark and delta-rs alike: :data:`CURRENT_ROWS`).

A change older than the full load's oldest chunk snapshot never reaches the table
(:func:`exactly_once_provider.spark_jobs.current_changes.typed_changes`, ``since``): the snapshot holds it, and
for a key deleted before the snapshot (no row, no tombstone in the full load) it would bring the row back. Such
changes are in Kafka after a full reload while the capture was behind (after a failover, typically).

Finding the full load without reading history: every stream commit's marker carries a pointer to the full-load
commit its rows build on (:data:`POINTER`: table version, load id, staging directory), so a reader of the handoff
reads the newest commit and the one it points to, never the whole log; and when Delta's log cleanup removed that
commit file, the full load's staging manifest still holds the same marker
(:func:`exactly_once_provider.full_load.handoff.read_handoff`).

Where the guarantee lives: :mod:`~exactly_once_provider.sinks.version_rule` (newer version wins, in every form),
through :func:`merge_condition`, and
:meth:`exactly_once_provider.sinks.delta.DeltaSink.commit` (one Delta MERGE per micro-batch carrying its Kafka
offsets and txn id). The change records are turned into typed rows by
:func:`exactly_once_provider.spark_jobs.current_changes.typed_changes`.
"""

from __future__ import annotations

from exactly_once_provider.positions import BinlogPosition
from exactly_once_provider.sinks import version_rule

FULL_LOAD_MARKER = "eo_full_load"  # the full load's commit marker key (exactly_once_provider.full_load.handoff)
POINTER = "full_load"  # in each stream commit's marker: the full-load commit its rows build on
VERSION_COLUMN = "_eo_version"
DELETED_COLUMN = "_eo_deleted"
META_COLUMNS = (VERSION_COLUMN, DELETED_COLUMN)
# The predicate that turns the current table into the source table (tombstones are deleted keys).
CURRENT_ROWS = f"NOT {DELETED_COLUMN}"


def snapshot_version(position: BinlogPosition) -> int:
    """Return the version a full-load row carries: below every change after ``position``, at or above those in it.

    A snapshot taken at ``position`` holds exactly the changes whose version is below
    :attr:`~exactly_once_provider.positions.BinlogPosition.version`; every later change's version is at least that.

    :param position: the binlog position of the chunk's snapshot.
    """
    return position.version - 1


def quoted(name: str) -> str:
    """Return ``name`` as a Spark SQL identifier (backticks doubled)."""
    return "`" + name.replace("`", "``") + "`"


def merge_condition(key: list[str] | tuple[str, ...], replace_equal: bool = False) -> tuple[str, str]:
    """Return ``(on, update_when)`` of the MERGE of changes ``s`` into the current table ``t``.

    :param key: the source table's primary key columns.
    :param replace_equal: also replace a row by a source row of the same version: the batch that follows a
        schema change carries the table's older rows with the value the change gave them
        (:class:`exactly_once_provider.spark_jobs.current_changes.CurrentChanges`). A version names one state
        of one key (a change, or a full-load snapshot), so a row of equal version is the same row.
    """
    on = " AND ".join(f"t.{quoted(k)} = s.{quoted(k)}" for k in key)
    return on, version_rule.sql_condition(VERSION_COLUMN, replace_equal)


def full_load_pointer(version: int, marker: dict) -> dict:
    """Return the pointer a stream commit carries to the full-load commit ``version`` with ``marker``."""
    body = marker[FULL_LOAD_MARKER]
    return {"version": version, "load_id": body["load_id"], "staging": body.get("staging")}


def as_converted(changes, fills: list) -> object:
    """Return the batch's changes with the values a ``FLOAT`` -> ``DOUBLE`` statement converted, as the server did.

    The server widens each stored FLOAT to the DOUBLE of its 32 bits without a row event; a change record written
    before the statement holds the FLOAT as its shortest decimal (``0.1``), which the DOUBLE column parses as a
    different number. Such a statement comes as a fill of the column from itself
    (:func:`exactly_once_provider.spark_jobs.schema_change.evolve`): the changes older than it are rounded to the
    FLOAT they were, then widened. The rows the table already holds were stored as FLOAT: widening them is exact.

    :param changes: the batch's changes (a Spark DataFrame of the current table's columns).
    :param fills: the fills of the schema changes this batch follows first.
    """
    converted = [f for f in fills if f.source == f.column]
    if not converted:  # the common case: nothing to plan
        return changes
    from pyspark.sql import functions as F

    types = dict(changes.dtypes)
    for fill in converted:
        if types.get(fill.column) == "double":
            value = F.col(quoted(fill.column))
            older = F.col(VERSION_COLUMN) < F.lit(fill.version)
            changes = changes.withColumn(
                fill.column, F.when(older, value.cast("float").cast("double")).otherwise(value)
            )
    return changes
