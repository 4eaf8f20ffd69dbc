"""OpenLineage of both templates: run each through ``airflow dags test`` with the OpenLineage ``file`` transport
and check the emitted events against what this test reads itself from MariaDB, Kafka, the Delta tables and
PostgreSQL: every task's datasets, schemas and row counts, the committed positions, one connected graph from the
MySQL table through the topic to the sink tables, and the templates' Assets naming the same datasets."""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import psycopg2
import pytest
from airflow.providers.openlineage.utils.utils import translate_airflow_asset
from airflow.sdk import Asset

from exactly_once_provider.full_load.handoff import read_handoff
from tests import spark_job_support as jobs
from tests.kafka_support import read_all
from tests.mysql_support import connect
from tests.template_support import TemplateDag

pytestmark = [pytest.mark.e2e, pytest.mark.dags_test, pytest.mark.timeout(3600)]


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _completed(events: list[dict], dag_id: str) -> dict[str, list[dict]]:
    """Return the COMPLETE events of ``dag_id``'s tasks by task id (one per run of the task)."""
    found: dict[str, list[dict]] = defaultdict(list)
    for event in events:
        job = event["job"]["name"]
        if event["eventType"] == "COMPLETE" and job.startswith(f"{dag_id}."):
            found[job[len(dag_id) + 1 :]].append(event)
    return found


def _dataset(event: dict, side: str, namespace: str, name: str) -> dict:
    matches = [d for d in event[side] if (d["namespace"], d["name"]) == (namespace, name)]
    assert len(matches) == 1, f"{namespace} {name} not among the {side} of {event['job']['name']}: {event[side]}"
    return matches[0]


def _rows(dataset: dict) -> int:
    return dataset["outputFacets"]["outputStatistics"]["rowCount"]


def _columns(dataset: dict) -> list[str]:
    return [f["name"] for f in dataset["facets"]["schema"]["fields"]]


def _reaches(events: list[dict], start: tuple[str, str], goal: tuple[str, str]) -> list[tuple[str, str]]:
    """Return a path of datasets from ``start`` to ``goal`` through the tasks' input -> output edges, or []."""
    edges: dict[tuple, set[tuple]] = defaultdict(set)
    for event in events:
        for i in event["inputs"]:
            for o in event["outputs"]:
                edges[(i["namespace"], i["name"])].add((o["namespace"], o["name"]))
    paths = [[start]]
    seen = {start}
    while paths:
        path = paths.pop(0)
        if path[-1] == goal:
            return path
        for nxt in edges[path[-1]] - seen:
            seen.add(nxt)
            paths.append(path + [nxt])
    return []


def _outlet_datasets(dag) -> set[tuple[str, str]]:
    """Return the OpenLineage datasets the DAG's Assets convert to (the Airflow providers' converters)."""
    converted = set()
    for task in dag.tasks:
        for asset in (o for o in task.outlets if hasattr(o, "uri")):  # AssetAliases name theirs at run time
            dataset = translate_airflow_asset(asset, None)
            assert dataset is not None, f"no converter for Asset {asset.uri}"
            converted.add((dataset.namespace, dataset.name))
    return converted


@pytest.fixture
def lineage_env(airflow_home, tmp_path):
    """``airflow`` CLI environment whose OpenLineage events go to one file (the ``file`` transport)."""
    events = tmp_path / "openlineage" / "events.jsonl"
    events.parent.mkdir()
    env = {
        **airflow_home,
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(events), "append": True}),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "eo-lineage-test",
        "AIRFLOW__OPENLINEAGE__DISABLED": "False",
    }
    return env, events


