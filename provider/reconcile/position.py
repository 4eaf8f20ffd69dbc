"""The common position of a CDC reconciliation: compare without stopping the writers.

A CDC sink is always a little behind the source. Stopping the world to compare is not allowed, so the
comparison fixes two positions and excludes exactly the keys that may legitimately differ between them.

The rule, in the order the reads happen:

1. ``P`` = the binlog position the capture committed last (its offsets-ledger record; before the first
   capture, the full load's smallest chunk position). Every change at or before ``P`` is in Kafka.
2. ``E`` = the data topics' stable end offsets (LSO), read AFTER ``P``: they cover ``P``'s transaction.
3. The sink is pinned at a version whose committed Kafka offsets are ``>= E`` (else the sink is behind the
   capture and the reconciliation stops with "apply first"; it does not report false mismatches). The
   pinned sink holds every change ``<= P`` and perhaps some later ones, all of them already in Kafka.
4. ``S`` = the exact binlog position of the source's consistent snapshot, opened AFTER the pin: every change
   the pinned sink holds is ``<= S``.
5. The keys of every row change in ``(P, S]`` of the table (read from the binlog) are **in flight**: their
   state at ``P`` and at ``S`` may differ, and the sink may hold either. Every other key has one state over
   ``[P, S]``, which the sink must hold exactly; a difference there is a real mismatch. In-flight keys that
   differ are reported as ``in_flight``, not as mismatches (the next reconciliation checks them).

No stage is paused and nothing in Airflow's metadata is trusted: ``P`` comes from the ledger, ``E`` from the
broker, the sink's offsets from the sink, ``S`` from the source.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from exactly_once_provider.positions import BinlogPosition
from exactly_once_provider.reconcile.keys import Key


@dataclass(frozen=True)
class CommonPosition:
    """The positions a CDC reconciliation compared at, and the keys in flight between them."""

    captured: BinlogPosition  # P
    snapshot: BinlogPosition  # S
    in_flight_keys: frozenset[int]
    changes_read: int

    def to_json(self) -> dict:
        return {
            "captured": str(self.captured),
            "snapshot": str(self.snapshot),
            "in_flight_keys": len(self.in_flight_keys),
            "changes_read": self.changes_read,
            "in_flight": sorted(self.in_flight_keys),
        }  # checked again by the next "changed" reconciliation


def keys_changed_between(
    connection: dict[str, Any], schema: str, table: str, key: Key, after: BinlogPosition, until: BinlogPosition
) -> tuple[frozenset[int], int]:
    """Return the keys of ``schema.table`` with a row change in ``(after, until]``, and how many changes.

    Reads the binlog with python-mysql-replication by file and position (``is_mariadb=False``: with True it
    ignores the position, docs/pitfalls.md#mysql-and-mariadb-sources); updates count both the before and the after key.

    :param connection: ``host``, ``port``, ``user``, ``passwd`` of a user with REPLICATION SLAVE.
    :param schema: the database.
    :param table: the table.
    :param key: the key; the keys come back as the integers the engine bisects (:meth:`Key.of_values`).
    :param after: exclusive start (the captured position ``P``).
    :param until: inclusive end (the snapshot position ``S``).
    """
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    if until <= after:
        return frozenset(), 0
    stream = BinLogStreamReader(
        connection_settings=connection,
        server_id=900_000 + uuid.uuid4().int % 90_000,
        resume_stream=True,
        log_file=after.file,
        log_pos=after.pos,
        is_mariadb=False,
        blocking=False,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
        only_schemas=[schema],
        only_tables=[table],
    )
    keys: set[int] = set()
    changes = 0
    try:
        for event in stream:
            if BinlogPosition(stream.log_file, event.packet.log_pos) > until:
                break
            for row in event.rows:
                changes += 1
                for image in ("values", "before_values", "after_values"):
                    if image in row:
                        keys.add(key.of_values([row[image][name] for name in key.names]))
    finally:
        stream.close()
    return frozenset(keys), changes


def captured_position(
    kafka: dict[str, Any],
    capture: tuple[str, str, str] | None,
    topics: list[str],
    sink: tuple,
    full_load_path: str | None,
) -> tuple[BinlogPosition, dict[str, dict[int, int]] | None]:
    """Return ``P`` (steps 1 to 3 above) and the sink's committed offsets, once the sink applied all of ``P``.

    Without a capture, or before its first commit, ``P`` is the full load's smallest chunk position (no offsets).
    A sink behind the capture raises :class:`~exactly_once_provider.errors.PipelineError`: comparing then would
    report changes still in Kafka as mismatches.

    :param kafka: the ``kafka`` connection's client settings.
    :param capture: ``(pipeline, source_partition, offsets_topic)`` of the capture; None: a plain full load.
    :param topics: the data topics the sink applies.
    :param sink: the sink's reader: the arguments of :func:`~exactly_once_provider.kafka.lag.sink_offsets`,
        ``(kind, location, pipeline, psycopg2 arguments or None[, S3 settings[, Iceberg catalog name]])``.
    :param full_load_path: the full load's Delta table (the handoff), for ``P`` before the capture's first commit.
    """
    from exactly_once_provider.errors import PipelineError
    from exactly_once_provider.full_load.handoff import read_handoff
    from exactly_once_provider.kafka import lag
    from exactly_once_provider.kafka.offsets import read_committed_offset
    from exactly_once_provider.positions import parse_position

    committed = read_committed_offset(kafka, *capture) if capture else None
    if committed is None:
        if not full_load_path:
            raise PipelineError(f"Capture {capture[0] if capture else None!r} never committed; pass full_load_path.")
        return read_handoff(full_load_path).min_position, None
    captured = parse_position(committed.offset)
    end = lag.stable_end_offsets(kafka, list(topics))  # E, read after P
    applied = lag.sink_offsets(*sink)
    behind = lag.Lag(end, applied)
    if behind.total:
        raise PipelineError(
            f"The sink has not applied everything the capture committed (lag {behind.describe()}); run the "
            "apply first. Comparing now would report changes still in Kafka as mismatches."
        )
    return captured, applied


def position_record(
    common: dict | None,
    sink_offsets: dict[str, dict[int, int]] | None,
    pending: list[str],
    scope: list[tuple[int, int]] | None,
) -> dict | None:
    """Return the position a result stores (None without one): where the next ``changed`` scope starts.

    :param common: the comparison's common position (:meth:`CommonPosition.to_json`), or None.
    :param sink_offsets: the Kafka offsets the compared sink had applied (a CDC sink), or None.
    :param pending: source columns the sink does not have yet, compared by neither side.
    :param scope: the key ranges compared (None: the whole table).
    """
    from exactly_once_provider.sinks.base import offsets_to_json

    if common is None:
        return None
    record = dict(common)
    if sink_offsets is not None and not pending:
        record["sink_offsets"] = offsets_to_json(sink_offsets)
    if pending:
        # Not a base for the next "changed" scope: the pending columns' values (fills of older rows included) were
        # not compared, and no change record names the rows the fill rewrites.
        record.pop("sink_offsets", None)
        record["pending_columns"] = pending
    record["scope"] = (
        {"kind": "full"}
        if scope is None
        else {"kind": "changed", "ranges": len(scope), "keys_covered": sum(hi - lo for lo, hi in scope)}
    )
    return record
