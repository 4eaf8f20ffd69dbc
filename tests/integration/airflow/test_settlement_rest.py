"""The settlement template under a real Airflow (scheduler, LocalExecutor, PostgreSQL), driven through the REST API.

Runs are triggered with the ``window_end`` Param, tasks cleared and marked failed as the UI does. The checks
read the source with plain SQL, the Delta sink with pyarrow (the Delta log's live files) and the report with
psycopg2 — never through the product's ledger or readers.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import psycopg2
import pytest

from tests import spark_job_support as jobs
from tests.airflow_support import processes_matching, write_template_dag
from tests.mysql_support import connect

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(3600)]

FACTORY = "exactly_once_provider.templates.settlement.settlement_dag"
CURRENCIES = ("EUR", "USD", "CNY")
# Two windows (manual runs with the window_end Param), and rows after both that no window may take.
ENDS = ["2026-11-19T18:00:00+00:00", "2026-11-20T18:00:00+00:00"]
STAMPS = ["2026-11-18 20:00:00", "2026-11-19 21:30:00", "2026-11-21 09:00:00"]


def _settlement(
    stack, server, tmp_path, rows_per_stamp: int, retries: int = 0, stamps: list[str] = STAMPS, timezone: str = "UTC"
) -> dict:
    """A source table with rows at each of ``stamps`` (UTC), and a settlement DAG over it parsed and unpaused."""
    name = f"af_{uuid.uuid4().hex[:6]}"
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute("SET time_zone = '+00:00'")  # the stamps and every window bound here are UTC
    cur.execute(
        f"CREATE TABLE {name} (id INT AUTO_INCREMENT PRIMARY KEY, amount DECIMAL(12,2) NOT NULL, "
        "currency CHAR(3) NOT NULL, updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) "
        "ON UPDATE CURRENT_TIMESTAMP(6), KEY (updated_at))"
    )
    for n, stamp in enumerate(stamps):
        cur.execute(f"SET TIMESTAMP = UNIX_TIMESTAMP('{stamp}')")
        cur.executemany(
            f"INSERT INTO {name} (amount, currency) VALUES (%s, %s)",
            [
                (Decimal(f"{n * 1000 + i}.{i % 100:02d}"), CURRENCIES[(i * 7 + n) % 3])
                for i in range(rows_per_stamp + n)
            ],
        )
    cur.execute("SET TIMESTAMP = DEFAULT")
    conn.close()
    dag_id = f"eo_af_{name}"
    pipeline = f"settle-{name}"
    case = {
        "name": name,
        "dag_id": dag_id,
        "pipeline": pipeline,
        "sink": str(tmp_path / "windows"),
        "report": f"{name}_report",
    }
    write_template_dag(
        server.dags,
        dag_id,
        FACTORY,
        {
            "dag_id": dag_id,
            "table": name,
            "cursor_column": "updated_at",
            "group_by": ["currency"],
            "sum_columns": ["amount"],
            "pipeline": pipeline,
            "topic": f"eo-{name}",
            "sink_path": case["sink"],
            "checkpoint_location": str(tmp_path / "checkpoint"),
            "report_table": case["report"],
            # A start date in the future: the scheduler creates no runs of its own; every run here is manual.
            "start_date": "2099-01-01T00:00:00+00:00",
            "safety_lag": 1,
            "spark_conf": jobs.task_spark_conf(stack),
            "retries": retries,
            "timezone": timezone,
        },
    )
    client = server.client
    client.wait_dag(dag_id)
    client.unpause(dag_id)
    return case


def _source_by_window(stack, table: str, ends: list[str]) -> dict[str, dict]:
    """Per window (by its end): the source's rows {id: (amount, currency)} by plain SQL on the cursor column."""
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute("SET time_zone = '+00:00'")
    windows, lower = {}, None
    for end in ends:
        upper = end.replace("T", " ").removesuffix("+00:00")
        where = f"updated_at < '{upper}'" + (f" AND updated_at >= '{lower}'" if lower else "")
        cur.execute(f"SELECT id, amount, currency FROM {table} WHERE {where}")
        windows[end] = {r[0]: (r[1], r[2]) for r in cur.fetchall()}
        lower = upper
    conn.close()
    return windows