def test_settlement_lineage(lineage_env, stack, tmp_path):
    env, events_file = lineage_env
    name = f"ol_{uuid.uuid4().hex[:6]}"
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(
        f"CREATE TABLE {name} (id INT AUTO_INCREMENT PRIMARY KEY, amount DECIMAL(12,2) NOT NULL, "
        "currency CHAR(3) NOT NULL, updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), KEY (updated_at))"
    )
    cur.execute("SET TIMESTAMP = UNIX_TIMESTAMP('2026-11-17 20:00:00')")
    cur.executemany(
        f"INSERT INTO {name} (amount, currency) VALUES (%s, %s)",
        [(Decimal(f"{i}.25"), ("EUR", "USD", "CNY")[i % 3]) for i in range(11)],
    )
    cur.execute("SET TIMESTAMP = DEFAULT")
    conn.close()
    dag_id, topic, sink, report = f"eo_settle_{name}", f"eo-{name}", str(tmp_path / "windows"), f"{name}_report"
    kwargs = {
        "dag_id": dag_id,
        "table": name,
        "cursor_column": "updated_at",
        "group_by": ["currency"],
        "sum_columns": ["amount"],
        "pipeline": f"settle-{name}",
        "topic": topic,
        "sink_path": sink,
        "checkpoint_location": str(tmp_path / "checkpoint"),
        "report_table": report,
        "start_date": "2026-11-01T00:00:00+08:00",
        "timezone": "Asia/Shanghai",
        "safety_lag": 1,
        "spark_conf": stack.spark_conf(),
        "retries": 0,
    }
    dag = TemplateDag(
        env, tmp_path / "dags", dag_id, "exactly_once_provider.templates.settlement.settlement_dag", kwargs
    )
    dag.test("2026-11-18T18:00:00+00:00")

    events = _events(events_file)
    done = _completed(events, dag_id)
    mysql = (f"mysql://{stack.HOST}:{stack.MARIADB_PORT}", f"{stack.DB_NAME}.{name}")
    kafka = (f"kafka://{stack.HOST}:{stack.KAFKA_SECURE_PORT}", topic)
    delta = ("file", sink)
    pg = (f"postgres://{stack.HOST}:{stack.POSTGRES_PORT}", f"{stack.DB_NAME}.public.{report}")

    # What this test reads itself: 11 rows at the source, 11 committed records, 11 sink rows, 3 report groups.
    committed = read_all(f"{stack.HOST}:{stack.KAFKA_PORT}", topic)
    data_records = [r for r in committed if b'"row"' in r]
    sink_rows = jobs.arrow_rows(jobs.delta_live_files(sink), ("window_id", "record_key"))
    with (
        psycopg2.connect(
            host=stack.HOST,
            port=stack.POSTGRES_PORT,
            dbname=stack.DB_NAME,
            user=stack.DB_USER,
            password=stack.DB_PASSWORD,
        ) as pcon,
        pcon.cursor() as pcur,
    ):
        pcur.execute(f"SELECT count(*) FROM {report}")
        report_rows = pcur.fetchone()[0]
    assert (len(data_records), len(sink_rows), report_rows) == (11, 11, 3)

    extract = done["extract_window"][-1]
    source = _dataset(extract, "inputs", *mysql)
    assert _columns(source) == ["id", "amount", "currency", "updated_at"]
    produced = _dataset(extract, "outputs", *kafka)
    assert _rows(produced) == len(data_records)
    row_fields = next(f for f in produced["facets"]["schema"]["fields"] if f["name"] == "row")["fields"]
    assert [f["name"] for f in row_fields] == _columns(source)
    window = produced["outputFacets"]["exactlyOnce_commit"]["window"]
    assert window["batch_id"] == "2026-11-18T18:00:00+00:00" and window["batch_version"] == 1 and window["upper"]

    load = done["load_window"][-1]
    _dataset(load, "inputs", *kafka)
    loaded = _dataset(load, "outputs", *delta)
    assert _rows(loaded) == len(sink_rows)
    assert {"window_id", "record_value", "kafka_offset"} <= set(_columns(loaded))
    assert loaded["outputFacets"]["outputStatistics"]["size"] > 0
    assert loaded["outputFacets"]["exactlyOnce_commit"]["kafkaOffsets"][topic]

    reconcile = done["reconcile_window"][-1]
    _dataset(reconcile, "inputs", *mysql)
    _dataset(reconcile, "inputs", *delta)
    results = _dataset(
        reconcile,
        "outputs",
        f"postgres://{stack.HOST}:{stack.POSTGRES_PORT}",
        f"{stack.DB_NAME}.public.eo_reconciliation",
    )
    assert _rows(results) == 1

    settled = done["settlement_report"][-1]
    _dataset(settled, "inputs", *delta)
    reported = _dataset(settled, "outputs", *pg)
    assert _rows(reported) == report_rows
    assert _columns(reported)[:4] == ["window_id", "window_version", "currency", "rows"]

    assert _reaches(events, mysql, pg) == [mysql, kafka, delta, pg]
    # The Assets the template declares are the datasets the lineage names.
    import pendulum

    from exactly_once_provider.templates.settlement import settlement_dag

    parsed = settlement_dag(**{**kwargs, "start_date": pendulum.parse(kwargs["start_date"])})
    assert _outlet_datasets(parsed) == {delta}
    # The report's Asset (its URI names the PostgreSQL server) reached Airflow through the alias when it ran.
    db = sqlite3.connect(Path(env["AIRFLOW_HOME"]) / "airflow.db")
    aliased = db.execute(
        "SELECT a.uri FROM asset a JOIN asset_alias_asset aa ON aa.asset_id = a.id JOIN "
        "asset_alias al ON al.id = aa.alias_id WHERE al.name = ?",
        (f"{dag_id}.report",),
    ).fetchall()
    db.close()
    assert {(d.namespace, d.name) for d in (translate_airflow_asset(Asset(uri=u), None) for (u,) in aliased)} == {pg}


