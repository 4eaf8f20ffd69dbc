"""The PostgreSQL sink's bookkeeping reads use their primary keys, however many other pipelines share the tables.

Every statement the sink runs for one pipeline (``committed()``, ``published_windows()``, a batch transaction
with its replay check, the window versions and the window sum) is recorded from its own cursor and explained
by the real server against tables holding 200,000 rows of other pipelines: no sequential scan.
"""

from __future__ import annotations

import psycopg2
import psycopg2.extensions

from exactly_once_provider.sinks.base import BatchCommit
from exactly_once_provider.sinks.postgres import OFFSETS_TABLE, WINDOWS_TABLE, PostgresSink

OTHERS = 200_000


class RecordingCursor(psycopg2.extensions.cursor):
    statements: list[str] = []

    def execute(self, query, vars=None):
        RecordingCursor.statements.append(self.mogrify(query, vars).decode())
        return super().execute(query, vars)


def test_every_bookkeeping_read_of_one_pipeline_uses_an_index(schema):
    sink = PostgresSink("settled", "ours", connect_kwargs={**schema, "cursor_factory": RecordingCursor}, mode="window")
    sink.prepare()
    with psycopg2.connect(**schema) as conn, conn.cursor() as cur:
        cur.execute(
            f"INSERT INTO {OFFSETS_TABLE} (pipeline, topic, kafka_partition, next_offset, checkpoint_id,"
            " batch_id, rows_total) SELECT 'other' || n, 'orders', n % 8, n, 'c', n, n"
            f" FROM generate_series(1, {OTHERS}) AS n"
        )
        cur.execute(
            f"INSERT INTO {WINDOWS_TABLE} (pipeline, window_id, version, rows)"
            f" SELECT 'other' || (n % 1000), 'w' || n, 1, n FROM generate_series(1, {OTHERS}) AS n"
        )
        cur.execute(f"ANALYZE {OFFSETS_TABLE}; ANALYZE {WINDOWS_TABLE}")
    RecordingCursor.statements.clear()
    first = BatchCommit("ours", "c", 0, {"orders": {0: 10}}, 0)
    assert sink.commit_windows(None, {}, {}, first)
    assert sink.commit_windows(None, {}, {}, first) is False  # the replay check inside the transaction
    assert sink.committed().offsets == {"orders": {0: 10}} and sink.published_windows() == {}
    reads = [
        s
        for s in RecordingCursor.statements
        if s.lstrip().upper().startswith("SELECT") and "'ours'" in s and "pg_advisory" not in s
    ]
    assert {OFFSETS_TABLE, WINDOWS_TABLE} <= {t for s in reads for t in (OFFSETS_TABLE, WINDOWS_TABLE) if t in s}
    assert len(reads) >= 5, RecordingCursor.statements
    with psycopg2.connect(**schema) as conn, conn.cursor() as cur:
        for statement in reads:
            cur.execute("EXPLAIN " + statement)
            plan = "\n".join(row[0] for row in cur.fetchall())
            assert "Seq Scan" not in plan and "Index" in plan, f"{statement}\n{plan}"
