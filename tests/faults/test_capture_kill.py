"""SIGKILL the binlog capture (a real subprocess) at random points and at named fault points, restart it each
time, while a writer keeps committing; and restart MariaDB under a running capture.

Oracle: replaying the topics equals the source tables row by row; every committed source transaction's
changes are in the topics exactly once (by GTID and index in the transaction); no rolled-back change is.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.capture_support import (
    Writer,
    check_transactions,
    create_tables,
    main_row,
    replay,
    seed,
    source_table,
    topic_records,
)
from tests.mysql_support import connect, unique_name

RUNNER = """
import json, signal, sys
from exactly_once_provider.operators.binlog_capture import BinlogCaptureOperator
op = BinlogCaptureOperator(task_id="capture", **json.loads(sys.argv[1]))
signal.signal(signal.SIGTERM, lambda *_: op.on_kill())  # as Airflow does: stop at a boundary, commit, return
print("RESULT " + json.dumps(op.execute({})), flush=True)
"""


def _capture(
    args: dict, fault: str | None = None, kill_after: float | None = None, timeout: float = 240
) -> tuple[str, dict | None]:
    """Run one capture process; return how it ended (``ok``, ``fault``, ``killed``) and its XCom result."""
    env = {**os.environ, "EO_FAULT_AT": fault or ""}
    proc = subprocess.Popen(
        [sys.executable, "-c", RUNNER, json.dumps(args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        if kill_after is not None:
            try:
                proc.wait(kill_after)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode == -signal.SIGKILL:
        return ("fault" if fault else "killed"), None
    assert proc.returncode == 0, out[-4000:]
    (line,) = [x for x in out.splitlines() if x.startswith("RESULT ")]
    return "ok", json.loads(line.removeprefix("RESULT "))


def _setup(stack):
    main, side = unique_name("kill_main"), unique_name("kill_side")
    conn = connect(stack)
    cur = conn.cursor()
    create_tables(cur, main, side)
    cur.execute("SHOW MASTER STATUS")
    file, pos = cur.fetchone()[:2]
    seed(cur, main, 300)  # captured as inserts: both tables are captured from their creation
    args = {
        "tables": [main, side],
        "pipeline": unique_name("kill"),
        "start_position": f"{file}:{pos}",
        "max_records": 100,
        "commit_interval_ms": 100,
    }
    return conn, main, side, args


def _verify(stack, fault_outcome, main, side, args, writer, extra_committed=(), caught_up: bool = False) -> dict:
    """Catch up with a bounded capture (no fault), compare the topics with the source tables; return its result.

    :param caught_up: the capture under test must already have committed everything: the catch-up adds nothing.
    """
    _, final = _capture({**args, "mode": "bounded"})
    assert not caught_up or final["rows"] == 0, final
    # Schema records (op "ddl") name no row: checked by the schema-change test, left out of the row replay.
    main_records = [r for r in topic_records(stack, final["topics"][f"{stack.DB_NAME}.{main}"]) if r["op"] != "ddl"]
    side_records = [r for r in topic_records(stack, final["topics"][f"{stack.DB_NAME}.{side}"]) if r["op"] != "ddl"]
    assert {k: main_row(v) for k, v in replay({}, main_records).items()} == {
        json.dumps({"id": r["id"]}): main_row(r) for r in source_table(stack, main)
    }
    assert {k: (v["id"], v["main_id"], v["qty"]) for k, v in replay({}, side_records).items()} == {
        json.dumps({"id": r["id"]}): (r["id"], r["main_id"], r["qty"]) for r in source_table(stack, side)
    }
    counts = check_transactions(
        main_records + side_records, [*writer.committed, *extra_committed], writer.rolled_back, 0, {main, side}
    )
    fault_outcome(rows=counts["records"], lost=counts["lost"], duplicated=counts["duplicated"])
    assert counts["lost"] == 0 and counts["duplicated"] == 0, counts
    assert len(writer.committed) > 20
    return final


def _kill_loop(stack, fault_outcome, plan: list[str], seed_value: int) -> None:
    conn, main, side, args = _setup(stack)
    writer = Writer(stack, main, side, seeded=300, reserved=0, seed_value=seed_value, pause=0.02)
    rnd = random.Random(seed_value)
    outcomes = []
    writer.start()
    try:
        for step in plan:
            if step == "random":
                how, _ = _capture({**args, "mode": "continuous", "max_runtime": 60}, kill_after=rnd.uniform(3, 8))
            else:  # a named fault point: the process SIGKILLs itself the n-th time it gets there
                how, _ = _capture(
                    {**args, "mode": "continuous", "max_runtime": 60}, fault=f"{step}:{rnd.randint(1, 3)}"
                )
            outcomes.append((step, how))
    finally:
        writer.stop.set()
        writer.join(30)
    assert writer.error is None, writer.error
    assert all(how in ("killed", "fault") for _, how in outcomes), outcomes
    _verify(stack, fault_outcome, main, side, args, writer)
    conn.cursor().execute(f"DROP TABLE `{main}`, `{side}`")
    conn.close()


def test_capture_sigkilled_between_produce_and_commit_and_right_after_commit(stack, airflow_connections, fault_outcome):
    _kill_loop(stack, fault_outcome, ["before_commit", "after_commit"], seed_value=11)


@pytest.mark.matrix
def test_capture_sigkilled_at_a_schema_change_mid_stream_delivers_it_once(stack, airflow_connections, fault_outcome):
    """The capture dies with an ALTER TABLE read into its open Kafka transaction; the restart reads it again."""
    conn, main, side, args = _setup(stack)
    writer = Writer(stack, main, side, seeded=300, reserved=0, seed_value=31, pause=0.02)
    writer.start()
    try:
        deadline = time.monotonic() + 60
        while len(writer.committed) < 30:
            assert time.monotonic() < deadline and writer.error is None, writer.error
            time.sleep(0.1)
        # Rows that exist take the default without a row event; the writer names its columns, so it goes on.
        conn.cursor().execute(f"ALTER TABLE `{side}` ADD COLUMN tier INT NOT NULL DEFAULT 7")
        committed_before_ddl = len(writer.committed)
        while len(writer.committed) < committed_before_ddl + 30:
            assert time.monotonic() < deadline + 60 and writer.error is None, writer.error
            time.sleep(0.1)
        how, _ = _capture({**args, "mode": "continuous", "max_runtime": 60}, fault="capture_schema_change")
        assert how == "fault"  # it reached the statement and died before committing the transaction holding it
    finally:
        writer.stop.set()
        writer.join(30)
    assert writer.error is None, writer.error
    final = _verify(stack, fault_outcome, main, side, args, writer)
    side_topic = topic_records(stack, final["topics"][f"{stack.DB_NAME}.{side}"])
    schema = [r for r in side_topic if r["op"] == "ddl"]
    assert [r["ddl"] for r in schema] == [f"ALTER TABLE `{side}` ADD COLUMN tier INT NOT NULL DEFAULT 7"], schema
    at = schema[0]["version"]
    rows = [r for r in side_topic if r["op"] != "ddl"]
    assert any(r["version"] < at for r in rows) and any(r["version"] > at for r in rows)
    # Row images before the statement have no such column; every one after it carries the server's value.
    assert all("tier" not in (r["after"] or r["before"]) for r in rows if r["version"] < at)
    assert all((r["after"] or r["before"])["tier"] == 7 for r in rows if r["version"] > at)
    conn.cursor().execute(f"DROP TABLE `{main}`, `{side}`")
    conn.close()


@pytest.mark.matrix
@pytest.mark.slow
def test_capture_sigkilled_twelve_times(stack, airflow_connections, fault_outcome):
    plan = [
        "random",
        "before_commit",
        "random",
        "after_commit",
        "mid_produce",
        "random",
        "before_commit",
        "random",
        "after_commit",
        "random",
        "produced",
        "random",
    ]
    _kill_loop(stack, fault_outcome, plan, seed_value=23)


@pytest.mark.matrix
@pytest.mark.slow
@pytest.mark.exclusive  # restarts the shared MariaDB
def test_mariadb_restarted_under_a_running_capture(stack, airflow_connections, fault_outcome, tmp_path):
    conn, main, side, args = _setup(stack)
    writer = Writer(stack, main, side, seeded=300, reserved=0, seed_value=5, pause=0.02)
    writer.start()
    log = tmp_path / "capture.log"
    proc = _start_capture({**args, "mode": "continuous", "max_runtime": 240, "progress_interval": 0.5}, log)
    try:
        # Mid-stream: the capture has committed a position while the writer is still committing.
        _wait_for(lambda: _positions(log, "committed") and len(writer.committed) > 20, 120, log)
        writer.stop.set()  # the writer's in-doubt commits would have no GTID to check; stop it first
        writer.join(30)
        mariadb = stack.process_by_name("mariadb")
        mariadb.kill()
        assert mariadb.pid() is None
        stack.start_by_name("mariadb")
        restarted = Writer(stack, main, side, seeded=0, reserved=0, seed_value=6, pause=0.02, tag_prefix="r")
        restarted.live, restarted.next_id = set(writer.live), writer.next_id + 100_000
        restarted.side_ids = list(writer.side_ids)
        restarted.start()
        _wait_for(lambda: len(restarted.committed) > 20, 120, log)
        restarted.stop.set()
        restarted.join(30)
        after = connect(stack)
        cursor = after.cursor()
        cursor.execute("SHOW MASTER STATUS")
        end = _position(*cursor.fetchone()[:2])
        after.close()
        # Reconnected: the same capture process reads every change written after the restart.
        _wait_for(lambda: _positions(log, "read up to") and _positions(log, "read up to")[-1] >= end, 120, log)
        proc.send_signal(signal.SIGTERM)  # stop at a boundary and commit what it read (Airflow's on_kill)
        assert proc.wait(120) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    output = log.read_text()
    assert "Binlog stream interrupted" in output, output[-4000:]
    assert [x for x in output.splitlines() if x.startswith("RESULT ")], output[-4000:]
    assert writer.error is None and restarted.error is None, (writer.error, restarted.error)
    writer.rolled_back += restarted.rolled_back
    # ... and committed it: a bounded capture after it finds nothing left to produce.
    _verify(stack, fault_outcome, main, side, args, writer, extra_committed=restarted.committed, caught_up=True)
    conn = connect(stack)
    conn.cursor().execute(f"DROP TABLE `{main}`, `{side}`")
    conn.close()


def _start_capture(args: dict, log) -> subprocess.Popen:
    """Start a capture process that stops cleanly on SIGTERM (the operator's on_kill), its output in ``log``."""
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-c", RUNNER, json.dumps(args)],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )


def _position(file: str, pos) -> tuple[str, int]:
    return file, int(pos)


def _positions(log, label: str) -> list[tuple[str, int]]:
    """The positions the capture's progress lines report after ``label`` ("read up to", "committed"), in order."""
    return [_position(*m.groups()) for m in re.finditer(rf"{label} (binlog\.\d+):(\d+)[;,]", log.read_text())]


def _wait_for(condition, timeout: float, log) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out; capture log:\n{log.read_text()[-4000:]}"
        time.sleep(0.2)
