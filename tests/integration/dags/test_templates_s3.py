"""Both templates with their tables and Spark checkpoints on the stack's MinIO (``s3://``, the ``aws_default``
connection), through ``airflow dags test``: the settlement's window and the history -> stream current table are
read back here with delta-rs (its own S3 client) and equal the source row by row, every key once; a rerun adds
nothing; nothing is written to local disk (the full load stages next to the table, in the bucket)."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from decimal import Decimal

import psycopg2
import pytest

from exactly_once_provider.sinks.current_table import DELETED_COLUMN
from exactly_once_provider.storage import open_storage
from tests.mysql_support import connect
from tests.template_support import TemplateDag, create_orders, create_payments

pytestmark = [pytest.mark.e2e, pytest.mark.dags_test, pytest.mark.timeout(3600)]
SETTLEMENT = "exactly_once_provider.templates.settlement.settlement_dag"
HISTORY = "exactly_once_provider.templates.history_stream.history_stream_dag"


@pytest.fixture
def prefix(stack):
    """A fresh ``s3://`` prefix in the stack's test bucket, emptied after the test."""
    location = f"s3://{stack.MINIO_BUCKETS[0]}/it-templates/{uuid.uuid4().hex[:12]}"
    yield location
    open_storage(location, stack.minio_settings()).delete_prefix("")


def _delta_rs(stack, location: str, columns: list[str]) -> list[tuple]:
    """Read a Delta table on MinIO with delta-rs: a reader that shares no code with the provider's."""
    from deltalake import DeltaTable

    table = DeltaTable(location, storage_options=stack.minio_settings().delta_rs_options()).to_pyarrow_table(
        columns=columns
    )
    return list(zip(*(table.column(c).to_pylist() for c in columns)))


def test_settlement_window_on_minio_equals_the_source_once(airflow_home, stack, tmp_path, prefix):
    name = f"st3_{uuid.uuid4().hex[:6]}"
    conn = connect(stack)
    cur = conn.cursor()
    create_payments(cur, name)
    cur.execute("SET TIMESTAMP = UNIX_TIMESTAMP('2026-11-17 20:00:00')")
    cur.executemany(
        f"INSERT INTO {name} (amount, currency) VALUES (%s, %s)",
        [(Decimal(f"{i}.25"), ("EUR", "USD", "CNY")[i % 3]) for i in range(11)],
    )
    cur.execute("SET TIMESTAMP = DEFAULT")
    cur.execute(f"SELECT id, amount, currency FROM {name}")
    source = {str(r[0]): (r[1], r[2]) for r in cur.fetchall()}
    conn.close()
    sink, checkpoint, report = f"{prefix}/windows", f"{prefix}/checkpoint", f"{name}_report"
    end = "2026-11-18T18:00:00+00:00"  # 02:00 Asia/Shanghai
    dag = TemplateDag(
        airflow_home,
        tmp_path / "dags",
        f"eo_settle_{name}",
        SETTLEMENT,
        {
            "dag_id": f"eo_settle_{name}",
            "table": name,
            "cursor_column": "updated_at",
            "group_by": ["currency"],
            "sum_columns": ["amount"],
            "pipeline": f"settle-{name}",
            "topic": f"eo-{name}",
            "sink_path": sink,
            "checkpoint_location": checkpoint,
            "report_table": report,
            "aws_conn_id": "aws_default",
            "start_date": "2026-11-01T00:00:00+08:00",
            "timezone": "Asia/Shanghai",
            "safety_lag": 1,
            "spark_conf": stack.spark_conf(s3=True),
            "retries": 0,
        },
    )

    first = dag.test(end)
    assert "preflight ok: s3://" in first and "CLEAN" in first, first[-4000:]
    rerun = dag.test(end)  # cleared and rerun: the window is already in the sink
    assert "is already committed" in rerun, rerun[-4000:]

    window_id = f"settle-{name}/{name}/{end}"
    rows = _delta_rs(stack, sink, ["window_id", "window_version", "record_key", "record_value"])
    assert {(w, v) for w, v, _, _ in rows} == {(window_id, 1)}, "one window, one version"
    keys = Counter(json.loads(value)["row"]["id"] for _, _, _, value in rows)
    assert not [k for k, n in keys.items() if n > 1], f"duplicate keys in the window: {keys}"
    landed = {
        str(r["id"]): (Decimal(str(r["amount"])), r["currency"])
        for r in (json.loads(value)["row"] for _, _, _, value in rows)
    }
    assert landed == source
    s3 = stack.minio_settings()
    assert open_storage(checkpoint, s3).list("offsets/"), "the checkpoint should be in the bucket"
    assert not any(tmp_path.glob("**/_delta_log")), "nothing Delta on local disk"

    pg = psycopg2.connect(
        host=stack.HOST, port=stack.POSTGRES_PORT, dbname=stack.DB_NAME, user=stack.DB_USER, password=stack.DB_PASSWORD
    )
    with pg.cursor() as pcur:
        pcur.execute(f"SELECT currency, rows, amount_sum FROM {report} WHERE window_id = %s", (window_id,))
        reported = {c: (n, s) for c, n, s in pcur.fetchall()}
    pg.close()
    expected: dict[str, tuple[int, Decimal]] = {}
    for amount, currency in source.values():
        n, s = expected.get(currency, (0, Decimal(0)))
        expected[currency] = (n + 1, s + amount)
    assert reported == expected


