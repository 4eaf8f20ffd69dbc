"""The settlement template end to end through ``airflow dags test``: three intervals backfilled in order, one
rerun twice, one re-extracted; every window is in the sink exactly once, reconciled, and reported once."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from decimal import Decimal

import psycopg2
import pytest

from tests import spark_job_support as jobs
from tests.mysql_support import connect
from tests.template_support import TemplateDag

pytestmark = [pytest.mark.e2e, pytest.mark.dags_test, pytest.mark.timeout(3600)]

# 02:00 Asia/Shanghai = 18:00 UTC: the intervals end at these instants.
ENDS = ["2026-11-18T18:00:00+00:00", "2026-11-19T18:00:00+00:00", "2026-11-20T18:00:00+00:00"]
DAYS = {0: "2026-11-17 20:00:00", 1: "2026-11-18 20:00:00", 2: "2026-11-19 20:00:00"}


def test_settlement_windows_once_each_through_backfill_reruns_and_reextract(airflow_home, stack, tmp_path):
    name = f"st_{uuid.uuid4().hex[:6]}"
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(
        f"CREATE TABLE {name} (id INT AUTO_INCREMENT PRIMARY KEY, amount DECIMAL(12,2) NOT NULL, "
        "currency CHAR(3) NOT NULL, updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) "
        "ON UPDATE CURRENT_TIMESTAMP(6), KEY (updated_at))"
    )
    expected: dict[int, Counter] = {}
    for day, stamp in DAYS.items():
        cur.execute(f"SET TIMESTAMP = UNIX_TIMESTAMP('{stamp}')")
        rows = [(Decimal(f"{day * 10 + i}.25"), ("EUR", "USD", "CNY")[i % 3]) for i in range(7 + day)]
        cur.executemany(f"INSERT INTO {name} (amount, currency) VALUES (%s, %s)", rows)
        expected[day] = Counter(c for _, c in rows)
    cur.execute("SET TIMESTAMP = DEFAULT")
    sink, report = str(tmp_path / "windows"), f"{name}_report"
    dag = TemplateDag(
        airflow_home,
        tmp_path / "dags",
        f"eo_settle_{name}",
        "exactly_once_provider.templates.settlement.settlement_dag",
        {
            "dag_id": f"eo_settle_{name}",
            "table": name,
            "cursor_column": "updated_at",
            "group_by": ["currency"],
            "sum_columns": ["amount"],
            "pipeline": f"settle-{name}",
            "topic": f"eo-{name}",
            "sink_path": sink,
            "checkpoint_location": str(tmp_path / "checkpoint"),
            "report_table": report,
            "start_date": "2026-11-01T00:00:00+08:00",
            "timezone": "Asia/Shanghai",
            "safety_lag": 1,
            "spark_conf": stack.spark_conf(),
            "retries": 0,
        },
    )

    for end in ENDS:  # a backfill of three intervals, oldest first
        out = dag.test(end)
        assert "reconciliation" in out and "CLEAN" in out, out[-4000:]
    dag.test(ENDS[2])  # the last interval cleared and rerun, twice
    rerun = dag.test(ENDS[2])
    assert "is already committed" in rerun
    # A late correction of a day-2 row: its cursor moves past every window, so a re-extract of day 2 (the same
    # recorded bounds) publishes version 2 without it, and v2 replaces v1 in the sink and the report.
    cur.execute(f"UPDATE {name} SET amount = 100 WHERE id = 9")
    again = dag.test(ENDS[1], conf={"reextract": True})
    assert " v2 committed" in again, again[-4000:]
    conn.close()

    windows = Counter()
    keys = Counter()
    for window_id, version, key in jobs.arrow_rows(
        jobs.delta_live_files(sink), ("window_id", "window_version", "record_key")
    ):
        windows[(window_id, version)] += 1
        keys[(window_id, key)] += 1
    assert not [k for k, n in keys.items() if n > 1], "a record is in a window twice"
    ids = [f"settle-{name}/{name}/{end}" for end in ENDS]
    assert {w for w, _ in windows} == set(ids), windows
    assert windows[(ids[0], 1)] == 7 and windows[(ids[2], 1)] == 9
    # the re-extracted window 2 replaced v1 (8 rows): its rows still inside the window's bounds (id 9 moved out)
    assert windows[(ids[1], 2)] == 7 and (ids[1], 1) not in windows

    pg = psycopg2.connect(
        host=stack.HOST, port=stack.POSTGRES_PORT, dbname=stack.DB_NAME, user=stack.DB_USER, password=stack.DB_PASSWORD
    )
    with pg.cursor() as pcur:
        pcur.execute(f"SELECT window_id, window_version, currency, rows FROM {report}")
        rows = pcur.fetchall()
        pcur.execute(
            "SELECT status, count(*) FROM eo_reconciliation WHERE name = %s GROUP BY status", (f"settle-{name}",)
        )
        statuses = dict(pcur.fetchall())
    pg.close()
    per_window = Counter()
    for window_id, _version, _currency, count in rows:
        per_window[window_id] += count
    assert per_window == {ids[0]: 7, ids[1]: 7, ids[2]: 9}, rows
    assert len(rows) == len({(w, c) for w, _, c, _ in rows}), "a window's group is reported twice"
    assert statuses == {"clean": 6}, statuses
    print(json.dumps({"windows": {f"{w}/v{v}": n for (w, v), n in windows.items()}}))
