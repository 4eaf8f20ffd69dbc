"""The history -> stream template under a real Airflow, driven through the REST API, following its tables by
pattern over two schemas (``tables=["<prefix>_*", "<other schema>.<prefix>_*"]``, one excluded). A first run loads
two tables; ONE second run then loads a table created since (under a writer, while the others stream on), streams an ``ALTER TABLE ... ADD COLUMN ...
DEFAULT`` and re-snapshots the other schema's table through the trigger form's ``resnapshot`` Param; the current tables
are kept in PostgreSQL too (``postgres_table``). Checks read MariaDB and PostgreSQL with plain SQL and the Delta
current tables with pyarrow from the Delta log's live files — never through the product's handoff, version or
reconciliation readers."""

from __future__ import annotations

import json
import threading
import time
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


def _pg(table: str) -> str:
    """The PostgreSQL current table of ``postgres_table="{table}_current"``: another schema's as ``schema_table``."""
    return f"{table.replace('.', '_')}_current"


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


def _create(cur, table: str, rows: int) -> None:
    cur.execute(
        f"CREATE TABLE {table} (id BIGINT AUTO_INCREMENT PRIMARY KEY, amount DECIMAL(12,2) NOT NULL,"
        " currency CHAR(3) NOT NULL, note VARCHAR(20) NULL)"
    )
    cur.executemany(
        f"INSERT INTO {table} (amount, currency, note) VALUES (%s, %s, %s)",
        [(Decimal(i) / 4, ("EUR", "USD")[i % 2], f"n{i}") for i in range(rows)],
    )


def _write(stack, tables: list[str], stop: threading.Event, done: list[int]) -> None:
    """Insert, update and delete in every table in turn, one transaction each, until ``stop``."""
    conn = connect(stack)
    cur = conn.cursor()
    while not stop.is_set():
        table = tables[done[0] % len(tables)]
        cur.execute(f"INSERT INTO {table} (amount, currency, note) VALUES (7.25, 'GBP', 'w')")
        cur.execute(f"UPDATE {table} SET amount = amount + 1, note = 'w' WHERE id = %s", (done[0] % 30 + 1,))
        cur.execute(f"DELETE FROM {table} WHERE note = 'w' ORDER BY id LIMIT 1")  # a row the writer changed
        done[0] += 1
        stop.wait(0.05)
    conn.close()


def _stop_writer_when_loaded(client, dag_id: str, run: str, stop: threading.Event, writer: threading.Thread) -> None:
    """Let the writer run through the run's full load (snapshots taken under writes), and stop it before the
    capture starts (``lag_gate`` runs in between): the capture reads up to the binlog end it sees at its start, so
    every write is in this run and the current tables can be compared with the source row by row afterwards."""
    try:
        while client.run(dag_id, run)["state"] in ("queued", "running"):
            states = _states(client, dag_id, run)
            if states.get("full_load") in ("success", "failed", "upstream_failed", "skipped"):
                assert states.get("capture") in (None, "none", "scheduled", "queued"), states
                break
            time.sleep(0.5)
    finally:
        stop.set()
        writer.join()


def _states(client, dag_id: str, run: str) -> dict[str, str]:
    return {t["task_id"]: t["state"] for t in client.task_instances(dag_id, run)}


