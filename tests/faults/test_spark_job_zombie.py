"""A zombie driver of an OLDER checkpoint wakes up after a new driver committed its batch: it must commit nothing.

Driver A pauses right before the sink commit of batch 2 (it has read the sink's state and planned the batch on
it). Its checkpoint is then lost to the next run (driver B gets a new checkpoint, so a new checkpoint id and
txn app id: the per-checkpoint fences cannot tell the two apart), and B reads the whole input from the sink's
offsets and commits it. A wakes up and tries to commit batch 2 on top: the sink's predecessor check
(``batch.require_predecessor``, inside each sink's atomic step) refuses it. Without that check A's rows were
committed a second time. The sink must hold every committed record exactly once.
"""

from __future__ import annotations

import time

import pytest

from tests import spark_job_support as jobs
from tests.fault_support import check
from tests.integration.spark_jobs.test_kafka_to_sink import (
    SINKS,
    checkpoint_for,
    reader_for,
    s3_settings_for,
    sink_state,
    target_for,
)
from tests.kafka_support import new_topic

pytestmark = pytest.mark.slow


def _wait_for(path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout}s"
        time.sleep(0.2)


# The default suite runs the Delta sink (its own put-if-absent commit); every sink runs in make faults-matrix, and
# the Delta sink on MinIO (delta-s3: the table and both checkpoints in the bucket).
@pytest.mark.parametrize(
    "sink", ["delta"] + [pytest.param(s, marks=pytest.mark.matrix) for s in (*SINKS, "delta-s3") if s != "delta"]
)
def test_a_zombie_of_an_older_checkpoint_commits_nothing_after_the_next_run(
    stack, spark, airflow_connections, tmp_path, caplog, sink, fault_outcome
):
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap, partitions=2)
    location = target_for(sink, tmp_path, topic, stack)
    s3 = s3_settings_for(sink)
    checkpoint_a = checkpoint_for(sink, tmp_path, topic, stack, "checkpoint-a")
    checkpoint_b = checkpoint_for(sink, tmp_path, topic, stack, "checkpoint-b")
    target, kind = reader_for(sink, location, s3), sink.removesuffix("-s3")
    secrets = {"s3": s3.to_json()} if s3 else {}
    pipeline = f"zombie-{topic}"  # the PostgreSQL offsets table is shared by every test run: unique names
    committed = jobs.produce_interleaved(bootstrap, topic, transactions=6, per_transaction=40, partitions=2)
    paused = tmp_path / "zombie-paused"

    # A: batches 0 and 1 commit, then A stops right before committing batch 2 (it planned it on batch 1).
    zombie_log = tmp_path / "zombie.log"
    zombie = jobs.start_job(
        stack,
        jobs.job_args(stack, pipeline, topic, checkpoint_a, kind, location, max_offsets=60, **secrets),
        zombie_log,
        {"EO_FAULT_AT": "before_sink_commit_2", "EO_FAULT_ACTION": "pause:600", "EO_FAULT_FILE": str(paused)},
    )
    try:
        _wait_for(paused)
        assert sink_state(stack, kind, target, pipeline).batch_id == 1

        # B (in this process's Spark session, while A waits in its own): A's checkpoint is not there for it (a
        # new checkpoint), so it starts from the sink and commits everything.
        state, logged = jobs.run_in_session(
            jobs.job_args(stack, pipeline, topic, checkpoint_b, kind, location, max_offsets=60, **secrets), caplog
        )
        assert "starting from the sink's committed offsets" in logged, logged[-3000:]
        jobs.assert_exactly(jobs.sink_rows(stack, kind, target), committed)

        # A wakes up and tries to commit its batch 2: refused, nothing written.
        paused.unlink()
        assert zombie.wait(240) != 0, "the zombie's late commit must fail"
    finally:
        if zombie.poll() is None:
            jobs.sigkill_group(zombie)
    text = zombie_log.read_text(errors="replace")
    assert "StaleBatchError" in text and "another driver commits this" in text, text[-3000:]
    assert sink_state(stack, kind, target, pipeline).to_json() == state
    rows = jobs.sink_rows(stack, kind, target)
    check(fault_outcome, committed, [(key, value) for _, _, key, value in rows], "records")
    jobs.assert_exactly(rows, committed)
