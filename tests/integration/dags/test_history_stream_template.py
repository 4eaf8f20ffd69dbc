"""The history -> stream template end to end through ``airflow dags test`` while a writer runs: the first run
loads the table and captures the first increment, later runs continue from committed offsets, a
``full_reload`` run replaces the table under writes, an ``ALTER TABLE ... ADD COLUMN ... DEFAULT`` mid-stream
reaches the table (the rows older than it hold the default, as the source shows them), and after the writer
stops the table equals the source row by row (checked by the reconciliation AND by reading the current table's files here). The template's
PostgreSQL current table (``postgres_table``: built from the same full load, rebuilt by the ``full_reload``)
equals the source too, and its own reconciliation is clean after every run."""

from __future__ import annotations

import random
import threading
import time
import uuid
from decimal import Decimal

import pytest

from exactly_once_provider.full_load.handoff import read_handoff
from exactly_once_provider.sinks.current_table import DELETED_COLUMN
from tests import spark_job_support as jobs
from tests.mysql_support import connect
from tests.template_support import TemplateDag

pytestmark = [pytest.mark.e2e, pytest.mark.dags_test, pytest.mark.timeout(3600)]
ROWS = 3000
COLUMNS = ("id", "amount", "currency", "note", "flag")  # flag: added mid-stream with a DEFAULT


def _writer(stack, table: str, stop: threading.Event, counts: dict) -> None:
    conn = connect(stack)
    cur = conn.cursor()
    rng = random.Random(11)
    while not stop.is_set():
        roll = rng.random()
        if roll < 0.4:
            cur.execute(
                f"INSERT INTO {table} (amount, currency, note) VALUES (%s, %s, 'live')",
                (Decimal(rng.randrange(1, 10**6)) / 100, rng.choice(["EUR", "USD", "CNY"])),
            )
        elif roll < 0.85:
            cur.execute(f"UPDATE {table} SET amount = amount + 1, note = NULL WHERE id = %s", (rng.randint(1, ROWS),))
        else:
            cur.execute("START TRANSACTION")
            cur.execute(f"DELETE FROM {table} WHERE id = %s", (rng.randint(1, ROWS),))
            cur.execute(f"UPDATE {table} SET currency = 'GBP' WHERE id = %s", (rng.randint(1, ROWS),))
            cur.execute("COMMIT")
        counts["ops"] += 1
        time.sleep(0.02)
    conn.close()


def _current_rows(path: str) -> dict[int, tuple]:
    """Read the current table here, independently of the reconciliation: its live Parquet files, tombstones out."""
    rows = jobs.arrow_rows(jobs.delta_live_files(path), (*COLUMNS, DELETED_COLUMN))
    assert len({r[0] for r in rows}) == len(rows), "a key is in the current table twice"
    return {r[0]: tuple(r[1:-1]) for r in rows if not r[-1]}


def _postgres_current(stack, table: str) -> dict[int, tuple]:
    rows = jobs.postgres_rows(stack, table, (*COLUMNS, DELETED_COLUMN))
    return {r[0]: tuple(r[1:-1]) for r in rows if not r[-1]}


def _reconciliations(stack, name: str) -> list[str]:
    return [
        r[0] for r in jobs.postgres_rows(stack, f"eo_reconciliation WHERE name = '{name}' ORDER BY id", ("status",))
    ]


def test_history_then_stream_with_full_reload_under_writes(airflow_home, stack, tmp_path):
    table = f"hs_{uuid.uuid4().hex[:6]}"
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(
        f"CREATE TABLE {table} (id BIGINT AUTO_INCREMENT PRIMARY KEY, amount DECIMAL(12,2) NOT NULL,"
        " currency CHAR(3) NOT NULL, note VARCHAR(20) NULL)"
    )
    cur.executemany(
        f"INSERT INTO {table} (amount, currency, note) VALUES (%s, %s, %s)",
        [(Decimal(i) / 4, ("EUR", "USD")[i % 2], f"n{i}") for i in range(ROWS)],
    )
    full_load = str(tmp_path / "orders")
    dag = TemplateDag(
        airflow_home,
        tmp_path / "dags",
        f"eo_hs_{table}",
        "exactly_once_provider.templates.history_stream.history_stream_dag",
        {
            "dag_id": f"eo_hs_{table}",
            "schema": stack.DB_NAME,
            "table": table,
            "key_column": "id",
            "pipeline": f"hs-{table}",
            "table_path": full_load,
            "checkpoint_location": str(tmp_path / "checkpoint"),
            "start_date": "2026-01-01T00:00:00+00:00",
            "chunk_rows": 1000,
            "topic_partitions": 2,
            "spark_conf": stack.spark_conf(),
            "retries": 0,
            "postgres_table": f"{table}_current",
        },
    )
    stop, counts = threading.Event(), {"ops": 0}
    thread = threading.Thread(target=_writer, args=(stack, table, stop, counts))
    thread.start()
    try:
        first = dag.test()  # the full load under writes, then the first increment
        assert "rows as Delta version" in first and "CLEAN" in first, first[-4000:]
        before = read_handoff(full_load).load_id
        reload = dag.test(conf={"full_reload": True})
        assert read_handoff(full_load).load_id != before, "full_reload did not take a new snapshot"
        assert "CLEAN" in reload, reload[-4000:]
        # Mid-stream, writers running: MariaDB gives every existing row the default without a row event.
        cur.execute(f"ALTER TABLE {table} ADD COLUMN flag SMALLINT NOT NULL DEFAULT 3")
        altered = dag.test()
        assert "ADD COLUMN flag SMALLINT NOT NULL DEFAULT 3" in altered and "CLEAN" in altered, altered[-4000:]
    finally:
        stop.set()
        thread.join()
    final = dag.test()  # an increment after the reload: continues from committed offsets
    assert "rows as Delta version" not in final, "a plain rerun must not load the table again"
    assert "CLEAN" in final and "in_flight 0" in final, final[-4000:]
    assert counts["ops"] > 50, counts
    cur.execute(f"SELECT {', '.join(COLUMNS)} FROM {table}")
    source = {r[0]: tuple(r[1:]) for r in cur.fetchall()}
    conn.close()
    assert _current_rows(full_load) == source
    assert _postgres_current(stack, f"{table}_current") == source
    assert {row[-1] for row in source.values()} == {3}  # every row shows the default: the sinks must too
    assert _reconciliations(stack, f"hs-{table}") == _reconciliations(stack, f"hs-{table}.postgres") == ["clean"] * 4
