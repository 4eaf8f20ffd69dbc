"""Repair of dead letters: chosen letters re-applied to their sink and closed in the SAME commit (issue 41).

Built for the PostgreSQL sink in append and CDC mode (docs/dead-letters.md says what is not built yet). One repair
is ONE PostgreSQL transaction, under the pipeline's advisory lock (the stream's batches take it too, so a repair
and a batch never interleave):

1. the store gets its two closing columns if it has none yet (``closed_at``, ``resolution``);
2. the open letters chosen (:class:`Selection`: error classes, offsets, Kafka keys) are read ``FOR UPDATE``;
3. each is turned into the sink's row: by the user's ``fix`` (its key and value text, or None to leave the letter
   open) or, with ``accept``, as it is (its bytes must then be text PostgreSQL can store: else a ValueError
   names it, and nothing is written);
4. the rows are inserted into the sink table and their letters closed (``closed_at = now()``, ``resolution``
   ``repaired`` or ``accepted``); the transaction commits both or neither. CDC mode: each row is the change
   record, keyed and versioned as the stream keys it (:class:`CdcFields`), and written by the stream's own rule
   (:func:`~exactly_once_provider.sinks.postgres.upsert_newer_changes`: it replaces its key's row only if newer,
   and a delete is a tombstone); a change older than its key's row is closed as ``superseded``, not applied.

So a repair killed at any point before its commit applied nothing and closed nothing (the letters stay open,
the next repair takes them again), and after its commit each chosen letter is applied once and closed once; a
second repair finds it closed and does nothing. The sink's offsets (and the ``rows_total`` they count) are the
stream's: a repair does not touch them, so a stream batch planned meanwhile is not failed by it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from exactly_once_provider import faults

RESOLUTIONS = ("repaired", "accepted")


@dataclass(frozen=True)
class Selection:
    """Which open letters a repair takes (every given criterion must hold; none given: every open letter).

    :param error_classes: the letters' ``error_class`` values.
    :param offsets: ``(topic, partition, offset)`` of the letters.
    :param keys: the letters' raw Kafka keys.
    """

    error_classes: tuple[str, ...] = ()
    offsets: tuple[tuple[str, int, int], ...] = ()
    keys: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class CdcFields:
    """Where a CDC sink's change records name their key, version and operation (the stream's ``key_field``,
    ``version_field``, ``op_field``)."""

    key_field: str = "pk"
    version_field: str = "version"
    op_field: str = "op"


@dataclass
class Repaired:
    """What one repair did: the letters applied and closed, those closed as older than the sink's row (CDC), and
    those the fix left open (their positions)."""

    applied: list[tuple[str, int, int]] = field(default_factory=list)
    left_open: list[tuple[str, int, int]] = field(default_factory=list)
    resolution: str = "repaired"
    superseded: list[tuple[str, int, int]] = field(default_factory=list)


def ensure_closing_columns(cur, store) -> None:
    """Add the store's closing columns if missing (a store written before repair existed has none)."""
    from psycopg2 import sql

    cur.execute(
        sql.SQL(
            "ALTER TABLE {} ADD COLUMN IF NOT EXISTS closed_at timestamptz, ADD COLUMN IF NOT EXISTS resolution text"
        ).format(store)
    )


