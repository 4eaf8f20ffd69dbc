"""Repair of dead letters: chosen letters re-applied to their sink and closed in the SAME commit (issue 41).

Built for the PostgreSQL sink in append mode (docs/dead-letters.md says what is not built yet). One repair is ONE
PostgreSQL transaction, under the pipeline's advisory lock (the stream's batches take it too, so a repair and a
batch never interleave):

1. the store gets its two closing columns if it has none yet (``closed_at``, ``resolution``);
2. the open letters chosen (:class:`Selection`: error classes, offsets, Kafka keys) are read ``FOR UPDATE``;
3. each is turned into the sink's row: by the user's ``fix`` (its key and value text, or None to leave the letter
   open) or, with ``accept``, as it is (its bytes must then be text PostgreSQL can store: else a ValueError
   names it, and nothing is written);
4. the rows are inserted into the sink table and their letters closed (``closed_at = now()``, ``resolution``
   ``repaired`` or ``accepted``); the transaction commits both or neither.

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


@dataclass
class Repaired:
    """What one repair did: the letters applied and closed, and those the fix left open (their positions)."""

    applied: list[tuple[str, int, int]] = field(default_factory=list)
    left_open: list[tuple[str, int, int]] = field(default_factory=list)
    resolution: str = "repaired"


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
            if rows:
                execute_values(
                    cur,
                    sql.SQL(
                        "INSERT INTO {} (kafka_topic, kafka_partition, kafka_offset, record_key, record_value) VALUES %s"
                    )
                    .format(table)
                    .as_string(cur),
                    rows,
                )
                topics, partitions, offsets = (list(column) for column in zip(*result.applied, strict=True))
                cur.execute(
                    sql.SQL(
                        "UPDATE {} SET closed_at = now(), resolution = %s WHERE pipeline = %s AND closed_at IS NULL"
                        " AND (kafka_topic, kafka_partition, kafka_offset) IN"
                        " (SELECT * FROM unnest(%s::text[], %s::integer[], %s::bigint[]))"
                    ).format(letters),
                    (result.resolution, pipeline, topics, partitions, offsets),
                )
                if cur.rowcount != len(result.applied):
                    raise RuntimeError(f"closed {cur.rowcount} letters of {len(result.applied)} applied: rolled back")
            # EO_FAULT_AT=repair_written: rows inserted and letters closed in the open transaction, not committed
            faults.fault_point("repair_written")
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    return result


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
