"""SIGKILL the streaming job's driver mid-batch, several times, per sink: the restarts end in the exact result.

Kill points: right after the sink commit of batch 1 and before Spark's checkpoint commit of it (the replay must
be recognised and skipped), right before the sink commit of batch 3, and at a random instant of a running job
(an external SIGKILL of the whole process group). A last run finishes the input (in the test's Spark session: a
restart reads what the dead drivers left, and another spark-submit would only add its start-up); the sink must
then hold every committed record exactly once and no aborted one. The "short" chain (default suite) has only the first kill.
"""

from __future__ import annotations

import re
import time

import pytest

from tests import spark_job_support as jobs
from tests.fault_support import check
from tests.integration.spark_jobs.test_kafka_to_sink import (
    SINKS,
    checkpoint_for,
    checkpoint_has,
    reader_for,
    s3_settings_for,
    sink_state,
    target_for,
)
from tests.kafka_support import new_topic

pytestmark = pytest.mark.slow


def killed(result) -> bool:
    return result.returncode in (-9, 137)


# The default suite keeps the kill that matters most (between the sink commit and Spark's checkpoint commit)
# on Delta, then the run that finishes; every sink's full chain of kills runs in make faults-matrix, and so do
# the Delta sink's on MinIO (delta-s3: the table and the checkpoint in the bucket).
@pytest.mark.parametrize(
    "sink,chain",
    [("delta", "short")]
    + [pytest.param(s, "full", marks=pytest.mark.matrix) for s in (*SINKS, "delta-s3")]
    + [pytest.param("delta-s3", "short", marks=pytest.mark.matrix)],
)
def test_driver_sigkilled_mid_batch_then_restarted_gives_the_exact_result(
    stack, spark, airflow_connections, tmp_path, caplog, sink, chain, fault_outcome
):
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap, partitions=2)
    location = target_for(sink, tmp_path, topic, stack)
    checkpoint = checkpoint_for(sink, tmp_path, topic, stack)
    pipeline = f"fault-{topic}"  # the PostgreSQL offsets table is shared by every test run: unique names
    s3 = s3_settings_for(sink)
    args = jobs.job_args(
        stack,
        pipeline,
        topic,
        checkpoint,
        sink.removesuffix("-s3"),
        location,
        max_offsets=60,
        s3=s3.to_json() if s3 else None,
    )
    target, sink = reader_for(sink, location, s3), sink.removesuffix("-s3")
    log = tmp_path / "job.log"
    committed = jobs.produce_interleaved(bootstrap, topic, transactions=9, per_transaction=40, partitions=2)

    # 1. Killed between the sink commit of batch 1 and the checkpoint commit of batch 1.
    run = jobs.run_job(stack, args, jobs.kill_driver_at("after_sink_commit", 1), log_file=log)
    assert killed(run), f"expected a SIGKILL, got {run.returncode}:\n{run.stdout[-3000:]}"
    assert sink_state(stack, sink, target, pipeline).batch_id == 1
    assert checkpoint_has(checkpoint, "offsets/1", s3) and not checkpoint_has(checkpoint, "commits/1", s3)

    replay_skipped = r"batch 1 already committed to the \w+ sink \(replay after a crash\): skipped"
    if chain == "full":
        # 2. Restart: batch 1 is replayed by Spark and skipped by the sink; killed before the sink commit of batch 3.
        run = jobs.run_job(stack, args, jobs.kill_driver_at("before_sink_commit", 3), log_file=log)
        assert killed(run), f"expected a SIGKILL, got {run.returncode}:\n{run.stdout[-3000:]}"
        assert re.search(replay_skipped, run.stdout)
        assert sink_state(stack, sink, target, pipeline).batch_id == 2

        # 3. External SIGKILL of the whole driver process group at a random instant after the next commit.
        run_log = tmp_path / "run3.log"
        proc = jobs.start_job(stack, args, run_log)
        jobs.wait_for_log(run_log, "batch 3 committed")
        time.sleep(0.7)
        jobs.sigkill_group(proc)
        assert proc.returncode in (-9, 137)
        partial = jobs.sink_rows(stack, sink, target)
        assert len(partial) < len(committed), "the kill came too late to interrupt the job"

    # 4. The last run finishes (in this process's Spark session): exactly the committed input, offsets at the end.
    state, logged = jobs.run_in_session(args, caplog)
    if chain == "short":
        assert re.search(replay_skipped, logged), logged[-3000:]
    assert state["offsets"] == {topic: {str(p): o for p, o in jobs.end_offsets(bootstrap, topic, 2).items()}}
    assert state["rows_total"] == len(committed)
    rows = jobs.sink_rows(stack, sink, target)
    # By source version (key, value); an aborted record in the sink counts as unexpected.
    check(fault_outcome, committed, [(key, value) for _, _, key, value in rows], "records")
    jobs.assert_exactly(rows, committed)


@pytest.mark.matrix
def test_window_mode_driver_killed_between_sink_and_checkpoint_commit_settles_each_window_once(
    stack, spark, airflow_connections, tmp_path, caplog, fault_outcome
):
    """Window mode, Delta: SIGKILL right after the sink commit of batch 1, restart: one copy per window, v2 wins."""
    from tests.integration.spark_jobs.test_kafka_to_sink_window import Source, assert_windows, window_rows

    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap, partitions=2)
    source = Source(stack, topic, f"ledger-{topic}")
    target = str(tmp_path / "delta-sink")
    args = jobs.job_args(
        stack, f"winfault-{topic}", topic, tmp_path / "checkpoint", "delta", target, max_offsets=10, mode="window"
    )
    source.insert("d1", 6)
    source.extract("d1")
    source.insert("d2", 4)
    source.extract("d2")
    source.update("d1", 2)
    source.extract("d1", reextract=True)
    jobs.wait_for_committed_end(bootstrap, topic, 2)

    run = jobs.run_job(stack, args, jobs.kill_driver_at("after_sink_commit", 1))
    assert killed(run), f"expected a SIGKILL, got {run.returncode}:\n{run.stdout[-3000:]}"
    _, logged = jobs.run_in_session(args, caplog)  # the restart, in this process's Spark session
    # batch 1 committed a carry (a window cut by the read), so the checkpoint disagrees and is set aside
    assert re.search(r"batch 1 already committed|disagrees with the sink", logged), logged[-3000:]
    rows = window_rows(stack, "delta", target)
    expected = source.rows()
    fault_outcome(
        rows=len(rows),
        lost=max(0, sum(expected.values()) - len(rows)),
        duplicated=max(0, len(rows) - sum(expected.values())),
    )
    assert_windows(rows, expected, {f"settle/{source.table}/d1": 2, f"settle/{source.table}/d2": 1})