def test_history_then_stream_on_minio_equals_the_source_once(airflow_home, stack, tmp_path, prefix):
    table = f"hs3_{uuid.uuid4().hex[:6]}"
    conn = connect(stack)
    cur = conn.cursor()
    create_orders(cur, table, 1500)
    path, checkpoint = f"{prefix}/orders", f"{prefix}/checkpoint"
    dag = TemplateDag(
        airflow_home,
        tmp_path / "dags",
        f"eo_hs_{table}",
        HISTORY,
        {
            "dag_id": f"eo_hs_{table}",
            "schema": stack.DB_NAME,
            "table": table,
            "key_column": "id",
            "pipeline": f"hs-{table}",
            "table_path": path,
            "checkpoint_location": checkpoint,
            "aws_conn_id": "aws_default",  # no staging_path: the full load stages next to the table, in the bucket
            "start_date": "2026-01-01T00:00:00+00:00",
            "chunk_rows": 500,
            "spark_conf": stack.spark_conf(s3=True),
            "retries": 0,
        },
    )

    first = dag.test()  # the full load into the bucket, then the first (empty) increment
    assert "rows as Delta version" in first and "CLEAN" in first, first[-4000:]
    assert f"preflight ok: {path}" in first and f"preflight ok: {checkpoint}" in first
    staged = open_storage(f"{path}._eo_full_load", stack.minio_settings())
    assert staged.list("data/") and staged.list("_manifests/"), "the full load should have staged in the bucket"
    cur.execute(f"UPDATE {table} SET amount = amount + 1, note = NULL WHERE id <= 100")
    cur.execute(f"DELETE FROM {table} WHERE id BETWEEN 200 AND 260")
    cur.executemany(
        f"INSERT INTO {table} (amount, currency, note) VALUES (%s, %s, %s)",
        [(Decimal(i), "CNY", "late") for i in range(40)],
    )
    cur.execute(f"UPDATE {table} SET currency = 'GBP' WHERE note = 'late' ORDER BY id LIMIT 1")  # a new row
    second = dag.test()  # an increment: the capture and the MERGE into the table on MinIO
    assert "rows as Delta version" not in second, "a plain rerun must not load the table again"
    assert "CLEAN" in second and "in_flight 0" in second, second[-4000:]
    cur.execute(f"SELECT id, amount, currency, note FROM {table}")
    source = {r[0]: tuple(r[1:]) for r in cur.fetchall()}
    conn.close()

    rows = _delta_rs(stack, path, ["id", "amount", "currency", "note", DELETED_COLUMN])
    ids = Counter(r[0] for r in rows)
    assert not [k for k, n in ids.items() if n > 1], "a key is in the current table twice"
    assert {r[0]: tuple(r[1:4]) for r in rows if not r[4]} == source
    assert open_storage(checkpoint, stack.minio_settings()).list("offsets/"), "the checkpoint should be in the bucket"
