"""One comparison, wherever it runs: in the task (PostgreSQL sink) or in a Spark driver (Delta sink).

The caller pins the sink side first (its snapshot or table version); the source snapshot opens here, after it
(the position rule, :mod:`~exactly_once_provider.reconcile.position`). The report travels as JSON between a
driver and the operator (:func:`report_to_json`, :func:`report_from_json`).
"""

from __future__ import annotations

import logging
from dataclasses import asdict
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