def repair_postgres(
    conn,
    sink_table: str,
    store: str,
    pipeline: str,
    selection: Selection,
    fix: Callable[[dict[str, Any]], tuple[str | None, str | None] | None] | None = None,
    cdc: CdcFields | None = None,
) -> Repaired:
    """Apply the chosen open letters of ``pipeline`` to ``sink_table`` and close them, in ONE transaction.

    :param conn: a psycopg2 connection (its transaction is the repair's; committed here).
    :param sink_table: the append-mode sink table (``schema.table`` allowed).
    :param store: the dead-letter store table.
    :param pipeline: the pipeline whose letters are repaired.
    :param selection: which open letters.
    :param fix: ``fix(letter) -> (key text, value text)`` of the sink's row (None: leave it open); the letter is a
        dict of :data:`~exactly_once_provider.sinks.dead_letters.COLUMNS` with ``bytes`` key and value. None:
        accept each as it is (its bytes decoded as UTF-8 text without NUL, else a ValueError).
    :param cdc: the sink is a CDC table (mode ``cdc``) whose change records name key, version and operation so.
    """
    from psycopg2 import sql
    from psycopg2.extras import execute_values

    from exactly_once_provider.sinks.dead_letters import COLUMNS

    table, letters = sql.Identifier(*sink_table.split(".")), sql.Identifier(*store.split("."))
    result = Repaired(resolution="repaired" if fix is not None else "accepted")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"eo_stream:{pipeline}",))
            ensure_closing_columns(cur, letters)
            where, params = _where(pipeline, selection)
            cur.execute(
                sql.SQL(
                    "SELECT {} FROM {} WHERE {} ORDER BY kafka_topic, kafka_partition, kafka_offset FOR UPDATE"
                ).format(sql.SQL(", ").join(map(sql.Identifier, COLUMNS)), letters, sql.SQL(where)),
                params,
            )
            rows = []
            for found in cur.fetchall():
                letter = {c: bytes(v) if isinstance(v, memoryview) else v for c, v in zip(COLUMNS, found, strict=True)}
                position = (letter["kafka_topic"], letter["kafka_partition"], letter["kafka_offset"])
                row = fix(letter) if fix is not None else _as_it_is(letter, position)
                if row is None:
                    result.left_open.append(position)
                    continue
                rows.append((*position, *_checked(row, position)))
                result.applied.append(position)
            if rows and cdc is not None:
                _write_changes(cur, table, rows, cdc, result)
            elif rows:
                execute_values(
                    cur,
                    sql.SQL(
                        "INSERT INTO {} (kafka_topic, kafka_partition, kafka_offset, record_key, record_value) VALUES %s"
                    )
                    .format(table)
                    .as_string(cur),
                    rows,
                )
            for resolution, closing in ((result.resolution, result.applied), ("superseded", result.superseded)):
                if closing:
                    _close(cur, letters, pipeline, resolution, closing)
            # EO_FAULT_AT=repair_written: rows inserted and letters closed in the open transaction, not committed
            faults.fault_point("repair_written")
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    return result


def _close(cur, letters, pipeline: str, resolution: str, positions: list[tuple[str, int, int]]) -> None:
    """Close the letters at ``positions`` with ``resolution``; all of them, or the repair rolls back."""
    from psycopg2 import sql

    topics, partitions, offsets = (list(column) for column in zip(*positions, strict=True))
    cur.execute(
        sql.SQL(
            "UPDATE {} SET closed_at = now(), resolution = %s WHERE pipeline = %s AND closed_at IS NULL"
            " AND (kafka_topic, kafka_partition, kafka_offset) IN"
            " (SELECT * FROM unnest(%s::text[], %s::integer[], %s::bigint[]))"
        ).format(letters),
        (resolution, pipeline, topics, partitions, offsets),
    )
    if cur.rowcount != len(positions):
        raise RuntimeError(f"closed {cur.rowcount} letters of {len(positions)} {resolution}: rolled back")


def change_row(value: str, position: tuple, cdc: CdcFields) -> tuple:
    """Return the CDC table's row of a repaired change record, keyed as the stream keys it: one key field's value
    as text (a JSON string's characters, else its JSON), several as the JSON array of those texts."""
    import json

    from exactly_once_provider.sinks.dead_letters import ChangeKey, json_at

    found = ChangeKey.cdc(cdc.key_field, cdc.version_field).of_record(value.encode())
    if found is None:
        raise ValueError(
            f"Dead letter {position[0]}/{position[1]}@{position[2]}: its repaired record names no '{cdc.key_field}' "
            f"or no whole-number '{cdc.version_field}', which the CDC table keys its rows by. Nothing was repaired."
        )
    parts, version = found
    pk = parts[0] if len(parts) == 1 else json.dumps(list(parts), separators=(",", ":"), ensure_ascii=False)
    deleted = json_at(json.loads(value), tuple(cdc.op_field.split("."))) in ("d", "delete")
    return (pk, version, deleted, value, *position)