def test_history_stream_lineage(lineage_env, stack, tmp_path):
    env, events_file = lineage_env
    table = f"olh_{uuid.uuid4().hex[:6]}"
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(
        f"CREATE TABLE {table} (id BIGINT AUTO_INCREMENT PRIMARY KEY, amount DECIMAL(12,2) NOT NULL,"
        " note VARCHAR(20) NULL)"
    )
    cur.executemany(
        f"INSERT INTO {table} (amount, note) VALUES (%s, %s)", [(Decimal(i) / 4, f"n{i}") for i in range(500)]
    )
    dag_id, pipeline = f"eo_hs_{table}", f"hs-{table}"
    table_path = str(tmp_path / "orders")
    kwargs = {
        "dag_id": dag_id,
        "schema": stack.DB_NAME,
        "table": table,
        "key_column": "id",
        "pipeline": pipeline,
        "table_path": table_path,
        "checkpoint_location": str(tmp_path / "checkpoint"),
        "start_date": "2026-01-01T00:00:00+00:00",
        "chunk_rows": 200,
        "spark_conf": stack.spark_conf(),
        "retries": 0,
    }
    dag = TemplateDag(
        env, tmp_path / "dags", dag_id, "exactly_once_provider.templates.history_stream.history_stream_dag", kwargs
    )
    dag.test()  # the full load, then an increment with nothing new
    cur.executemany(f"INSERT INTO {table} (amount, note) VALUES (%s, 'live')", [(Decimal(i),) for i in range(30)])
    cur.execute(f"UPDATE {table} SET note = 'changed' WHERE id <= 20")
    cur.execute(f"DELETE FROM {table} WHERE id BETWEEN 21 AND 25")
    dag.test()  # the second increment: 30 inserts, 20 updates, 5 deletes
    conn.close()

    events = _events(events_file)
    done = _completed(events, dag_id)
    topic = f"{pipeline}.{stack.DB_NAME}.{table}"
    mysql = (f"mysql://{stack.HOST}:{stack.MARIADB_PORT}", f"{stack.DB_NAME}.{table}")
    kafka = (f"kafka://{stack.HOST}:{stack.KAFKA_SECURE_PORT}", topic)
    current = ("file", table_path)  # the one current table: the full load's rows, the changes merged into it

    handoff = read_handoff(table_path)
    records = read_all(f"{stack.HOST}:{stack.KAFKA_PORT}", topic)
    assert (handoff.rows, len(records)) == (500, 55)

    first = done["full_load"][-1]
    source = _dataset(first, "inputs", *mysql)
    assert _columns(source) == ["id", "amount", "note"]
    table_out = _dataset(first, "outputs", *current)
    assert _rows(table_out) == handoff.rows
    assert {"id", "amount", "note"} <= set(_columns(table_out))
    assert table_out["outputFacets"]["outputStatistics"]["size"] > 0
    assert table_out["outputFacets"]["exactlyOnce_commit"]["position"] == str(handoff.min_position)

    captures = done["capture"]
    assert [_rows(_dataset(e, "outputs", *kafka)) for e in captures] == [0, len(records)]
    captured = _dataset(captures[-1], "outputs", *kafka)
    after = next(f for f in captured["facets"]["schema"]["fields"] if f["name"] == "after")["fields"]
    assert [f["name"] for f in after] == ["id", "amount", "note"]
    position = captured["outputFacets"]["exactlyOnce_commit"]["position"]
    assert position.startswith("binlog.") and ":" in position

    applies = done["apply"]
    # every change record the capture committed was merged into the table by the second run
    assert [_rows(_dataset(e, "outputs", *current)) for e in applies] == [0, len(records)]
    _dataset(applies[-1], "inputs", *kafka)

    for event in done["reconcile"]:
        for dataset in (mysql, current):
            _dataset(event, "inputs", *dataset)

    assert _reaches(events, mysql, current) == [mysql, current]  # the full load
    full_load_edges = {(i["name"], o["name"]) for e in done["full_load"] for i in e["inputs"] for o in e["outputs"]}
    apply_edges = {(i["name"], o["name"]) for e in applies for i in e["inputs"] for o in e["outputs"]}
    capture_edges = {(i["name"], o["name"]) for e in captures for i in e["inputs"] for o in e["outputs"]}
    assert (mysql[1], kafka[1]) in capture_edges and (kafka[1], table_path) in apply_edges
    assert (mysql[1], table_path) in full_load_edges  # and the stream: MySQL table -> topic -> the same table
    import pendulum

    from exactly_once_provider.templates.history_stream import history_stream_dag

    parsed = history_stream_dag(**{**kwargs, "start_date": pendulum.parse(kwargs["start_date"])})
    assert _outlet_datasets(parsed) == {current}