def test_history_stream_by_pattern_through_rest_a_new_table_joins_and_one_is_resnapshotted(
    stack, airflow_server, tmp_path
):
    client = airflow_server.client
    prefix = f"afhs_{uuid.uuid4().hex[:6]}"
    other = f"{stack.DB_NAME}_{prefix}"  # a second schema of the server: the re-snapshotted table's
    first, joining, reloaded, excluded = f"{prefix}_a", f"{prefix}_b", f"{other}.{prefix}_c", f"{prefix}_skip"
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(f"CREATE DATABASE {other}")
    _create(cur, first, ROWS)
    _create(cur, reloaded, 80)
    cur.execute(
        f"CREATE TABLE {excluded} (v INT)"
    )  # no primary key: the preflight would refuse it, were it not excluded
    dag_id = f"eo_afhs_{prefix}"
    write_template_dag(
        airflow_server.dags,
        dag_id,
        FACTORY,
        {
            "dag_id": dag_id,
            "schema": stack.DB_NAME,
            "tables": [f"{prefix}_*", f"{other}.{prefix}_*"],
            "exclude_tables": [excluded],
            "key_column": "id",
            "pipeline": f"hs-{prefix}",
            "table_path": str(tmp_path / "{table}"),
            "checkpoint_location": str(tmp_path / "checkpoint"),
            "start_date": "2099-01-01T00:00:00+00:00",  # no scheduled runs: every run here is triggered
            "chunk_rows": 250,
            "topic_partitions": 2,
            "spark_conf": jobs.task_spark_conf(stack),
            "retries": 0,
            "postgres_table": "{table}_current",
        },
    )
    path = {t: str(tmp_path / t) for t in (first, joining, reloaded)}
    client.wait_dag(dag_id)
    client.unpause(dag_id)

    # 1. The first run loads the two tables the pattern matches (no writes meanwhile: the load equals the source).
    run = client.trigger(dag_id)
    client.wait_run(dag_id, run, timeout=1800)
    states = _states(client, dag_id, run)
    assert states["full_load"] == "success" and states["retention_guard"] == "skipped", states
    assert states["apply_postgres"] == states["reconcile_postgres"] == "success", states
    for table in (first, reloaded):
        assert _current(path[table]) == _source(cur, table) and _full_loads(path[table]) == 1
        assert _postgres_current(stack, _pg(table)) == _source(cur, table)

    # 2. In ONE run: a new table matching the pattern joins; an added column with a DEFAULT on the first table
    # (MariaDB gives every existing row the default without a row event) and changes stream on; the third table
    # (of the other schema) is re-snapshotted through the trigger form's Param after changes and deletes (the new snapshot holds them:
    # no tombstone). A writer changes all three tables through the full load of the run (so its snapshots).
    cur.execute(f"ALTER TABLE {first} ADD COLUMN flag SMALLINT NOT NULL DEFAULT 3")
    _create(cur, joining, 120)
    cur.execute(f"DELETE FROM {first} WHERE id IN (3, 250, 251)")
    cur.execute(f"UPDATE {reloaded} SET note = 'reload' WHERE id <= 30")  # the writer's ids there: 3, 6, ... 30
    cur.execute(f"DELETE FROM {reloaded} WHERE id IN (5, 6)")
    stop, done = threading.Event(), [0]
    writer = threading.Thread(target=_write, args=(stack, [first, joining, reloaded], stop, done))
    writer.start()
    run = client.trigger(dag_id, conf={"resnapshot": [reloaded]})
    _stop_writer_when_loaded(client, dag_id, run, stop, writer)
    client.wait_run(dag_id, run, timeout=1800)
    states = _states(client, dag_id, run)
    assert states["full_load"] == "success" and states["retention_guard"] == "success", states
    assert states["reconcile"] == "success", states
    assert client.run(dag_id, run)["conf"] == {"resnapshot": [reloaded]}
    assert f"of 3: hs-{prefix}.{joining}" in client.task_log(dag_id, run, "reconcile")
    loads = {t: _full_loads(path[t]) for t in (first, joining, reloaded)}
    assert loads == {first: 1, joining: 1, reloaded: 2}, "a table loaded before must not be loaded again"
    source = _source(cur, first, ALTERED)
    assert {row[-1] for row in source.values()} == {3}
    assert _current(path[first], ALTERED) == source == _postgres_current(stack, f"{first}_current", ALTERED)
    again = _source(cur, reloaded)
    assert {again[k][2] for k in (1, 2, 4)} == {"reload"} and not {5, 6} & set(again)
    assert _current(path[reloaded]) == again and not {5, 6} & _tombstones(path[reloaded])  # the new snapshot's
    assert _postgres_current(stack, _pg(reloaded)) == again  # rebuilt from it
    joined = _source(cur, joining)
    cur.execute(f"DROP DATABASE {other}")
    conn.close()
    assert done[0] >= 40 and _current(path[joining]) == joined == _postgres_current(stack, f"{joining}_current")
    assert _tombstones(path[joining]) and _tombstones(path[joining]).isdisjoint(joined)  # deletes after its load
    logs = client.task_log(dag_id, run, "reconcile") + client.task_log(dag_id, run, "reconcile_postgres")
    assert logs.count("CLEAN") >= 6, logs[-3000:]
    # The status page shows the tables the newest run matched (the DAG file names only the pattern).
    client.dag(dag_id)  # signs in
    page = client._http.get("/exactly-once/api/pipelines", params={"pipeline": f"hs-{prefix}"})
    assert page.status_code == 200, page.text
    flow = next(f for f in page.json()["flows"] if f"hs-{prefix}" in f["pipelines"])
    tables = sorted([f"{stack.DB_NAME}.{first}", f"{stack.DB_NAME}.{joining}", reloaded])
    assert flow["sources"] == tables, flow
    assert {f"delta {p}" for p in path.values()} <= set(flow["sinks"]), flow
    shown = {t["table"]: t for t in flow["tables"]}  # one row per table, its reconciliation on it
    assert sorted(shown) == tables, flow["tables"]
    assert {t["last reconciliation"] for t in shown.values()} == {"clean"} and {t["lag"] for t in shown.values()} == {0}
