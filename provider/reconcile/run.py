"""One comparison, wherever it runs: in the task (PostgreSQL sink) or in a Spark driver (Delta sink).

The caller pins the sink side first (its snapshot or table version); the source snapshot opens here, after it
(the position rule, :mod:`~exactly_once_provider.reconcile.position`). The report travels as JSON between a
driver and the operator (:func:`report_to_json`, :func:`report_from_json`).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from exactly_once_provider.full_load.columns import Column
from exactly_once_provider.positions import BinlogPosition
from exactly_once_provider.reconcile import engine, position, sides
from exactly_once_provider.reconcile.keys import HASHED_LEAF_WIDTH, Key

if TYPE_CHECKING:
    from exactly_once_provider.source.server import MySqlSource

log = logging.getLogger(__name__)


def compare(
    server: MySqlSource,
    sink_side: Any,
    schema: str,
    table: str,
    key: Key,
    columns: list[Column],
    source_filter: str | None,
    captured: BinlogPosition | None,
    *,
    fanout: int,
    max_segments: int,
    leaf_width: int,
    scope: engine.Ranges | None = None,
) -> tuple[engine.Report, position.CommonPosition | None]:
    """Open the source snapshot and compare it with the (already pinned) sink side.

    :param server: the source server.
    :param sink_side: the sink side, pinned before this call.
    :param schema: the source database.
    :param table: the source table.
    :param key: the key (a single integer column is bisected itself, any other key by its hash).
    :param columns: the columns compared.
    :param source_filter: SQL predicate selecting the source rows.
    :param captured: CDC: the position ``P`` the sink reached; keys changed between it and the snapshot are in
        flight. None compares plainly.
    :param fanout: sub-segments per bisection step.
    :param max_segments: segments of the first pass.
    :param leaf_width: key width compared key by key.
    :param scope: compare only the keys in these ranges (None: the whole table).
    """
    with server.consistent_snapshot() as snapshot:
        common = None
        if captured is not None:
            keys, changes = position.keys_changed_between(
                server.connection_settings().replication_settings(),
                schema,
                table,
                key,
                captured,
                snapshot.position,
            )
            common = position.CommonPosition(captured, snapshot.position, keys, changes)
            log.info(
                "Common position: captured %s, source snapshot %s; %d changes of %d keys in between are in flight",
                captured,
                snapshot.position,
                changes,
                len(keys),
            )
        source = sides.source_side(snapshot.cursor, schema, table, key, columns, source_filter)
        if key.hashed:
            leaf_width = max(leaf_width, HASHED_LEAF_WIDTH)
        report = engine.reconcile(
            source,
            sink_side,
            fanout=fanout,
            max_segments=max_segments,
            leaf_width=leaf_width,
            in_flight_keys=common.in_flight_keys if common else (),
            scope=scope,
        )
    return report, common


@dataclass(frozen=True)
class Comparison:
    """One table's comparison, without its sink side: the arguments of :func:`compare` (see there)."""

    server: Any
    schema: str
    table: str
    key: Key
    columns: list[Column]
    source_filter: str | None
    captured: BinlogPosition | None
    fanout: int
    max_segments: int
    leaf_width: int
    scope: engine.Ranges | None = None

    def against(self, sink_side: Any) -> tuple[engine.Report, position.CommonPosition | None]:
        """Compare with ``sink_side``, pinned before this call (:func:`compare`)."""
        return compare(
            self.server,
            sink_side,
            self.schema,
            self.table,
            self.key,
            self.columns,
            self.source_filter,
            self.captured,
            fanout=self.fanout,
            max_segments=self.max_segments,
            leaf_width=self.leaf_width,
            scope=self.scope,
        )


def compare_with_postgres(
    comparison: Comparison, spec: sides.SinkSpec, pg_conn: Any
) -> tuple[engine.Report, position.CommonPosition | None]:
    """Compare with a PostgreSQL sink read in ONE ``REPEATABLE READ`` read-only transaction of ``pg_conn``.

    The sink's snapshot is taken BEFORE the source snapshot opens (position rule, step 3 -> 4). On success the
    connection is back in ``READ COMMITTED`` read-write, for the caller's result row; on an error the caller
    closes it.

    :param comparison: the comparison.
    :param spec: the sink.
    :param pg_conn: a psycopg2 connection to the sink's database, no transaction open.
    """
    pg_conn.set_session(isolation_level="REPEATABLE READ", readonly=True)
    cur = pg_conn.cursor()
    sink_side = sides.postgres_side(cur, spec, comparison.key, comparison.columns)
    cur.execute("SELECT 1")  # the transaction's snapshot is taken by its first statement
    found = comparison.against(sink_side)
    pg_conn.rollback()
    pg_conn.set_session(isolation_level="READ COMMITTED", readonly=False)
    return found


