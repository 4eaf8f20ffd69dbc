"""The history -> stream template under a real Airflow, driven through the REST API (trigger with the
``full_reload`` Param), with the current table kept in PostgreSQL too (``postgres_table``) and an ``ALTER TABLE
... ADD COLUMN ... DEFAULT`` between two runs. Checks read MariaDB and PostgreSQL with plain SQL and the Delta
current table with pyarrow from the Delta log's live files — never through the product's handoff, version or
reconciliation readers."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal
from pathlib import Path

import pytest

from tests import spark_job_support as jobs
from tests.airflow_support import write_template_dag
from tests.mysql_support import connect

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(3600)]

FACTORY = "exactly_once_provider.templates.history_stream.history_stream_dag"
ROWS = 600


COLUMNS = ("id", "amount", "currency", "note")
ALTERED = (*COLUMNS, "flag")  # after the ADD COLUMN of step 2


def _source(cur, table: str, columns=COLUMNS) -> dict[int, tuple]:
    cur.execute(f"SELECT {', '.join(columns)} FROM {table}")
    return {r[0]: tuple(r[1:]) for r in cur.fetchall()}


def _current(path: str, columns=COLUMNS) -> dict[int, tuple]:
    """The current table's live rows, tombstones (``_eo_deleted``) out; every key once."""
    rows = jobs.arrow_rows(jobs.delta_live_files(path), (*columns, "_eo_deleted"))
    assert len({r[0] for r in rows}) == len(rows), "a key is in the current table twice"
    return {r[0]: (Decimal(r[1]), *r[2:-1]) for r in rows if not r[-1]}


def _postgres_current(stack, table: str, columns=COLUMNS) -> dict[int, tuple]:
    """The PostgreSQL current table's rows, tombstones out (its primary key holds each key once)."""
    rows = jobs.postgres_rows(stack, f"{table} WHERE NOT _eo_deleted", columns)
    return {r[0]: tuple(r[1:]) for r in rows}


def _tombstones(path: str) -> set[int]:
    return {r[0] for r in jobs.arrow_rows(jobs.delta_live_files(path), ("id", "_eo_deleted")) if r[1]}


def _full_loads(path: str) -> int:
    """How many commits of the table's Delta log are full loads (their commitInfo carries the load's marker)."""
    found = 0
    for commit in (Path(path) / "_delta_log").glob("[0-9]*.json"):
        for line in commit.read_text().splitlines():
            info = json.loads(line).get("commitInfo")
            if info and "eo_full_load" in json.loads(info.get("userMetadata") or "{}"):
                found += 1
    return found


def test_history_stream_through_rest_then_full_reload(stack, airflow_server, tmp_path):
    client = airflow_server.client
    table = f"afhs_{uuid.uuid4().hex[:6]}"
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
    dag_id = f"eo_afhs_{table}"
    write_template_dag(
        airflow_server.dags,
        dag_id,
        FACTORY,
        {
            "dag_id": dag_id,
            "schema": stack.DB_NAME,
            "table": table,
            "key_column": "id",
            "pipeline": f"hs-{table}",
            "table_path": full_load,
            "checkpoint_location": str(tmp_path / "checkpoint"),
            "start_date": "2099-01-01T00:00:00+00:00",  # no scheduled runs: every run here is triggered
            "chunk_rows": 250,
            "topic_partitions": 2,
            "spark_conf": jobs.task_spark_conf(stack),
            "retries": 0,
            "postgres_table": f"{table}_current",
        },
    )
    pg_table = f"{table}_current"
    client.wait_dag(dag_id)
    client.unpause(dag_id)

    # 1. The first run loads the table (no writes meanwhile: the full load equals the source).
    run = client.trigger(dag_id)
    client.wait_run(dag_id, run, timeout=1800)
    states = {t["task_id"]: t["state"] for t in client.task_instances(dag_id, run)}
    assert states["full_load"] == "success" and states["retention_guard"] == "skipped", states
    assert states["apply_postgres"] == states["reconcile_postgres"] == "success", states
    assert _current(full_load) == _source(cur, table) and _full_loads(full_load) == 1
    assert _postgres_current(stack, pg_table) == _source(cur, table)

    # 2. Changes after the load, an added column with a DEFAULT (MariaDB gives every existing row the default
    # without a row event); a plain run streams them (no second load).
    cur.execute(f"ALTER TABLE {table} ADD COLUMN flag SMALLINT NOT NULL DEFAULT 3")
    cur.executemany(
        f"INSERT INTO {table} (amount, currency, note) VALUES (%s, %s, NULL)",
        [(Decimal("1.50") * i, "CNY") for i in range(1, 6)],
    )
    cur.execute(f"UPDATE {table} SET amount = amount + 100, note = 'upd' WHERE id % 97 = 0")
    cur.execute(f"DELETE FROM {table} WHERE id IN (3, 250, 251)")
    run = client.trigger(dag_id)
    client.wait_run(dag_id, run, timeout=1800)
    states = {t["task_id"]: t["state"] for t in client.task_instances(dag_id, run)}
    assert states["full_load"] == "skipped" and states["retention_guard"] == "success", states
    assert _full_loads(full_load) == 1, "a plain run must not load the table again"
    source = _source(cur, table, ALTERED)
    assert {row[-1] for row in source.values()} == {3}
    assert _current(full_load, ALTERED) == source == _postgres_current(stack, pg_table, ALTERED)
    assert _tombstones(full_load) == {3, 250, 251}
    assert "CLEAN" in client.task_log(dag_id, run, "reconcile_postgres")

    # 3. full_reload through the trigger form's Param: a new snapshot replaces the table in one commit.
    cur.execute(f"UPDATE {table} SET note = 'reload' WHERE id <= 20")
    run = client.trigger(dag_id, conf={"full_reload": True})
    client.wait_run(dag_id, run, timeout=1800)
    states = {t["task_id"]: t["state"] for t in client.task_instances(dag_id, run)}
    assert states["full_load"] == "success", states
    assert client.run(dag_id, run)["conf"] == {"full_reload": True}
    assert _full_loads(full_load) == 2
    source = _source(cur, table, ALTERED)
    conn.close()
    assert _current(full_load, ALTERED) == source and _tombstones(full_load) == set()  # the new snapshot
    assert _postgres_current(stack, pg_table, ALTERED) == source  # rebuilt from it
    assert "CLEAN" in client.task_log(dag_id, run, "reconcile")
    assert "CLEAN" in client.task_log(dag_id, run, "reconcile_postgres")
