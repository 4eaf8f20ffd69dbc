"""The settlement template across schema changes of its source (``airflow dags test``): a column added with a
default and a widened DECIMAL between two nights; every window is in the sink once, reconciled and reported with
the source's sums; an old window re-checked after the change names the added column instead of a difference."""

from __future__ import annotations

import uuid
from collections import Counter
from decimal import Decimal

import psycopg2
import pytest

from tests import spark_job_support as jobs
from tests.mysql_support import connect
from tests.template_support import TemplateDag, create_payments

pytestmark = [pytest.mark.e2e, pytest.mark.dags_test, pytest.mark.timeout(3600)]

ENDS = ["2026-11-18T18:00:00+00:00", "2026-11-19T18:00:00+00:00"]  # 02:00 Asia/Shanghai
DAYS = {0: "2026-11-17 20:00:00", 1: "2026-11-18 20:00:00"}


def test_settlement_follows_an_added_column_and_a_widened_decimal_between_nights(airflow_home, stack, tmp_path):
    name = f"sts_{uuid.uuid4().hex[:6]}"
    conn = connect(stack)
    cur = conn.cursor()
    create_payments(cur, name)
    cur.execute(f"SET TIMESTAMP = UNIX_TIMESTAMP('{DAYS[0]}')")
    cur.executemany(
        f"INSERT INTO {name} (amount, currency) VALUES (%s, %s)",
        [(Decimal(f"{i}.25"), ("EUR", "USD")[i % 2]) for i in range(6)],
    )
    cur.execute("SET TIMESTAMP = DEFAULT")
    sink, report = str(tmp_path / "windows"), f"{name}_report"
    dag = TemplateDag(
        airflow_home,
        tmp_path / "dags",
        f"eo_sts_{name}",
        "exactly_once_provider.templates.settlement.settlement_dag",
        {
            "dag_id": f"eo_sts_{name}",
            "table": name,
            "cursor_column": "updated_at",
            "group_by": ["currency"],
            "sum_columns": ["amount"],
            "pipeline": f"sts-{name}",
            "topic": f"eo-{name}",
            "sink_path": sink,
            "checkpoint_location": str(tmp_path / "cp"),
            "report_table": report,
            "start_date": "2026-11-01T00:00:00+08:00",
            "timezone": "Asia/Shanghai",
            "safety_lag": 1,
            "spark_conf": stack.spark_conf(),
            "retries": 0,
        },
    )
    out = dag.test(ENDS[0])
    assert "CLEAN" in out, out[-4000:]

    # Between the nights: a column added with a default (existing rows take it without a new cursor value) and
    # amount widened past the old precision; day 1's rows use both.
    cur.execute(
        f"ALTER TABLE {name} ADD COLUMN fee DECIMAL(8,2) NOT NULL DEFAULT 1.50 AFTER amount, "
        "MODIFY amount DECIMAL(18,2) NOT NULL"
    )
    cur.execute(f"SET TIMESTAMP = UNIX_TIMESTAMP('{DAYS[1]}')")
    day1 = [(Decimal(f"12345678901234.{i}5"), Decimal(f"0.{i}0"), ("EUR", "USD")[i % 2]) for i in range(5)]
    cur.executemany(f"INSERT INTO {name} (amount, fee, currency) VALUES (%s, %s, %s)", day1)
    cur.execute("SET TIMESTAMP = DEFAULT")
    out = dag.test(ENDS[1])
    assert "CLEAN" in out, out[-4000:]
    # Night 0 checked again from the UI: its window holds the rows as extracted, before the column existed.
    recheck = dag.test(ENDS[0])
    assert "is already committed" in recheck, recheck[-4000:]
    assert "Columns ['fee']" in recheck and "are in none of the sink's records" in recheck, recheck[-4000:]
    assert "CLEAN" in recheck, recheck[-4000:]
    conn.close()

    ids = [f"sts-{name}/{name}/{end}" for end in ENDS]
    windows = Counter(w for (w,) in jobs.arrow_rows(jobs.delta_live_files(sink), ("window_id",)))
    assert windows == {ids[0]: 6, ids[1]: 5}, windows
    pg = psycopg2.connect(
        host=stack.HOST, port=stack.POSTGRES_PORT, dbname=stack.DB_NAME, user=stack.DB_USER, password=stack.DB_PASSWORD
    )
    with pg.cursor() as pcur:
        pcur.execute(f"SELECT window_id, currency, rows, amount_sum FROM {report} ORDER BY window_id, currency")
        stored = pcur.fetchall()
    pg.close()
    day0 = [(Decimal(f"{i}.25"), ("EUR", "USD")[i % 2]) for i in range(6)]
    expected = []
    for window, rows in ((ids[0], day0), (ids[1], [(a, c) for a, _, c in day1])):
        for currency in ("EUR", "USD"):
            amounts = [a for a, c in rows if c == currency]
            expected.append((window, currency, len(amounts), sum(amounts)))
    assert stored == sorted(expected), stored
