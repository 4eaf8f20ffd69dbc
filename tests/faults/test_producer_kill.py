"""SIGKILL the producing process (or the broker) mid-transaction, restart: every record exactly once.

The producing process is a real subprocess running the operator; it dies at a named step of its N-th
transaction (``EO_FAULT_AT``). A second run resumes from the offsets ledger. Then everything is read with
read_committed and compared with the source sequence: same multiset (no loss, no duplicate) and, per key,
the source order.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

from exactly_once_provider.kafka.offsets import read_committed_offset
from tests.fault_support import check
from tests.kafka_support import committed_now, new_topic, read_all

SCRIPT = Path(__file__).with_name("producer_process.py")
REPO = Path(__file__).resolve().parents[2]
RECORDS = 5000
PARTITIONS = 3


def _start(env_extra: dict, topic: str, ledger: str, pipeline: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), **env_extra}
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), topic, ledger, pipeline, str(RECORDS), "1000"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _run(env_extra: dict, topic: str, ledger: str, pipeline: str) -> tuple[int, str]:
    process = _start(env_extra, topic, ledger, pipeline)
    output, _ = process.communicate(timeout=300)
    return process.returncode, output


def _assert_exactly_once(bootstrap: str, topic: str, fault_outcome) -> None:
    """The oracle: read_committed holds source records 1..RECORDS once each, per key in source order."""
    values = [int(v) for v in read_all(bootstrap, topic, partitions=PARTITIONS)]
    check(fault_outcome, range(1, RECORDS + 1), values, "records")
    per_key: dict[int, list[int]] = defaultdict(list)
    for value in values:  # read_all preserves each partition's order; a key lives in one partition
        per_key[value % 7].append(value)
    for key, sequence in per_key.items():
        assert sequence == sorted(sequence), f"key k{key} out of source order"


# The default suite keeps the two kills that matter most: inside a flushed, uncommitted transaction, and right
# after a commit (the ledger moved, the process never learned it). The others run in make faults-matrix.
@pytest.mark.parametrize(
    "fault",
    [
        pytest.param("mid_produce:2", marks=pytest.mark.matrix),
        pytest.param("produced:2", marks=pytest.mark.matrix),
        "before_commit:2",
        "after_commit:2",
        pytest.param("before_commit:5", marks=pytest.mark.matrix),
    ],
)
def test_producer_sigkill_then_restart_holds_every_record_exactly_once(
    stack, airflow_connections, fault, fault_outcome
):
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic, ledger, pipeline = (
        new_topic(bootstrap, PARTITIONS),
        f"ledger-{uuid.uuid4().hex[:8]}",
        f"kill-{uuid.uuid4().hex[:6]}",
    )

    code, output = _run({"EO_FAULT_AT": fault}, topic, ledger, pipeline)
    assert code == -signal.SIGKILL, f"the producer was not killed at {fault}:\n{output[-3000:]}"
    step, nth = fault.split(":")
    # as of now, without waiting 60 s for the killed transaction to time out (the restart's fencing ends it)
    committed_before_restart = committed_now(bootstrap, ledger, pipeline, "0")
    expected = 1000 * (int(nth) if step == "after_commit" else int(nth) - 1)
    assert (committed_before_restart.offset if committed_before_restart else 0) == expected
    if step in ("produced", "before_commit"):  # flushed: the open transaction is in the log, unseen
        uncommitted = read_all(bootstrap, topic, "read_uncommitted", partitions=PARTITIONS)
        assert len(uncommitted) > expected, "the kill did not happen inside a transaction"
        assert len(read_all(bootstrap, topic, partitions=PARTITIONS)) == expected

    code, output = _run({}, topic, ledger, pipeline)
    assert code == 0, output[-3000:]
    result = json.loads(output.split("RESULT ", 1)[1])
    assert (result["resumed_after"] or 0, result["committed_offset"]) == (expected or 0, RECORDS)
    assert result["records"] == RECORDS - expected
    _assert_exactly_once(bootstrap, topic, fault_outcome)


@pytest.mark.slow
@pytest.mark.exclusive  # restarts the shared broker
def test_broker_sigkill_during_a_transaction_loses_and_duplicates_nothing(
    stack, airflow_connections, tmp_path, fault_outcome
):
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic, ledger, pipeline = (
        new_topic(bootstrap, PARTITIONS),
        f"ledger-{uuid.uuid4().hex[:8]}",
        f"broker-kill-{uuid.uuid4().hex[:6]}",
    )
    marker = tmp_path / "paused"
    # The single test broker recovers every partition of the shared stack after a SIGKILL (thousands once the
    # suite has run: measured ~60 s in a CI rehearsal). A restart that outlasts transaction.timeout.ms lets the
    # coordinator time the transaction out on stale metadata and skip its end markers, a Kafka bug that hangs
    # the partition (docs/pitfalls.md#kafka, "end marker can be skipped"); the documented way to keep it away is a
    # timeout the restart stays well within, as here.
    timeout = {"EO_TEST_TRANSACTION_TIMEOUT_MS": "300000"}
    process = _start(
        {"EO_FAULT_AT": "mid_produce:3", "EO_FAULT_ACTION": "pause:3", "EO_FAULT_FILE": str(marker), **timeout},
        topic,
        ledger,
        pipeline,
    )
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert process.poll() is None and time.monotonic() < deadline, "the producer never reached its pause"
        time.sleep(0.05)
    # Transaction 3 is open with half its records sent; kill the broker under it and bring it back.
    stack.process_by_name("kafka").kill()
    time.sleep(2)
    stack.start_by_name("kafka")
    output, _ = process.communicate(timeout=300)
    attempts = [process.returncode]
    if process.returncode != 0:
        # The task failed with a clear error; an Airflow retry resumes from the ledger.
        assert "Traceback" in output or "Error" in output, output[-3000:]
        code, output = _run(timeout, topic, ledger, pipeline)
        attempts.append(code)
    recoveries = [line for line in output.splitlines() if "replay" in line or "fatally" in line or "retriable" in line]
    print(f"producer exit codes: {attempts}; recoveries: {recoveries}")
    assert attempts[-1] == 0, output[-3000:]
    assert read_committed_offset({"bootstrap.servers": bootstrap}, pipeline, "0", ledger).offset == RECORDS
    _assert_exactly_once(bootstrap, topic, fault_outcome)
