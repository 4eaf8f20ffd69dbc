"""SIGKILL the full-load process (a real subprocess with its Spark JVM) mid-load, then rerun.

Asserts: nothing is visible in the sink before the publish; the rerun resumes at the unfinished chunks
(finished chunks keep their staged wave and snapshot position, they are not read again); no chunk or row is
duplicated; the sink equals the source; the publish is one Delta commit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from exactly_once_provider import delta_commit
from exactly_once_provider.full_load.__main__ import RESULT_PREFIX
from exactly_once_provider.full_load.staging import Staging
from tests.mysql_support import assert_same_rows, connect, sink_rows, source_rows, unique_name

CHUNKS = 8


def _command(stack, table, sink):
    return [sys.executable, "-m", "exactly_once_provider.full_load", "--schema", stack.DB_NAME, "--table", table,
            "--sink", sink, "--chunk-rows", "500", "--chunks-per-job", "1", "--master", "local[2]",
            "--conf", f"spark.jars={stack.spark_conf()['spark.jars']}", "--conf", "spark.ui.enabled=false",
            "--conf", "spark.driver.memory=1g"]


def test_sigkill_mid_load_then_rerun_resumes_at_unfinished_chunks(stack, airflow_connections, spark, tmp_path):
    table = unique_name("fl_kill")
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE `{table}` (id INT PRIMARY KEY, v VARCHAR(32) NOT NULL)")
    cur.executemany(f"INSERT INTO `{table}` VALUES (%s, %s)", [(i, f"row-{i}") for i in range(500 * CHUNKS - 1)])
    sink = str(tmp_path / "sink")
    staging = Staging(sink + "._eo_full_load")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    log = open(tmp_path / "first.log", "w")
    proc = subprocess.Popen(_command(stack, table, sink), env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        done: dict = {}
        while time.monotonic() < deadline and proc.poll() is None:
            assert not Path(sink, "_delta_log").exists(), "the sink became visible before the publish"
            manifest = staging.load()
            done = (manifest or {}).get("done", {})
            if len(done) >= 2:
                break
            time.sleep(0.2)
        assert proc.poll() is None, f"the load ended before it could be killed:\n{(tmp_path / 'first.log').read_text()}"
        assert 2 <= len(done) < CHUNKS, done
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its Spark JVM, no chance to clean up
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    before = staging.load()["done"]
    assert 2 <= len(before) < CHUNKS
    assert not Path(sink, "_delta_log").exists(), "the killed load published a partial table"

    rerun = subprocess.run(_command(stack, table, sink), env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    (line,) = [x for x in rerun.stdout.splitlines() if x.startswith(RESULT_PREFIX)]
    result = json.loads(line.removeprefix(RESULT_PREFIX))
    assert result["chunks_resumed"] == len(before)
    assert result["chunks_read"] == CHUNKS - len(before)
    after = staging.load()["done"]
    assert sorted(map(int, after)) == list(range(CHUNKS))
    for index, entry in before.items():  # finished chunks were not read again
        assert after[index] == entry
    assert [version for version, _ in delta_commit.commits(sink)] == [0]
    assert_same_rows(sink_rows(spark, sink, ["id", "v"]), source_rows(stack, table, ["id", "v"]), ["id", "v"])
    cur.execute(f"DROP TABLE `{table}`")
    conn.close()
