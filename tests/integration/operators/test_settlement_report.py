"""SettlementReportOperator on the real stack: the window's sums run as a submitted Spark job; the report is
replaced in PostgreSQL in one transaction, so a rerun leaves one copy per group."""

from __future__ import annotations

import json
from decimal import Decimal

import psycopg2

from exactly_once_provider.operators.settlement_report import SettlementReportOperator
from tests import spark_job_support as jobs
from tests.mysql_support import connect, unique_name


def test_report_sums_one_window_exactly_and_a_rerun_replaces_it(stack, spark, airflow_connections, tmp_path):
    table = unique_name("settle_report")
    conn = connect(stack)
    conn.cursor().execute(f"CREATE TABLE `{table}` (id INT PRIMARY KEY, currency CHAR(3), amount DECIMAL(12, 2))")
    sink = str(tmp_path / "windows")
    rows = [
        ("w/p/1", 1, {"id": i, "currency": "EUR" if i % 3 else "USD", "amount": f"{i}.{i % 100:02d}"})
        for i in range(1, 61)
    ]
    rows.append(("w/p/2", 1, {"id": 99, "currency": "EUR", "amount": "1000.00"}))  # another window: not summed
    spark.createDataFrame(
        [(w, v, json.dumps({"row": r})) for w, v, r in rows],
        "window_id string, window_version int, record_value string",
    ).write.format("delta").save(sink)
    report = f"report_{table}"
    op = SettlementReportOperator(
        task_id="report",
        window_id="w/p/1",
        sink_path=sink,
        report_table=report,
        source_table=table,
        group_by=["currency"],
        sum_columns=["amount"],
        spark_conf=jobs.task_spark_conf(stack),
    )
    try:
        first = op.execute({})
        again = op.execute({})  # a rerun replaces the window's rows
        pg = psycopg2.connect(
            host=stack.HOST,
            port=stack.POSTGRES_PORT,
            dbname=stack.DB_NAME,
            user=stack.DB_USER,
            password=stack.DB_PASSWORD,
        )
        with pg, pg.cursor() as cur:
            cur.execute(f"SELECT window_id, window_version, currency, rows, amount_sum FROM {report} ORDER BY currency")
            stored = cur.fetchall()
            cur.execute(f"DROP TABLE {report}")
        pg.close()
    finally:
        conn.cursor().execute(f"DROP TABLE `{table}`")
        conn.close()
    expected = {}
    for window, _, r in rows:
        if window == "w/p/1":
            count, total = expected.get(r["currency"], (0, Decimal(0)))
            expected[r["currency"]] = (count + 1, total + Decimal(r["amount"]))
    assert stored == [("w/p/1", 1, c, n, s) for c, (n, s) in sorted(expected.items())]
    assert first == again and first["groups"] == 2 and first["rows"] == 60 and first["window_version"] == 1