def _sink_by_window(path: str) -> dict[str, list[tuple]]:
    """The Delta sink's live rows per window id: [(window_version, id, amount, currency)], one entry per row."""
    found: dict[str, list[tuple]] = {}
    for window_id, version, value in jobs.arrow_rows(
        jobs.delta_live_files(path), ("window_id", "window_version", "record_value")
    ):
        row = json.loads(value)["row"]
        found.setdefault(window_id, []).append((version, int(row["id"]), Decimal(str(row["amount"])), row["currency"]))
    return found


def _report(stack, table: str) -> dict[str, dict[str, tuple]]:
    pg = psycopg2.connect(
        host=stack.HOST, port=stack.POSTGRES_PORT, dbname=stack.DB_NAME, user=stack.DB_USER, password=stack.DB_PASSWORD
    )
    with pg.cursor() as cur:
        cur.execute(f"SELECT window_id, window_version, currency, rows, amount_sum FROM {table}")
        rows = cur.fetchall()
    pg.close()
    report: dict[str, dict[str, tuple]] = {}
    for window_id, version, currency, count, total in rows:
        assert currency not in report.get(window_id, {}), f"{window_id}/{currency} reported twice"
        report.setdefault(window_id, {})[currency] = (version, count, Decimal(total))
    return report


def _assert_once_each(stack, case: dict, ends: list[str] = ENDS) -> dict:
    """Every window in the sink exactly once (0 lost, 0 duplicated vs the source), reported with the source's sums."""
    source = _source_by_window(stack, case["name"], ends)
    sink = _sink_by_window(case["sink"])
    ids = {f"{case['pipeline']}/{case['name']}/{end}": end for end in ends}
    assert set(sink) == set(ids), f"sink windows {sorted(sink)} != {sorted(ids)}"
    report = _report(stack, case["report"])
    assert set(report) == set(ids), f"report windows {sorted(report)} != {sorted(ids)}"
    outcome = {"rows": 0, "lost": 0, "duplicated": 0}
    for window_id, end in ids.items():
        rows = sink[window_id]
        assert {v for v, *_ in rows} == {1}, f"{window_id}: versions {Counter(v for v, *_ in rows)}"
        copies = Counter(key for _, key, _, _ in rows)
        expected = source[end]
        assert expected, f"the source has no rows in {window_id}: the test data is wrong"
        outcome["rows"] += len(expected)
        outcome["lost"] += len(set(expected) - set(copies))
        outcome["duplicated"] += sum(n - 1 for n in copies.values()) + len(set(copies) - set(expected))
        assert {key: (amount, currency) for _, key, amount, currency in rows} == expected, window_id
        # The report's figures against the source's own per-group count and sum.
        groups = {}
        for amount, currency in expected.values():
            count, total = groups.get(currency, (0, Decimal(0)))
            groups[currency] = (count + 1, total + amount)
        assert {c: (n, s) for c, (_, n, s) in report[window_id].items()} == groups, window_id
        assert {v for v, _, _ in report[window_id].values()} == {1}
    assert outcome["lost"] == 0 and outcome["duplicated"] == 0, outcome
    return outcome


def test_load_marked_failed_mid_run_kills_spark_and_retry_settles_once(stack, airflow_server, tmp_path):
    client = airflow_server.client
    case = _settlement(stack, airflow_server, tmp_path, rows_per_stamp=20, retries=1)
    dag_id, driver = case["dag_id"], f"{case['pipeline']}-load"
    run_id = client.trigger(dag_id, conf={"window_end": ENDS[0]})
    deadline, polls = time.monotonic() + 900, 0
    while not processes_matching(driver):  # the Spark driver of this load is up (ps, not the REST API: fast)
        assert time.monotonic() < deadline, "the load's Spark driver never started"
        polls += 1
        if polls % 25 == 0:
            state = client.task_instance(dag_id, run_id, "load_window")["state"]
            assert state in (None, "scheduled", "queued", "running"), (
                f"load_window {state} before its driver was seen: {processes_matching('spark')}"
            )
        time.sleep(0.2)
    started = time.monotonic()
    assert client.task_instance(dag_id, run_id, "load_window")["state"] == "running"
    time.sleep(max(0.0, started + 3 - time.monotonic()))  # mid-run: a load takes well over 3 s of Spark
    assert processes_matching(driver), "the load's Spark driver ended before it could be marked failed"
    client.mark(dag_id, run_id, "load_window", "failed")  # the UI's "Mark as failed" on a running task
    deadline = time.monotonic() + 120
    while left := processes_matching(driver):  # on_kill must stop spark-submit, the JVM and the Python driver
        assert time.monotonic() < deadline, "processes left after mark-failed:\n" + "\n".join(left)
        time.sleep(1)
    client.wait_run(dag_id, run_id, state="failed", timeout=300)
    assert client.task_instance(dag_id, run_id, "load_window")["state"] == "failed"
    killed = client.task_log(dag_id, run_id, "load_window")
    assert "shouldn't be running anymore" in killed and "Sending kill signal to spark-submit" in killed, (
        "the task was not killed through on_kill"
    )

    # The retry: the UI's "Clear" on the failed task (and downstream) reruns it from the committed state.
    client.clear(dag_id, run_id, ["load_window"])
    client.wait_run(dag_id, run_id, timeout=1500)
    assert client.task_instance(dag_id, run_id, "load_window")["try_number"] == 2
    run_id = client.trigger(dag_id, conf={"window_end": ENDS[1]})
    client.wait_run(dag_id, run_id, timeout=1500)
    _assert_once_each(stack, case)


