"""The operator on the real broker: resumes from the ledger, fails loudly, returns committed offsets."""

from __future__ import annotations

import uuid

import pytest
from airflow.sdk.exceptions import AirflowException
from confluent_kafka.admin import AdminClient, NewTopic

from exactly_once_provider.kafka.offsets import read_committed_offset
from exactly_once_provider.operators.kafka_produce import SourceRecord, TransactionalProduceOperator
from tests.kafka_support import new_topic, read_all


def numbered(resume_after, last, big_at=None):
    for n in range((resume_after or 0) + 1, last + 1):
        yield SourceRecord(offset=n, key=f"k{n % 7}", value=("x" * 10_000) if n == big_at else str(n))


@pytest.fixture
def bootstrap(stack, airflow_connections):
    return f"{stack.HOST}:{stack.KAFKA_PORT}"


def _operator(topic, ledger, **kwargs):
    kwargs.setdefault("pipeline", f"op-{topic}")  # own transactional id: a test on the other worker never fences it
    kwargs.setdefault("delivery_mode", "exactly_once")
    kwargs.setdefault("producer_function", numbered)
    return TransactionalProduceOperator(
        task_id=f"t{uuid.uuid4().hex[:6]}",
        topic=topic,
        offsets_topic=ledger,
        max_records_per_transaction=1000,
        **kwargs,
    )


def test_produces_in_transactions_and_a_rerun_continues_from_the_committed_offset(bootstrap):
    topic, ledger = new_topic(bootstrap), f"ledger-{uuid.uuid4().hex[:8]}"
    first = _operator(topic, ledger, producer_function_args=(2500,)).execute({})
    assert first["records"] == 2500 and first["transactions"] == 3
    assert first["committed_offset"] == 2500 and first["resumed_after"] is None
    assert first["transactional_id"] == f"eo-txn/op-{topic}/0" and first["partition_offsets"] == {
        "0": 2500 + 2 - 1
    }  # 2 commit markers

    again = _operator(topic, ledger, producer_function_args=(2500,)).execute({})
    assert (again["records"], again["transactions"], again["committed_offset"]) == (0, 0, 2500)

    more = _operator(topic, ledger, producer_function_args=(3100,)).execute({})
    assert (more["resumed_after"], more["records"], more["committed_offset"]) == (2500, 600, 3100)
    assert read_all(bootstrap, topic) == [str(n).encode() for n in range(1, 3101)]


def test_undeliverable_record_fails_the_task_and_its_transaction_stays_invisible(bootstrap):
    ledger, topic = f"ledger-{uuid.uuid4().hex[:8]}", f"small-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the topic exists
    admin.create_topics([NewTopic(topic, 1, 1, config={"max.message.bytes": "4096"})])[topic].result(30)
    # max.message.bytes bounds a whole record batch, so the producer's batch.size must stay below it.
    operator = _operator(
        topic,
        ledger,
        producer_function_args=(2500,),
        producer_function_kwargs={"big_at": 1500},
        producer_config={"batch.size": 2048},
    )
    with pytest.raises(AirflowException, match="not delivered.*MSG_SIZE_TOO_LARGE|not delivered.*TOO_LARGE"):
        operator.execute({})
    # The first transaction (1..1000) committed; nothing of the failed one (1001..2000) is visible.
    assert read_all(bootstrap, topic) == [str(n).encode() for n in range(1, 1001)]
    assert read_committed_offset({"bootstrap.servers": bootstrap}, f"op-{topic}", "0", ledger).offset == 1000


def test_named_batch_is_one_framed_transaction_and_a_rerun_of_it_is_skipped(bootstrap):
    topic, ledger = new_topic(bootstrap), f"ledger-{uuid.uuid4().hex[:8]}"

    def window(resume_after):
        return [SourceRecord(offset="2026-11-20", key=f"acct{i}", value=f"settle-{i}") for i in range(2500)]

    result = _operator(topic, ledger, producer_function=window, batch_id="2026-11-20").execute({})
    assert (result["transactions"], result["records"], result["batch_id"]) == (1, 2500, "2026-11-20")
    rerun = _operator(topic, ledger, producer_function=window, batch_id="2026-11-20").execute({})
    assert rerun["skipped"] is True and rerun["records"] == 0
    again = _operator(topic, ledger, producer_function=window, batch_id="2026-11-20", batch_version=2).execute({})
    assert (again["records"], again["batch_version"]) == (2500, 2)
    values = read_all(bootstrap, topic)
    assert len(values) == 2 * (2500 + 2)  # two versions, each framed by a begin and an end marker
    assert sum(value.startswith(b"settle-") for value in values) == 5000
