"""An Airflow task SIGKILLed between producing its window and committing it with the ledger, then retried.

``airflow dags test`` of the settlement DAG (real Airflow, real MariaDB, real Kafka) runs the watermark
extraction while a writer inserts and updates rows and holds transactions open. The task process dies at the
named step ``before_commit``: every record of the window is flushed to Kafka inside the open transaction, the
ledger record with it, nothing committed. The retry (the same DAG run again, as a retry or a UI clear does)
reads the ledger, finds no window, extracts and commits it. The oracle: nothing from the killed attempt is
visible to read_committed, no source version (id, cursor) is published twice, and every final source row below
the committed window's upper bound is published with exactly its final version.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from exactly_once_provider.kafka.offsets import read_committed_offset
from tests.fault_support import ConcurrentWriter, check
from tests.kafka_support import committed_now, new_topic, read_all
from tests.mysql_support import connect, unique_name

AIRFLOW = str(Path(sys.executable).parent / "airflow")
INITIAL = 300


def _dags_test(airflow_home: dict, logical_date: str, conf: dict, fault: str | None = None):
    env = {**airflow_home, **({"EO_FAULT_AT": fault} if fault else {})}
    if not fault:
        env.pop("EO_FAULT_AT", None)
    return subprocess.run(
        [AIRFLOW, "dags", "test", "eo_watermark_settlement", logical_date, "--conf", json.dumps(conf)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize("fault", ["before_commit:1", pytest.param("produced:1", marks=pytest.mark.matrix)])
def test_settlement_task_killed_before_its_commit_then_retried_publishes_every_version_once(
    stack, airflow_home, fault, fault_outcome
):
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    table, topic, pipeline = unique_name("wm_kill"), new_topic(bootstrap), f"wm-kill-{uuid.uuid4().hex[:6]}"
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(
        f"CREATE TABLE `{table}` (id BIGINT PRIMARY KEY, v INT NOT NULL, s VARCHAR(8) NOT NULL, updated_at "
        "TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6), KEY (updated_at))"
    )
    cur.executemany(
        f"INSERT INTO `{table}` (id, v, s) VALUES (%s, %s, 'init')", [(i, i) for i in range(1, INITIAL + 1)]
    )
    conf = {"table": table, "topic": topic, "pipeline": pipeline, "safety_lag": 0.5, "reextract": False}
    # An interval that ends in the future: the window's upper bound is the DB clock minus the lag (or an open
    # transaction's start), so the writer's rows fall on both sides of it.
    logical_date = (
        (datetime.now(UTC) + timedelta(days=1)).replace(hour=18, minute=0, second=0, microsecond=0).isoformat()
    )
    writer = ConcurrentWriter(
        stack, table, first_new_id=10**6, existing=INITIAL, deletes=False, pause=0.01, long_every=30
    ).start()
    try:
        time.sleep(1)
        killed = _dags_test(airflow_home, logical_date, conf, fault)
        output = killed.stdout + killed.stderr
        assert killed.returncode == -signal.SIGKILL, f"the task was not killed at {fault}:\n{output[-4000:]}"
        uncommitted = read_all(bootstrap, topic, "read_uncommitted")
        assert len(uncommitted) > INITIAL, "the kill did not happen inside the window's transaction"
        assert read_all(bootstrap, topic) == [], "the killed attempt's window is visible to read_committed"
        # as of now: the product's read would wait 60 s for the killed transaction to time out
        assert committed_now(bootstrap, "eo-offsets", pipeline, table) is None

        retry = _dags_test(airflow_home, logical_date, conf)  # the retry: same run, same window name
        assert retry.returncode == 0, (retry.stdout + retry.stderr)[-4000:]
    finally:
        ops = writer.stop()
    assert ops > 50, f"the writer made only {ops} changes"
    ledger = read_committed_offset({"bootstrap.servers": bootstrap}, pipeline, table, "eo-offsets")
    assert len(ledger.offset["history"]) == 1, "the killed attempt must not leave a window in the ledger"
    upper = ledger.offset["next_lower"]

    # The oracle, within the committed window: every source row whose current version is below the upper bound
    # is published once with exactly that version; no source version is published twice.
    records = [json.loads(v) for v in read_all(bootstrap, topic)]
    data = [r for r in records if "marker" not in r]
    versions = [(r["row"]["id"], r["cursor"]) for r in data]
    assert all(cursor < upper for _, cursor in versions), "a published version is above the window's upper bound"
    cur.execute(
        f"SELECT id, v, s, DATE_FORMAT(updated_at, '%%Y-%%m-%%d %%H:%%i:%%s.%%f') FROM `{table}` WHERE updated_at < %s",
        (upper,),
    )
    source = [tuple(row) for row in cur.fetchall()]
    in_window = {row[0] for row in source}
    published = [
        (r["row"]["id"], r["row"]["v"], r["row"]["s"], r["cursor"]) for r in data if r["row"]["id"] in in_window
    ]
    check(fault_outcome, source, published, "rows", duplicated_versions=len(versions) - len(set(versions)))
    assert len(source) > INITIAL, "the window should hold the seed rows and some of the writer's"
    cur.execute(f"DROP TABLE `{table}`")
    conn.close()
