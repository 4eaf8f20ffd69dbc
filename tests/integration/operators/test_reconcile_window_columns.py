"""Reconciliation of settlement windows across an ADD COLUMN at the source: a window extracted before it holds
the column in none of its records (pending, not a difference); in a window extracted after it, a record
without the column is a difference."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal

from exactly_once_provider.operators.reconcile import ReconcileOperator
from tests.mysql_support import connect


def test_a_column_added_after_a_window_is_pending_and_a_record_missing_it_later_differs(
    stack, airflow_connections, spark, tmp_path
):
    table = f"recw_{uuid.uuid4().hex[:8]}"
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, amount DECIMAL(12,2) NOT NULL, currency CHAR(3))")
    rows = [(i, Decimal(i) / 4, ("EUR", "USD")[i % 2]) for i in range(1, 41)]
    cur.executemany(f"INSERT INTO {table} VALUES (%s, %s, %s)", rows)
    cur.execute(f"ALTER TABLE {table} ADD COLUMN fee DECIMAL(8,2) NOT NULL DEFAULT 1.50")
    conn.close()

    def record(row, fee: bool) -> str:
        values = {"id": row[0], "amount": str(row[1]), "currency": row[2], **({"fee": "1.50"} if fee else {})}
        return json.dumps({"row": values})

    # w/1 was extracted before the ALTER (no record has fee); w/2 after it, but record 33 lost its fee.
    windows = [("w/1", record(r, False)) for r in rows[:20]] + [("w/2", record(r, r[0] != 33)) for r in rows[20:]]
    sink = str(tmp_path / "windows")
    spark.createDataFrame(windows, "window_id string, record_value string").write.format("delta").save(sink)

    def reconcile(window: str, source_filter: str) -> dict:
        return ReconcileOperator(
            task_id="reconcile",
            name=f"test-{table}",
            table=table,
            sink="delta",
            sink_path=sink,
            sink_json_column="record_value",
            sink_json_path="row",
            sink_filter=f"window_id = '{window}'",
            source_filter=source_filter,
            fail_on_mismatch=False,
            spark_conf=stack.spark_conf(),
        ).execute({})

    before = reconcile("w/1", "id <= 20")
    assert before["pending_columns"] == ["fee"], before
    assert before["differences"] == [] and before["sink_rows"] == 20, before
    after = reconcile("w/2", "id > 20")
    assert after["pending_columns"] == [], after
    assert [(d["key"], d["kind"]) for d in after["differences"]] == [(33, "changed")], after
    connect(stack).cursor().execute(f"DROP TABLE {table}")
