"""The status page shows each pipeline's open dead letters per store and the newest errors, read from the stores.

The stores are written as the sinks write them (PostgreSQL: the store's DDL and insert of
:mod:`~exactly_once_provider.sinks.dead_letters`; Delta: a table of its columns, written with delta-rs), holding
letters of the pipeline and of another one; the page counts the pipeline's only.
"""

from __future__ import annotations

import datetime as dt
import uuid

import psycopg2
import pyarrow as pa
from psycopg2 import sql

from exactly_once_provider.plugins.discovery import PipelineSpec, SinkSpec
from exactly_once_provider.plugins.status import Connections, dead_letters_section
from exactly_once_provider.sinks import dead_letters

T0 = dt.datetime(2026, 11, 29, 0, 0, tzinfo=dt.UTC)


def _letter(pipeline: str, offset: int, error: str, minutes: int) -> dict:
    return {
        "pipeline": pipeline,
        "checkpoint_id": "c",
        "batch_id": 1,
        "kafka_topic": "t",
        "kafka_partition": 0,
        "kafka_offset": offset,
        "kafka_timestamp": T0,
        "record_key": b"k",
        "record_value": b"\xff",
        "error_class": error,
        "error_message": f"{error} message",
        "dead_lettered_at": T0 + dt.timedelta(minutes=minutes),
    }


def test_open_letters_per_store_and_the_newest_errors_of_the_pipeline_only(stack, airflow_connections, tmp_path):
    from deltalake import write_deltalake

    pipeline, other = f"dls-{uuid.uuid4().hex[:8]}", f"dls-other-{uuid.uuid4().hex[:8]}"
    table = f"dls_{uuid.uuid4().hex[:8]}"
    conn = psycopg2.connect(**Connections.postgres("postgres_default"))
    with conn, conn.cursor() as cur:
        store = sql.Identifier(dead_letters.default_store("postgres", table))
        cur.execute(sql.SQL(dead_letters.POSTGRES_DDL).format(store))
        rows = [_letter(pipeline, o, "nul_character", o) for o in range(1, 8)] + [_letter(other, 1, "x", 99)]
        dead_letters.insert_postgres(cur, store, dead_letters.DeadLetters("s", rows))
    conn.close()
    path = str(tmp_path / "sink")
    schema = pa.schema(
        [
            ("pipeline", pa.string()),
            ("checkpoint_id", pa.string()),
            ("batch_id", pa.int64()),
            ("kafka_topic", pa.string()),
            ("kafka_partition", pa.int32()),
            ("kafka_offset", pa.int64()),
            ("kafka_timestamp", pa.timestamp("us", "UTC")),
            ("record_key", pa.binary()),
            ("record_value", pa.binary()),
            ("error_class", pa.string()),
            ("error_message", pa.string()),
            ("dead_lettered_at", pa.timestamp("us", "UTC")),
        ]
    )
    letters = [_letter(pipeline, 40, "invalid_utf8", 30), _letter(other, 41, "invalid_utf8", 31)]
    write_deltalake(dead_letters.default_store("delta", path), pa.Table.from_pylist(letters, schema))
    named = str(tmp_path / "letters_elsewhere")  # a store the operator names (dead_letter_store)
    write_deltalake(named, pa.Table.from_pylist([_letter(pipeline, 50, "invalid_utf8", 40)], schema))
    spec = PipelineSpec(
        pipeline,
        sinks={
            SinkSpec("postgres", table, "postgres_default"),
            SinkSpec("delta", path),
            SinkSpec("delta", str(tmp_path / "no-letters")),
            SinkSpec("delta", str(tmp_path / "named"), dead_letter_store=named),
        },
    )

    counts, errors = dead_letters_section(spec, Connections())

    assert counts.error is None and errors.error is None, (counts.error, errors.error)
    assert [(r["sink"], r["store"], r["open letters"], r["newest at"]) for r in counts.rows] == [
        ("delta", named, 1, "2026-11-29T00:40:00+00:00"),  # the sink at tmp_path / "named"
        ("delta", f"{path}_dead_letters", 1, "2026-11-29T00:30:00+00:00"),
        ("postgres", f"{table}_dead_letters", 7, "2026-11-29T00:07:00+00:00"),
    ]
    assert [(r["record"], r["error class"]) for r in errors.rows] == [
        ("t/0@50", "invalid_utf8"),
        ("t/0@40", "invalid_utf8"),
    ] + [(f"t/0@{o}", "nul_character") for o in (7, 6, 5, 4, 3)]
    assert errors.rows[2]["error"] == "nul_character message"
