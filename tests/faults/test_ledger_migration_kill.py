"""SIGKILL the ledger migration at each step, run it again: every pipeline resumes at its exact position.

Three pipelines write numbered records 1..150 through the real writer into a single-partition (legacy)
ledger; the migration runs as a subprocess that SIGKILLs itself at a step (``EO_FAULT_AT``); a second run
finishes (or verifies) it; then each pipeline resumes from the NEW ledger and writes up to 300. The oracle
reads the data topic with read_committed: each pipeline's records 1..300 once each (0 lost, 0 duplicated).
Only the migration subprocess is killed; the broker is never touched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from exactly_once_provider.hooks.kafka_producer import TransactionalProducerHook
from exactly_once_provider.kafka.ledger_migration import migrate_ledger
from exactly_once_provider.kafka.offsets import LedgerMovedError
from exactly_once_provider.kafka.writer import Message
from tests.fault_support import check
from tests.kafka_support import QUIET, new_topic, read_all

REPO = Path(__file__).resolve().parents[2]
BATCH = 10


def _write(pipeline: str, data: str, ledger: str, upto: int) -> int:
    """Resume ``pipeline`` from ``ledger`` and write its records up to ``upto`` in batches; return the resume point."""
    writer = TransactionalProducerHook(
        pipeline=pipeline, delivery_mode="exactly_once", offsets_topic=ledger
    ).open_writer()
    try:
        resume = writer.last_committed.offset if writer.last_committed else 0
        for start in range(resume + 1, upto + 1, BATCH):
            numbers = range(start, min(start + BATCH, upto + 1))
            writer.write_batch(
                data, [Message(f"{pipeline}:{n}".encode(), key=pipeline.encode()) for n in numbers], offset=numbers[-1]
            )
        return resume
    finally:
        writer.close()


# The default suite keeps the kill inside the open transaction and the one after the commit; make faults-matrix
# adds the kill before the fence check.
@pytest.mark.parametrize(
    "step",
    [pytest.param("migration_copied", marks=pytest.mark.matrix), "migration_before_commit", "migration_committed"],
)
def test_migration_killed_at_each_step_loses_and_repeats_nothing(stack, airflow_connections, fault_outcome, step):
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    data, legacy, partitioned = (
        new_topic(bootstrap),
        f"legacy-{uuid.uuid4().hex[:10]}",
        f"ledger-{uuid.uuid4().hex[:10]}",
    )
    # Names of this run only: the steps run on parallel workers, and one pipeline's transactional id on two
    # workers at once fences one writer by the other.
    run = uuid.uuid4().hex[:6]
    pipelines = tuple(f"mig-{name}-{run}" for name in "abc")
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    admin.create_topics([NewTopic(legacy, 1, 1, config={"cleanup.policy": "compact"})])[legacy].result(30)
    for pipeline in pipelines:
        assert _write(pipeline, data, legacy, 150) == 0
    process = subprocess.run(
        [
            sys.executable,
            "-m",
            "exactly_once_provider.kafka.ledger_migration",
            "--bootstrap-servers",
            bootstrap,
            "--quiet-seconds",
            "0",
            legacy,
            partitioned,
        ],
        env={**os.environ, "PYTHONPATH": str(REPO), "EO_FAULT_AT": step},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert process.returncode == -signal.SIGKILL, process.stdout + process.stderr
    assert migrate_ledger({"bootstrap.servers": bootstrap}, legacy, partitioned, quiet_s=0, timeout=60) == 3
    with pytest.raises(LedgerMovedError):
        _write(pipelines[0], data, legacy, 300)  # the old ledger no longer resumes anybody
    for pipeline in pipelines:
        assert _write(pipeline, data, partitioned, 300) == 150  # the exact position, from the new ledger
    got = [v.decode() for v in read_all(bootstrap, data)]
    check(fault_outcome, [f"{p}:{n}" for p in pipelines for n in range(1, 301)], got, "records")
