"""SIGKILL the full-load process (a real subprocess with its Spark JVM) at its fault points while a writer runs.

Kill points: mid-load (an external SIGKILL of the process group after some waves) and after every chunk is
staged but before the publish (right after the Delta commit, before the manifest knows it: the several-tables
test, tests/faults/test_full_load_tables_kill.py, on its table under a writer). Each rerun
resumes: finished chunks keep their staged wave and snapshot position (not read again), nothing is visible in
the sink before the publish, the publish is ONE Delta commit even when it is attempted twice.

The oracle, with writers inserting, updating, deleting and holding transactions open throughout: every chunk
equals the source AS OF its own recorded binlog position (the final table with the binlog's later row events
undone), row by row; no key is loaded twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from exactly_once_provider.full_load.__main__ import RESULT_PREFIX
from exactly_once_provider.full_load.handoff import read_handoff
from exactly_once_provider.full_load.staging import Staging
from exactly_once_provider.sinks import delta_commit
from exactly_once_provider.storage import open_storage
from exactly_once_provider.storage import s3 as s3_module
from tests.fault_support import ConcurrentWriter, check
from tests.integration.provider.full_load.test_full_load_concurrent import _binlog_row_events, _in_chunk, _state_at
from tests.mysql_support import connect, unique_name

CHUNK_ROWS = 500
INITIAL = CHUNK_ROWS * 8 - 1  # 8 chunks, more if the writer's inserts land before the plan


def _command(stack, table, sink, chunks_per_job=1):
    """The standalone load; a sink on S3 (and so its staging next to it) through the ``aws_default`` connection,
    which the process reads itself (no credentials on this command line)."""
    conf = stack.spark_conf(s3=sink.startswith("s3://"))
    return [
        sys.executable,
        "-m",
        "exactly_once_provider.full_load",
        "--schema",
        stack.DB_NAME,
        "--table",
        table,
        "--sink",
        sink,
        "--chunk-rows",
        str(CHUNK_ROWS),
        "--chunks-per-job",
        str(chunks_per_job),
        "--master",
        "local[2]",
        "--aws-conn-id",
        "aws_default",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.driver.memory=1g",
        *[x for k, v in conf.items() for x in ("--conf", f"{k}={v}")],
    ]


def _published(sink: str) -> bool:
    """Whether the sink has a Delta log (a local directory, or objects under ``_delta_log/`` on S3)."""
    if sink.startswith("s3://"):
        return bool(open_storage(sink).list("_delta_log/"))
    return Path(sink, "_delta_log").exists()


def _env(fault: str | None = None) -> dict[str, str]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    env.pop("EO_FAULT_AT", None)
    if fault:
        env["EO_FAULT_AT"] = fault
    return env


def _kill_mid_load(stack, table, sink, staging, log_path):
    """Start the load, SIGKILL its whole process group once 2 chunks are staged; return the finished chunks."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            _command(stack, table, sink), env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            deadline = time.monotonic() + 300
            done: dict = {}
            while time.monotonic() < deadline and proc.poll() is None:
                assert not _published(sink), "the sink became visible before the publish"
                done = (staging.load() or {}).get("done", {})
                if len(done) >= 2:
                    break
                time.sleep(0.2)
            assert proc.poll() is None, f"the load ended before it could be killed:\n{log_path.read_text()[-3000:]}"
            assert 2 <= len(done) < _planned(staging), done
            os.killpg(proc.pid, signal.SIGKILL)  # the driver and its Spark JVM, no chance to clean up
            proc.wait(30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    before = staging.load()["done"]
    assert 2 <= len(before) < _planned(staging)
    return before


def _planned(staging: Staging) -> int:
    """The number of chunks the load planned (the writer's inserts can add chunks beyond CHUNKS)."""
    return len(staging.load()["chunks"])


def _killed_at(stack, table, sink, fault: str, log_path: Path, chunks_per_job: int) -> None:
    """Run the load with ``EO_FAULT_AT=fault``: the driver SIGKILLs itself there; its Spark JVM goes with it."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            _command(stack, table, sink, chunks_per_job),
            env=_env(fault),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = proc.wait(600)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group outlived the driver
            except ProcessLookupError:
                pass
    assert code == -signal.SIGKILL, f"not killed at {fault}: exit code {code}\n{log_path.read_text()[-3000:]}"


# A kill right after the Delta commit (before the manifest knows it) is the several-tables test's
# (test_full_load_tables_kill.py: the table under the writer killed there).
# The default suite keeps the new kill point (every chunk staged, nothing published) with waves of 4 chunks:
# two Spark launches, like the mid-load kill it replaces there. Mid-load kills and their chains: the matrix, also
# with the sink and its staging area on the stack's MinIO (the executors' chunk objects killed mid-upload).
@pytest.mark.parametrize(
    "kills,store",
    [
        (("full_load_before_publish",), "local"),
        pytest.param(("mid_load", "full_load_before_publish"), "local", marks=pytest.mark.matrix),
        pytest.param(("mid_load",), "local", marks=pytest.mark.matrix),
        pytest.param(("mid_load",), "s3", marks=pytest.mark.matrix),
    ],
    ids=lambda v: "+".join(v) if isinstance(v, tuple) else v,
)
def test_full_load_killed_then_rerun_publishes_each_chunk_as_of_its_position(
    stack, airflow_connections, spark, tmp_path, kills, store, fault_outcome, monkeypatch
):
    table = unique_name("fl_kill")
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE `{table}` (id BIGINT PRIMARY KEY, v INT NOT NULL, s VARCHAR(8) NOT NULL)")
    cur.executemany(f"INSERT INTO `{table}` VALUES (%s, %s, 'init')", [(i, i) for i in range(1, INITIAL + 1)])
    sink = str(tmp_path / "sink")
    if store == "s3":  # this process reads the staging manifest and the table's log with the driver's settings
        monkeypatch.setattr(s3_module, "_registered", stack.minio_settings())
        sink = f"s3://{stack.MINIO_BUCKETS[0]}/it-full-load-kill/{uuid.uuid4().hex[:12]}/sink"
    staging = Staging(sink + "._eo_full_load")
    writer = ConcurrentWriter(stack, table, first_new_id=10**7, existing=INITIAL).start()
    try:
        finished: dict = {}
        for kill in kills:
            if kill == "mid_load":
                finished = _kill_mid_load(stack, table, sink, staging, tmp_path / "mid_load.log")
                assert not _published(sink), "the killed load published a partial table"
                continue
            _killed_at(stack, table, sink, kill, tmp_path / f"{kill}.log", 1 if "mid_load" in kills else 4)
            manifest = staging.load()
            assert sorted(map(int, manifest["done"])) == list(range(_planned(staging)))
            for index, entry in finished.items():  # finished chunks were not read again
                assert manifest["done"][index] == entry
            finished = manifest["done"]
            assert manifest["published"] is None
            assert not _published(sink), "killed before the publish, yet the sink is visible"
        rerun = subprocess.run(_command(stack, table, sink), env=_env(), capture_output=True, text=True, timeout=600)
    finally:
        ops = writer.stop()
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    (line,) = [x for x in rerun.stdout.splitlines() if x.startswith(RESULT_PREFIX)]
    result = json.loads(line.removeprefix(RESULT_PREFIX))
    assert result["chunks_resumed"] == len(finished)
    assert result["chunks_read"] == _planned(staging) - len(finished)
    after = staging.load()["done"]
    assert sorted(map(int, after)) == list(range(_planned(staging)))
    for index, entry in finished.items():
        assert after[index] == entry
    assert [version for version, _ in delta_commit.commits(sink)] == [0], "the publish is one Delta commit"

    # The oracle: the source as of each chunk's own position, restricted to the chunk's key range.
    cur.execute(f"SELECT id, v, s FROM `{table}`")
    final = {row[0]: (row[1], row[2]) for row in cur.fetchall()}
    handoff = read_handoff(sink)
    events = _binlog_row_events(stack, table, handoff.min_position)
    assert ops > 50 and sum(1 for at, _ in events if at > handoff.min_position) > 20, (
        f"the writer must change the table during the load ({ops} operations)"
    )
    loaded = [(r.id, r.v, r.s) for r in spark.read.format("delta").load(sink.replace("s3://", "s3a://", 1)).collect()]
    expected = []
    for entry in handoff.chunks:
        expected += [(k, *v) for k, v in _state_at(final, events, entry.position).items() if _in_chunk(k, entry.chunk)]
    check(fault_outcome, expected, loaded)
    assert len(loaded) == len({row[0] for row in loaded}), "a key was loaded twice"
    cur.execute(f"DROP TABLE `{table}`")
    conn.close()
    if store == "s3":
        open_storage(sink.rsplit("/", 1)[0]).delete_prefix("")
