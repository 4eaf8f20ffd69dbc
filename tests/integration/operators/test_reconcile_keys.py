"""Reconciliation of tables whose key is not one integer: a composite key (text + integer) and a text key.

The sinks are written by the test itself (an independent path); differences are planted on keys whose text
sorts and hashes nowhere near each other. Every sink and reader (PostgreSQL, Delta through Spark, Delta through
delta-rs) must name exactly the planted keys by their text.
"""

from __future__ import annotations

import uuid
from decimal import Decimal

import psycopg2
import pytest

from exactly_once_provider.operators.reconcile import ReconcileOperator
from tests import spark_job_support as jobs
from tests.mysql_support import connect

ROWS = 2_000
PLANTED = [("EU, 18", "changed"), ("US, 1999", "missing"), ("ZZ, 5", "extra")]


def _rows() -> list[tuple]:
    return [(("EU", "US", "CN")[i % 3], i, Decimal(i) / 8, None if i % 11 == 0 else f"ü{i}") for i in range(ROWS)]


@pytest.fixture(scope="module")
def composite(stack):
    table = f"reck_{uuid.uuid4().hex[:8]}"
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(
        f"CREATE TABLE {table} (region CHAR(2) NOT NULL, n INT NOT NULL, amount DECIMAL(12,3) NOT NULL,"
        " note VARCHAR(20) CHARACTER SET utf8mb4, PRIMARY KEY (region, n))"
    )
    cur.executemany(f"INSERT INTO {table} VALUES (%s, %s, %s, %s)", _rows())
    conn.close()
    return table


def _planted_rows() -> list[tuple]:
    rows = [r for r in _rows() if (r[0], r[1]) != ("US", 1999)]  # missing at the sink
    rows = [(r[0], r[1], r[2] + 1, r[3]) if (r[0], r[1]) == ("EU", 18) else r for r in rows]  # changed
    return rows + [("ZZ", 5, Decimal(1), "extra")]  # only at the sink


def _found(result: dict) -> list[tuple[str, str]]:
    return sorted((d["label"], d["kind"]) for d in result["differences"])


def test_composite_key_postgres_sink_names_each_planted_key(stack, airflow_connections, composite):
    sink = f"{composite}_pg"
    conn = psycopg2.connect(
        host=stack.HOST, port=stack.POSTGRES_PORT, dbname=stack.DB_NAME, user=stack.DB_USER, password=stack.DB_PASSWORD
    )
    with conn, conn.cursor() as cur:
        cur.execute(
            f"CREATE TABLE {sink} (region text, n int, amount numeric(12,3), note text, PRIMARY KEY (region, n))"
        )
        cur.executemany(f"INSERT INTO {sink} VALUES (%s, %s, %s, %s)", _planted_rows())
    conn.close()
    result = ReconcileOperator(
        task_id="reconcile",
        name=f"test-{sink}",
        table=composite,
        sink="postgres",
        sink_table=sink,
        fail_on_mismatch=False,
    ).execute({})
    assert _found(result) == sorted(PLANTED), result["differences"]
    assert result["source_rows"] == ROWS and result["sink_rows"] == ROWS


@pytest.mark.parametrize("reader", ["spark", "delta-rs"])
def test_composite_key_delta_sink_names_each_planted_key_with_either_reader(
    stack, airflow_connections, spark, composite, tmp_path, reader
):
    path = str(tmp_path / "delta")
    spark.createDataFrame(_planted_rows(), "region string, n int, amount decimal(12,3), note string").write.format(
        "delta"
    ).save(path)
    result = ReconcileOperator(
        task_id="reconcile",
        name=f"test-{composite}",
        table=composite,
        sink="delta",
        sink_path=path,
        fail_on_mismatch=False,
        delta_reader=reader,
        spark_conf=jobs.task_spark_conf(stack),
    ).execute({})
    assert _found(result) == sorted(PLANTED), result["differences"]
    assert result["full_scans"] <= 4, result  # bounds + the first pass on each side (a hash range is no index)


def test_text_key_clean_and_changed(stack, airflow_connections, spark, tmp_path):
    table = f"rect_{uuid.uuid4().hex[:8]}"
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE {table} (code VARCHAR(32) PRIMARY KEY, v INT NOT NULL)")
    rows = [(f"acct-{i:05d}-é", i) for i in range(ROWS)]
    cur.executemany(f"INSERT INTO {table} VALUES (%s, %s)", rows)
    path = str(tmp_path / "delta")
    spark.createDataFrame(rows, "code string, v int").write.format("delta").save(path)
    clean = ReconcileOperator(
        task_id="reconcile", name=f"test-{table}", table=table, sink="delta", sink_path=path, delta_reader="delta-rs"
    ).execute({})
    assert clean["clean"] and clean["source_rows"] == clean["sink_rows"] == ROWS
    assert clean["source_checksum"] == clean["sink_checksum"]
    cur.execute(f"UPDATE {table} SET v = -1 WHERE code = 'acct-01234-é'")
    changed = ReconcileOperator(
        task_id="reconcile",
        name=f"test-{table}",
        table=table,
        sink="delta",
        sink_path=path,
        fail_on_mismatch=False,
        delta_reader="delta-rs",
    ).execute({})
    assert _found(changed) == [("acct-01234-é", "changed")]
    cur.execute(f"DROP TABLE {table}")
    conn.close()