def compare_with_delta_rs(
    comparison: Comparison, spec: sides.SinkSpec, table: Any, storage_options: dict[str, str] | None
) -> tuple[engine.Report, position.CommonPosition | None]:
    """Compare with a Delta sink read in this process by delta-rs, at its newest version (no Spark application).

    The version is pinned BEFORE the source snapshot opens (position rule).

    :param comparison: the comparison.
    :param spec: the sink (``location``: the table's URI).
    :param table: the table's location or storage (its log is read through it).
    :param storage_options: delta-rs storage options (S3: :meth:`~exactly_once_provider.storage.s3.S3Settings.delta_rs_options`).
    """
    from exactly_once_provider.reconcile.deltars_side import delta_rs_side
    from exactly_once_provider.sinks import delta_commit

    version = delta_commit.newest_version(table)
    if version < 0:
        raise ValueError(f"{spec.location} is not a Delta table (no _delta_log commits): check sink_path.")
    scope = comparison.scope
    _log_read("Delta", spec.location, f"version {version}", "delta-rs", scope)
    sink_side = delta_rs_side(
        spec.location.replace("s3a://", "s3://", 1),
        version,
        comparison.key,
        comparison.columns,
        spec.key_column,
        spec.deleted_column,
        scope,
        storage_options,
    )
    return _against_then_close(comparison, sink_side)


def _log_read(kind: str, location: str, at: str, reader: str, scope: Any) -> None:
    log.info(
        "Reading the %s sink %s at %s in the task with %s (%s)",
        kind,
        location,
        at,
        reader,
        "the whole table" if scope is None else f"{len(scope)} key ranges",
    )


def _against_then_close(comparison: Comparison, sink_side: Any) -> tuple[engine.Report, position.CommonPosition | None]:
    """Compare with a sink side read in this process, then release its reader (files, Arrow buffers)."""
    try:
        return comparison.against(sink_side)
    finally:
        sink_side.close()


def compare_with_iceberg(
    comparison: Comparison, spec: sides.SinkSpec, table: Any
) -> tuple[engine.Report, position.CommonPosition | None]:
    """Compare with an Iceberg sink read in this process by pyiceberg, at its current snapshot (no Spark application).

    The snapshot is pinned BEFORE the source snapshot opens (position rule), as a Delta sink's version is.

    :param comparison: the comparison.
    :param spec: the sink (``location``: the table, ``namespace.table``).
    :param table: the pyiceberg table, loaded through the sink's catalog.
    """
    from exactly_once_provider.reconcile.iceberg_side import iceberg_side

    snapshot = table.current_snapshot()
    snapshot_id = snapshot.snapshot_id if snapshot is not None else None
    scope = comparison.scope
    _log_read("Iceberg", spec.location, f"snapshot {snapshot_id}", "pyiceberg", scope)
    sink_side = iceberg_side(
        table, snapshot_id, comparison.key, comparison.columns, spec.key_column, spec.deleted_column, scope
    )
    return _against_then_close(comparison, sink_side)


def report_to_json(report: engine.Report) -> dict[str, Any]:
    """Return the report as JSON (every difference and query)."""
    return asdict(report)


def report_from_json(data: dict[str, Any]) -> engine.Report:
    """Return the report of :func:`report_to_json`'s output."""
    return engine.Report(
        **{
            **data,
            "differences": [engine.Difference(**d) for d in data["differences"]],
            "queries": [engine.Query(**q) for q in data["queries"]],
        }
    )


def sink_spec_from_json(data: dict[str, Any]) -> sides.SinkSpec:
    """Return the :class:`~exactly_once_provider.reconcile.sides.SinkSpec` of its ``asdict`` (JSON lists -> tuples)."""
    return sides.SinkSpec(
        **{
            **data,
            "json_path": tuple(data["json_path"]),
            "key_json_paths": tuple(tuple(p) for p in data["key_json_paths"]),
        }
    )
