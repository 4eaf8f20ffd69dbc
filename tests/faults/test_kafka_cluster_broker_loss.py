"""The 3-broker cluster (RF 3, min ISR 2) loses one broker while the producing task is inside a transaction.

The producing process (a real subprocess running the operator against the cluster) stops inside its 3rd
transaction; the test SIGKILLs a broker (the leader of the data partition holding the open transaction's
records, or the leader of the ledger partition), lets the producer go on with two brokers, and restarts the
killed one after the run. The topic must hold every source record once, per key in order, read with
read_committed, before and after the killed broker is back.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
from confluent_kafka.admin import AdminClient

from exactly_once_provider.kafka.offsets import read_committed_offset
from tests.faults.test_producer_kill import PARTITIONS, RECORDS, _assert_exactly_once, _start
from tests.integration.stack.test_kafka_cluster import cluster  # noqa: F401 - a module fixture: started, stopped
from tests.kafka_support import QUIET, new_topic, read_all

# Matrix only: three more brokers cost the default suite too much; its representative of a broker lost under a
# transaction is tests/integration/stack/test_kafka_cluster.py (and test_producer_kill's single-broker bounce).
pytestmark = [pytest.mark.slow, pytest.mark.matrix, pytest.mark.exclusive]  # 3 more brokers, leader elections


def _leader(bootstrap: str, topic: str, partition: int) -> int:
    metadata = AdminClient({"bootstrap.servers": bootstrap, **QUIET}).list_topics(topic, timeout=30)
    return metadata.topics[topic].partitions[partition].leader


@pytest.mark.parametrize("victim", ["data_leader", "ledger_leader"])
def test_one_broker_of_three_sigkilled_mid_transaction_loses_and_duplicates_nothing(
    stack, cluster, tmp_path, airflow_connections, victim, fault_outcome
):
    bootstrap = ",".join(node.bootstrap for node in cluster)
    topic, ledger, pipeline = (
        new_topic(bootstrap, PARTITIONS, replication_factor=3),
        f"ledger-{uuid.uuid4().hex[:8]}",
        f"cluster-loss-{uuid.uuid4().hex[:6]}",
    )
    conn = json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": bootstrap}})
    marker = tmp_path / "paused"
    process = _start(
        {
            "AIRFLOW_CONN_KAFKA_DEFAULT": conn,
            "EO_FAULT_AT": "mid_produce:3",
            "EO_FAULT_ACTION": "pause:120",
            "EO_FAULT_FILE": str(marker),
        },
        topic,
        ledger,
        pipeline,
    )
    killed = None
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            if process.poll() is not None:
                raise AssertionError(f"the producer exited before its pause:\n{process.communicate()[0][-4000:]}")
            assert time.monotonic() < deadline, "the producer never reached its pause"
            time.sleep(0.05)
        leader = _leader(bootstrap, ledger if victim == "ledger_leader" else topic, 0)
        killed = next(node for node in cluster if node.node_id == leader)
        killed.process.kill()
        marker.unlink()  # transaction 3 goes on with two brokers of three
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, output[-4000:]
        result = json.loads(output.split("RESULT ", 1)[1])
        assert (result["resumed_after"], result["committed_offset"]) == (None, RECORDS)
        assert read_committed_offset({"bootstrap.servers": bootstrap}, pipeline, "0", ledger).offset == RECORDS
        _assert_exactly_once(bootstrap, topic, fault_outcome)
    finally:
        marker.unlink(missing_ok=True)
        if process.poll() is None:
            process.kill()
        if killed is not None:
            stack.start_by_name(killed.name)
    # The restarted broker caught up: it serves the same committed records.
    survivors = read_all(bootstrap, topic, partitions=PARTITIONS)
    assert sorted(int(v) for v in survivors) == list(range(1, RECORDS + 1))
