"""A zombie: an attempt of the producing task still runs while its retry starts with the same transactional id.

The zombie (a real subprocess running the operator) stops inside its 3rd transaction with every record flushed
but not committed, the way a task looks to Airflow when its heartbeat is lost. The retry starts beside it: its
``init_transactions`` bumps the epoch of the id, which aborts the zombie's open transaction; it resumes from
the ledger and finishes. Then the zombie wakes up and tries to commit: it must be fenced (clear error, non-zero
exit) and nothing it wrote may become visible. The topic then holds the source exactly once.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from exactly_once_provider.kafka.offsets import read_committed_offset
from tests.faults.test_producer_kill import PARTITIONS, RECORDS, _assert_exactly_once, _run, _start
from tests.kafka_support import new_topic, read_all


@pytest.mark.parametrize("zombie_at", ["produced:3", pytest.param("before_commit:3", marks=pytest.mark.matrix)])
def test_zombie_with_the_same_transactional_id_is_fenced_and_the_output_is_exact(
    stack, airflow_connections, tmp_path, zombie_at, fault_outcome
):
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic, ledger, pipeline = (
        new_topic(bootstrap, PARTITIONS),
        f"ledger-{uuid.uuid4().hex[:8]}",
        f"zombie-{uuid.uuid4().hex[:6]}",
    )
    marker = tmp_path / "paused"
    zombie = _start(
        {"EO_FAULT_AT": zombie_at, "EO_FAULT_ACTION": "pause:120", "EO_FAULT_FILE": str(marker)},
        topic,
        ledger,
        pipeline,
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert zombie.poll() is None and time.monotonic() < deadline, (
                f"the zombie never reached its pause:\n{zombie.stdout.read()[-3000:] if zombie.poll() else ''}"
            )
            time.sleep(0.05)
        # The zombie's 3rd transaction is in the log, uncommitted; 2 are committed.
        assert len(read_all(bootstrap, topic, "read_uncommitted", partitions=PARTITIONS)) > 2000
        code, output = _run({}, topic, ledger, pipeline)  # the retry, while the zombie is alive
        assert code == 0, output[-3000:]
        result = json.loads(output.split("RESULT ", 1)[1])
        assert (result["resumed_after"], result["committed_offset"]) == (2000, RECORDS)
    finally:
        marker.unlink(missing_ok=True)  # wake the zombie up
    zombie_output, _ = zombie.communicate(timeout=180)
    assert zombie.returncode not in (0, None), f"the zombie was not stopped:\n{zombie_output[-3000:]}"
    assert "ProducerFencedError" in zombie_output and "was fenced: a newer writer" in zombie_output, zombie_output[
        -3000:
    ]
    assert "RESULT " not in zombie_output
    assert read_committed_offset({"bootstrap.servers": bootstrap}, pipeline, "0", ledger).offset == RECORDS
    _assert_exactly_once(bootstrap, topic, fault_outcome)