def _write_changes(cur, table, rows: list[tuple], cdc: CdcFields, result: Repaired) -> None:
    """Write the repaired change records by the stream's rule; move those older than their key's row from
    ``result.applied`` to ``result.superseded``."""
    from psycopg2 import sql
    from psycopg2.extras import execute_values

    from exactly_once_provider.sinks.postgres import CDC_COLUMNS, upsert_newer_changes

    newest: dict[str, tuple] = {}  # one change per key, the newest (as a batch's changes step keeps)
    for topic, partition, offset, _, value in rows:
        change = change_row(value, (topic, partition, offset), cdc)
        if change[0] not in newest or (change[1], offset) > (newest[change[0]][1], newest[change[0]][6]):
            newest[change[0]] = change
    staged = sql.Identifier("eo_repaired_changes")
    cur.execute(sql.SQL("CREATE TEMP TABLE {} (LIKE {}) ON COMMIT DROP").format(staged, table))
    execute_values(
        cur,
        sql.SQL("INSERT INTO {} ({}) VALUES %s")
        .format(staged, sql.SQL(", ").join(map(sql.Identifier, CDC_COLUMNS)))
        .as_string(cur),
        list(newest.values()),
    )
    written = set(upsert_newer_changes(cur, table, staged, returning=True))
    applied = {change[4:]: change[0] in written for change in newest.values()}
    result.superseded = [p for p in result.applied if not applied.get(p, False)]
    result.applied = [p for p in result.applied if applied.get(p, False)]


def _where(pipeline: str, selection: Selection) -> tuple[str, list]:
    clauses, params = ["pipeline = %s", "closed_at IS NULL"], [pipeline]
    if selection.error_classes:
        clauses.append("error_class = ANY(%s)")
        params.append(list(selection.error_classes))
    if selection.offsets:
        clauses.append(
            "("
            + " OR ".join(
                "(kafka_topic = %s AND kafka_partition = %s AND kafka_offset = %s)" for _ in selection.offsets
            )
            + ")"
        )
        params += [v for o in selection.offsets for v in o]
    if selection.keys:
        import psycopg2

        clauses.append("record_key = ANY(%s)")
        params.append([psycopg2.Binary(k) for k in selection.keys])
    return " AND ".join(clauses), params


def _as_it_is(letter: dict, position: tuple) -> tuple[str | None, str | None]:
    texts = []
    for column in ("record_key", "record_value"):
        data = letter[column]
        try:
            texts.append(None if data is None else data.decode("utf-8"))
        except UnicodeDecodeError:
            raise ValueError(
                f"Dead letter {position[0]}/{position[1]}@{position[2]} cannot be accepted as it is: its {column} is "
                "not valid UTF-8. Give a fix that returns its text; nothing was repaired."
            ) from None
    return texts[0], texts[1]


def _checked(row: Sequence, position: tuple) -> tuple[str | None, str | None]:
    if len(row) != 2 or any(v is not None and not isinstance(v, str) for v in row):
        raise ValueError(
            f"The fix of dead letter {position[0]}/{position[1]}@{position[2]} returned {row!r}: return "
            "(key text, value text), or None to leave the letter open. Nothing was repaired."
        )
    if any(v is not None and "\x00" in v for v in row):
        raise ValueError(
            f"Dead letter {position[0]}/{position[1]}@{position[2]}: its repaired text holds a NUL character, "
            "which PostgreSQL text cannot store. Nothing was repaired."
        )
    return row[0], row[1]
