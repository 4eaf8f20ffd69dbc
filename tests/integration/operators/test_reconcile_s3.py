"""Reconciliation of a Delta table on S3 (the stack's MinIO, through the ``aws_default`` connection).

The table is written by delta-rs, a writer independent of the provider, with one planted difference; both readers
of the operator (in the task with delta-rs, and in a Spark application through s3a) must name exactly that key.
"""

from __future__ import annotations

import uuid
from decimal import Decimal

import pyarrow as pa
import pytest

from exactly_once_provider.operators.reconcile import ReconcileOperator
from tests import spark_job_support as jobs
from tests.mysql_support import connect

ROWS = 1_000


@pytest.mark.parametrize("reader", ["delta-rs", "spark"])
def test_delta_table_on_s3_is_reconciled_by_either_reader(stack, airflow_connections, reader):
    from deltalake import write_deltalake

    table = f"recs3_{uuid.uuid4().hex[:8]}"
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE {table} (code VARCHAR(16) PRIMARY KEY, amount DECIMAL(12,2) NOT NULL)")
    rows = [(f"c{i:05d}", Decimal(i) / 4) for i in range(ROWS)]
    cur.executemany(f"INSERT INTO {table} VALUES (%s, %s)", rows)
    s3 = stack.minio_settings()
    path = f"s3://{stack.MINIO_BUCKETS[0]}/it-reconcile/{uuid.uuid4().hex}"
    planted = [(code, amount + 1 if code == "c00042" else amount) for code, amount in rows]
    write_deltalake(
        path,
        pa.table({"code": [r[0] for r in planted], "amount": pa.array([r[1] for r in planted], pa.decimal128(12, 2))}),
        storage_options=s3.delta_rs_options(),
    )
    result = ReconcileOperator(
        task_id="reconcile",
        name=f"test-{table}",
        table=table,
        sink="delta",
        sink_path=path,
        delta_reader=reader,
        fail_on_mismatch=False,
        spark_conf=jobs.task_spark_conf(stack, s3=True),
    ).execute({})
    assert [(d["label"], d["kind"]) for d in result["differences"]] == [("c00042", "changed")], result
    assert result["source_rows"] == result["sink_rows"] == ROWS
    cur.execute(f"DROP TABLE {table}")
    conn.close()