# Europe/Berlin leaves summer time on 2026-10-25 at 03:00 CEST (01:00 UTC): the nightly 02:00 interval that ends
# that night is 25 hours long, and 02:00-03:00 local happens twice. Rows sit in both passes of that hour, at the
# instant a window ends (it belongs to the next window) and after the last window (no window may take it).
DST_STAMPS = [
    "2026-10-24 06:00:00",
    "2026-10-25 00:30:00",
    "2026-10-25 01:00:00",
    "2026-10-25 01:30:00",
    "2026-10-26 00:59:59",
    "2026-10-26 01:00:00",
]
DST_ENDS = ["2026-10-25T01:00:00+00:00", "2026-10-26T01:00:00+00:00"]


def test_backfill_across_the_dst_change_settles_each_night_once_and_a_cleared_extract_adds_nothing(
    stack, airflow_server, tmp_path
):
    client = airflow_server.client
    case = _settlement(stack, airflow_server, tmp_path, rows_per_stamp=4, stamps=DST_STAMPS, timezone="Europe/Berlin")
    dag_id = case["dag_id"]
    # the intervals starting 2026-10-24 02:00 CEST and 2026-10-25 02:00 CET (the second pass of 02:00)
    backfill = client.backfill(dag_id, "2026-10-24T00:00:00Z", "2026-10-25T01:00:00Z")
    deadline = time.monotonic() + 2400
    while True:  # the scheduler runs the backfill's runs one after the other, oldest first
        runs = [r for r in client.runs(dag_id) if r["run_type"] == "backfill"]
        if len(runs) == len(DST_ENDS) and all(r["state"] == "success" for r in runs):
            break
        failed = [r for r in runs if r["state"] == "failed"]
        assert not failed, client.describe(dag_id, failed[0]["dag_run_id"])
        assert time.monotonic() < deadline, f"backfill {backfill['id']} not done: {[r['state'] for r in runs]}"
        time.sleep(5)
    intervals = sorted(
        (
            datetime.fromisoformat(r["data_interval_start"].replace("Z", "+00:00")),
            datetime.fromisoformat(r["data_interval_end"].replace("Z", "+00:00")),
        )
        for r in runs
    )
    assert [end.isoformat() for _, end in intervals] == DST_ENDS, intervals
    hours = [(end - start).total_seconds() / 3600 for start, end in intervals]
    assert hours == [25, 24], hours  # the night the clocks go back is one hour longer
    first = _assert_once_each(stack, case, DST_ENDS)
    log_files = sorted((Path(case["sink"]) / "_delta_log").glob("*.json"))

    # The UI's "Clear" on the first night's extract (and downstream), after the second night was settled.
    first_run = min(runs, key=lambda r: r["data_interval_end"])["dag_run_id"]
    cleared = client.clear(dag_id, first_run, ["extract_window"])
    assert {t["task_id"] for t in cleared} >= {"extract_window", "load_window", "settlement_report"}, cleared
    client.wait_run(dag_id, first_run, timeout=1500)
    extract = client.task_instance(dag_id, first_run, "extract_window")
    assert extract["try_number"] == 2 and extract["state"] == "success", extract
    assert "is already committed" in client.task_log(dag_id, first_run, "extract_window"), (
        "the rerun extract did not find its window in the ledger"
    )
    assert _assert_once_each(stack, case, DST_ENDS) == first
    after = sorted((Path(case["sink"]) / "_delta_log").glob("*.json"))
    assert after == log_files, "the rerun of a committed window wrote to the sink again"
