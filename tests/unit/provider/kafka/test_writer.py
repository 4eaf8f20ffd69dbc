"""Transactional id derivation, config building and librdkafka's error contract (with a fake producer)."""

from __future__ import annotations

import json
import logging
import threading
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from exactly_once_provider.hooks.kafka_producer import TransactionalProducerHook
from exactly_once_provider.kafka import writer as kafka_producer
from exactly_once_provider.kafka.offsets import LEDGER_PARTITIONS, ledger_partition
from exactly_once_provider.kafka.writer import (
    DeliveryError,
    Message,
    PipelineWriter,
    ProducerFencedError,
    TransactionPolicy,
    transactional_id_for,
)


def test_transactional_id_depends_only_on_pipeline_and_partition():
    assert transactional_id_for("orders", "p0") == "eo-txn/orders/p0" == transactional_id_for("orders", "p0")
    assert transactional_id_for("orders", "p1") != transactional_id_for("orders", "p0")
    with pytest.raises(ValueError, match="source_partition"):
        transactional_id_for("orders", "p/0")


@pytest.fixture
def kafka_conn(monkeypatch):
    def set_extra(**extra):
        monkeypatch.setenv(
            "AIRFLOW_CONN_KAFKA_DEFAULT",
            json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": "127.0.0.1:1", **extra}}),
        )

    set_extra()
    return set_extra


def test_exactly_once_config_adds_transactional_id_on_top_of_the_connection(kafka_conn):
    kafka_conn(**{"client.id": "mine"})
    hook = TransactionalProducerHook(
        pipeline="orders",
        source_partition="p0",
        delivery_mode="exactly_once",
        producer_config={"linger.ms": 20, "batch.size": 262144},
    )
    config = hook.build_producer_config()
    assert config["transactional.id"] == "eo-txn/orders/p0"
    assert config["enable.idempotence"] is True and config["acks"] == "all"
    assert (config["client.id"], config["linger.ms"], config["batch.size"]) == ("mine", 20, 262144)
    # get_conn (the provider's entry point) builds the same configuration, not the bare connection's.
    built = {}
    hook._get_client = lambda config: built.update(config) or "producer"
    assert hook.get_conn == "producer" and built == config


def test_connection_that_contradicts_the_mode_is_refused(kafka_conn):
    kafka_conn(**{"enable.idempotence": False})
    hook = TransactionalProducerHook(pipeline="orders", delivery_mode="exactly_once")
    with pytest.raises(ValueError, match="enable.idempotence.*contradicts delivery_mode"):
        hook.build_producer_config()
    kafka_conn(**{"transactional.id": "x"})
    with pytest.raises(ValueError, match="transactional.id"):
        TransactionalProducerHook(pipeline="orders", delivery_mode="at_least_once").build_producer_config()


@pytest.mark.parametrize("mode", [None, "", "exactly-once", "best_effort"])
def test_delivery_mode_must_be_chosen_explicitly(kafka_conn, mode):
    with pytest.raises(ValueError, match="choose 'exactly_once'.*'at_least_once'"):
        TransactionalProducerHook(pipeline="orders", delivery_mode=mode).build_producer_config()


def test_policy_refuses_tiny_transactions_unless_allowed():
    with pytest.raises(ValueError, match="too small"):
        TransactionPolicy(max_records=10).validate()
    with pytest.raises(ValueError, match="commit_interval_ms >= 100"):
        TransactionPolicy(commit_interval_ms=20).validate()
    assert TransactionPolicy(max_records=10, allow_small_transactions=True).validate().max_records == 10


class FakeProducer:
    """Records calls; ``failures`` maps a method name to errors raised on its next calls."""

    def __init__(self, failures: dict[str, list[KafkaError]] | None = None) -> None:
        self.failures = failures or {}
        self.calls: list[str] = []
        self.produced: list[tuple[str, bytes]] = []
        self.partitions: list[int | None] = []
        self._pending: list = []

    def _maybe_fail(self, name: str) -> None:
        self.calls.append(name)
        if self.failures.get(name):
            raise KafkaException(self.failures[name].pop(0))

    def init_transactions(self, timeout):
        self._maybe_fail("init_transactions")

    def begin_transaction(self):
        self._maybe_fail("begin_transaction")

    def commit_transaction(self, timeout):
        self._maybe_fail("commit_transaction")

    def abort_transaction(self, timeout):
        self._maybe_fail("abort_transaction")

    def produce(self, topic, value=None, key=None, headers=None, on_delivery=None, partition=None):
        self.produced.append((topic, value))
        self.partitions.append(partition)
        self._pending.append((topic, on_delivery))

    def list_topics(self, topic, timeout=None):
        """Every topic has the partition count of a new offsets ledger."""
        metadata = SimpleNamespace(error=None, partitions=dict.fromkeys(range(LEDGER_PARTITIONS)))
        return SimpleNamespace(topics={topic: metadata})

    def flush(self, timeout=None):
        for index, (topic, callback) in enumerate(self._pending):
            if callback is not None:
                callback(None, _Delivered(topic, index))
        self._pending = []
        return 0


class _Delivered:
    def __init__(self, topic, offset):
        self._topic, self._offset = topic, offset

    def topic(self):
        return self._topic

    def partition(self):
        return 0

    def offset(self):
        return self._offset


def _writer(producer: FakeProducer) -> PipelineWriter:
    writer = PipelineWriter(
        producer_factory=lambda: producer,
        client_config={},
        pipeline="p",
        source_partition="0",
        delivery_mode="exactly_once",
        transactional_id="eo-txn/p/0",
        offsets_topic="ledger",
        batch_markers=False,
        log=logging.getLogger("test"),
        transaction_timeout_s=5,
    )
    writer.producer = producer
    return writer


def _data(producer: FakeProducer) -> list[bytes]:
    return [value for topic, value in producer.produced if topic == "data"]


def test_retriable_commit_error_repeats_the_commit_only(monkeypatch):
    monkeypatch.setattr(kafka_producer.time, "sleep", lambda s: None)
    producer = FakeProducer({"commit_transaction": [KafkaError(KafkaError._TIMED_OUT, "t", retriable=True)]})
    committed = _writer(producer).write_batch("data", [Message(b"a"), Message(b"b")], offset=2)
    assert producer.calls == ["begin_transaction", "commit_transaction", "commit_transaction"]
    assert _data(producer) == [b"a", b"b"] and committed.offset == 2


@pytest.mark.parametrize("mode", ["exactly_once", "at_least_once"])
def test_ledger_record_goes_to_the_pipelines_partition_not_the_default_partitioner(mode):
    producer = FakeProducer()
    writer = _writer(producer)
    writer.delivery_mode = mode
    writer.write_batch("data", [Message(b"a", key=b"k")], offset=1)
    ledger = [partition for (topic, _), partition in zip(producer.produced, producer.partitions) if topic == "ledger"]
    assert ledger == [ledger_partition("p", LEDGER_PARTITIONS)]
    data = [partition for (topic, _), partition in zip(producer.produced, producer.partitions) if topic == "data"]
    assert data == [None]  # data records keep the client's partitioner (one key, one partition)


def test_abortable_commit_error_aborts_and_replays_the_whole_batch():
    producer = FakeProducer({"commit_transaction": [KafkaError(KafkaError._STATE, "a", txn_requires_abort=True)]})
    writer = _writer(producer)
    committed = writer.write_batch("data", [Message(b"a"), Message(b"b")], offset=2)
    assert producer.calls == [
        "begin_transaction",
        "commit_transaction",
        "abort_transaction",
        "begin_transaction",
        "commit_transaction",
    ]
    assert _data(producer) == [b"a", b"b", b"a", b"b"]  # the aborted copy is invisible to read_committed
    assert writer.last_committed == committed and committed.sequence == 1


def test_fenced_producer_stops_instead_of_taking_the_id_back():
    producer = FakeProducer({"commit_transaction": [KafkaError(KafkaError._FENCED, "fenced", fatal=True)]})
    with pytest.raises(ProducerFencedError, match="newer writer"):
        _writer(producer).write_batch("data", [Message(b"a")], offset=1)
    assert "abort_transaction" not in producer.calls


def test_closing_a_fenced_producer_keeps_the_fenced_error(caplog):
    """close() runs in `finally`: the fatal error flush() raises again must not replace the fenced error."""
    fenced = KafkaError(KafkaError._FENCED, "fenced", fatal=True)
    producer = FakeProducer()

    def commit_transaction(timeout):  # from now on the producer is fenced: flush() raises it too
        producer.flush = lambda timeout=None: (_ for _ in ()).throw(KafkaException(fenced))
        raise KafkaException(fenced)

    producer.commit_transaction = commit_transaction
    writer = _writer(producer)
    with pytest.raises(ProducerFencedError, match="newer writer"):
        try:
            writer.write_batch("data", [Message(b"a")], offset=1)
        finally:
            writer.close()
    assert writer.producer is None and "closed after a fatal error" in caplog.text


def test_open_that_fails_on_the_ledger_closes_its_producer(monkeypatch):
    """Nobody gets a writer whose open() raised: it must flush and drop its initialised producer itself."""

    def ledger_moved(*args, **kwargs):
        raise RuntimeError("ledger moved")

    monkeypatch.setattr(kafka_producer, "read_committed_offset", ledger_moved)
    producer = FakeProducer()
    flushed = []
    producer.flush = lambda timeout=None: flushed.append(timeout) or 0
    writer = _writer(producer)
    writer.producer = None
    with pytest.raises(RuntimeError, match="ledger moved"):
        writer.open()
    assert producer.calls == ["init_transactions"] and flushed and writer.producer is None


def test_other_fatal_error_recreates_and_skips_a_batch_the_ledger_shows_committed(monkeypatch):
    first = FakeProducer({"commit_transaction": [KafkaError(KafkaError._FATAL, "boom", fatal=True)]})
    second = FakeProducer()
    writer = _writer(first)
    writer._producer_factory = lambda: second
    seen = {}

    def ledger_after_recreate(config, pipeline, source_partition, topic, timeout):
        # The commit reached the broker before the producer died: the ledger shows the batch.
        return seen["committed"]

    real_produce_batch = writer._produce_batch

    def remember(batch):
        seen["committed"] = batch.committed
        return real_produce_batch(batch)

    monkeypatch.setattr(writer, "_produce_batch", remember)
    monkeypatch.setattr(kafka_producer, "read_committed_offset", ledger_after_recreate)
    committed = writer.write_batch("data", [Message(b"a")], offset=1)
    assert committed.sequence == 1
    assert second.calls == ["init_transactions"]  # fenced the old epoch; nothing produced again
    assert second.produced == []


def test_submitted_batch_commits_in_the_background_and_wait_returns_it():
    producer = FakeProducer()
    writer = _writer(producer)
    assert writer.submit_batch("data", [Message(b"a", key=b"k")], offset=1) is None
    first = writer.submit_batch("data", [Message(b"b", key=b"k")], offset=2)  # waits for batch 1 first
    assert (first.offset, first.sequence) == (1, 1) and writer.last_committed == first
    second = writer.wait()
    assert (second.offset, second.sequence) == (2, 2) and writer.last_committed == second
    assert writer.wait() is None
    assert producer.calls == ["begin_transaction", "commit_transaction"] * 2


def test_background_commit_failure_is_replayed_by_the_next_call():
    producer = FakeProducer({"commit_transaction": [KafkaError(KafkaError._STATE, "a", txn_requires_abort=True)]})
    writer = _writer(producer)
    writer.submit_batch("data", [Message(b"a"), Message(b"b")], offset=2)
    committed = writer.wait()
    assert producer.calls == [
        "begin_transaction",
        "commit_transaction",
        "abort_transaction",
        "begin_transaction",
        "commit_transaction",
    ]
    assert _data(producer) == [b"a", b"b", b"a", b"b"] and writer.last_committed == committed


def test_background_fencing_is_raised_by_the_next_submit_and_nothing_moves():
    producer = FakeProducer({"commit_transaction": [KafkaError(KafkaError._FENCED, "fenced", fatal=True)]})
    writer = _writer(producer)
    writer.submit_batch("data", [Message(b"a")], offset=1)
    with pytest.raises(ProducerFencedError, match="newer writer"):
        writer.submit_batch("data", [Message(b"b")], offset=2)
    assert writer.last_committed is None and _data(producer) == [b"a"]  # batch 2 was never produced


def test_close_waits_for_a_running_commit():
    producer = FakeProducer()
    release = threading.Event()
    producer.commit_transaction = lambda timeout: (producer.calls.append("commit_transaction"), release.wait(5))
    writer = _writer(producer)
    writer.submit_batch("data", [Message(b"a")], offset=1)
    threading.Timer(0.3, release.set).start()
    writer.close()
    assert writer.last_committed.offset == 1 and writer.producer is None


def _record_report_requests(producer: FakeProducer) -> list[bool]:
    """Make ``producer`` note, per data record, whether a delivery report was asked for; return the notes."""
    requests: list[bool] = []
    real_produce = producer.produce

    def produce(topic, value=None, key=None, headers=None, on_delivery=None, partition=None):
        if topic == "data":
            requests.append(on_delivery is not None)
        real_produce(topic, value, key, headers, on_delivery, partition)

    producer.produce = produce
    return requests


def test_exactly_once_reports_only_the_last_record_of_each_key_and_keeps_exact_offsets():
    producer = FakeProducer()
    callbacks = _record_report_requests(producer)
    writer = _writer(producer)
    batch = [
        Message(b"1", key=b"a"),
        Message(b"2", key=b"b"),
        Message(b"3", key=b"a"),
        Message(b"4"),
        Message(b"5", key=b"b"),
        Message(b"6"),
    ]
    writer.write_batch("data", batch, offset=6)
    assert callbacks == [False, False, True, True, True, True]
    # The fake puts everything into partition 0 at offset = position in the flush (ledger record first).
    assert writer.partition_offsets == {("data", 0): 6}


def test_at_least_once_reports_every_record():
    producer = FakeProducer()
    callbacks = _record_report_requests(producer)
    writer = _writer(producer)
    writer.delivery_mode, writer.transactional_id = "at_least_once", None
    writer.write_batch("data", [Message(b"1", key=b"a"), Message(b"2", key=b"a")], offset=2)
    assert callbacks == [True, True] and "commit_transaction" not in producer.calls


def test_commit_failing_on_an_unreported_oversized_record_fails_without_replay():
    too_large = KafkaError(
        KafkaError.MSG_SIZE_TOO_LARGE, "ProduceRequest failed: Message size too large", txn_requires_abort=True
    )
    producer = FakeProducer({"commit_transaction": [too_large]})
    writer = _writer(producer)
    with pytest.raises(DeliveryError, match="not delivered.*MSG_SIZE_TOO_LARGE.*nothing of this batch is visible"):
        writer.write_batch("data", [Message(b"x", key=b"k"), Message(b"y", key=b"k")], offset=2)
    assert producer.calls == ["begin_transaction", "commit_transaction", "abort_transaction"]
    assert writer.last_committed is None


def test_batch_failing_while_produced_is_replayed_and_still_returned_by_wait():
    producer = FakeProducer()
    failures = [KafkaError(KafkaError._STATE, "a", txn_requires_abort=True)]
    real_produce = producer.produce

    def produce(topic, value=None, key=None, headers=None, on_delivery=None, partition=None):
        if topic == "data" and failures:
            raise KafkaException(failures.pop(0))
        real_produce(topic, value, key, headers, on_delivery, partition)

    producer.produce = produce
    writer = _writer(producer)
    assert writer.submit_batch("data", [Message(b"a")], offset=1) is None
    committed = writer.wait()
    assert committed.offset == 1 and writer.last_committed == committed
    assert producer.calls == ["begin_transaction", "abort_transaction", "begin_transaction", "commit_transaction"]


def test_writer_without_partition_offsets_asks_for_no_delivery_report():
    producer = FakeProducer()
    callbacks = _record_report_requests(producer)
    writer = _writer(producer)
    writer.track_partition_offsets = False
    committed = writer.write_batch("data", [Message(b"1", key=b"a"), Message(b"2"), Message(b"3", key=b"a")], offset=3)
    assert callbacks == [False, False, False]
    assert _data(producer) == [b"1", b"2", b"3"] and writer.last_committed == committed
    assert producer.calls[-1] == "commit_transaction" and writer.partition_offsets == {}


def test_full_local_queue_makes_that_record_wait_and_keeps_order():
    producer = FakeProducer()
    real_produce = producer.produce
    refusals = [2, 5]  # the local queue is full when these records arrive, once each

    def produce(topic, value=None, key=None, headers=None, on_delivery=None, partition=None):
        if topic == "data" and refusals and int(value) == refusals[0]:
            refusals.pop(0)
            raise BufferError("Local: Queue full")
        real_produce(topic, value, key, headers, on_delivery, partition)

    polls = []
    producer.produce = produce
    producer.poll = polls.append
    writer = _writer(producer)
    writer.write_batch("data", [Message(str(i).encode(), key=b"k%d" % i) for i in range(8)], offset=8)
    assert _data(producer) == [str(i).encode() for i in range(8)]
    assert len(polls) == 2 and producer.calls[-1] == "commit_transaction"


def test_empty_batch_commits_only_the_ledger_record():
    producer = FakeProducer()
    writer = _writer(producer)
    committed = writer.write_batch("data", [], offset=7)
    assert _data(producer) == [] and [t for t, _ in producer.produced] == ["ledger"]
    assert writer.last_committed == committed and committed.offset == 7


def test_records_longer_than_a_message_are_produced_by_their_first_four_fields():
    # The capture hands its ChangeRecord (Message's four fields, then the handoff's) to the writer as is.
    from exactly_once_provider.capture.change_record import ChangeRecord

    producer = FakeProducer()
    callbacks = _record_report_requests(producer)
    writer = _writer(producer)
    batch = [
        ChangeRecord(b"1", b"a", None, "data", (1,), "eo", "t"),
        ChangeRecord(b"2", b"a", None, None, (1,), "eo", "t"),
        ChangeRecord(b"3", b"b", {"h": b"v"}, "data", (2,), "eo", "t"),
    ]
    writer.write_batch("other", batch, offset=3)
    assert [(t, v) for t, v in producer.produced if v in (b"1", b"2", b"3")] == [
        ("data", b"1"),
        ("other", b"2"),
        ("data", b"3"),
    ]
    assert callbacks == [True, True]  # the last of key a in "data", the last of key b ("other" is not noted)
    assert writer.partition_offsets[("data", 0)] > 0


def test_value_key_pairs_are_produced_in_order_with_reports_for_the_last_of_each_key():
    producer = FakeProducer()
    callbacks = _record_report_requests(producer)
    writer = _writer(producer)
    batch = [(b"1", b"a"), (b"2", b"b"), (b"3", b"a"), (b"4", None), (b"5", b"b"), (b"6", None)]
    committed = writer.write_batch("data", batch, offset=6)
    assert _data(producer) == [b"1", b"2", b"3", b"4", b"5", b"6"]
    assert callbacks == [False, False, True, True, True, True]
    assert writer.last_committed == committed and writer.partition_offsets == {("data", 0): 6}


def test_value_key_pairs_wait_for_a_full_local_queue_and_at_least_once_reports_each():
    producer = FakeProducer()
    callbacks = _record_report_requests(producer)  # notes only the records the queue took
    real_produce = producer.produce
    refusals = [3]

    def produce(topic, value=None, key=None, headers=None, on_delivery=None, partition=None):
        if topic == "data" and refusals and int(value) == refusals[0]:
            refusals.pop(0)
            raise BufferError("Local: Queue full")
        real_produce(topic, value, key, headers, on_delivery, partition)

    producer.produce, producer.poll = produce, lambda timeout: None
    writer = _writer(producer)
    writer.delivery_mode, writer.transactional_id = "at_least_once", None
    writer.write_batch("data", [(str(i).encode(), b"k") for i in range(5)], offset=5)
    assert _data(producer) == [str(i).encode() for i in range(5)]
    assert callbacks == [True] * 5


def test_plain_tuples_in_message_order_work_like_messages():
    producer = FakeProducer()
    writer = _writer(producer)
    writer.write_batch("data", [(b"1", b"a", None, None), (b"2", b"a", {"h": b"v"}, "elsewhere")], offset=2)
    assert [(t, v) for t, v in producer.produced if v in (b"1", b"2")] == [("data", b"1"), ("elsewhere", b"2")]


@pytest.mark.parametrize("batch", [[(b"1", b"a", None)], [(b"1", b"a"), Message(b"2", b"b")], [(b"1",)]])
def test_records_of_another_shape_are_refused_before_a_transaction_begins(batch):
    producer = FakeProducer()
    writer = _writer(producer)
    with pytest.raises(ValueError, match="fields: give every record as Message.*or make the whole batch"):
        writer.submit_batch("data", batch, offset=1)
    assert producer.calls == [] and producer.produced == [] and writer.last_committed is None


def test_a_record_refused_because_the_transaction_already_failed_reports_the_earlier_records_cause():
    """librdkafka fails the transaction on an oversized record asynchronously; the next produce() only says
    "Erroneous state". The error must name the cause from the pending delivery report, not the state."""
    producer = FakeProducer()
    real_produce = producer.produce
    too_large = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "Broker: Message size too large")

    def produce(topic, value=None, key=None, headers=None, on_delivery=None, partition=None):
        if topic == "data" and value == b"after":
            raise KafkaException(KafkaError(KafkaError._STATE, "Unable to produce message: Local: Erroneous state"))
        real_produce(topic, value, key, headers, on_delivery, partition)

    def poll(timeout=None):  # serves the oversized record's report
        for _topic, callback in producer._pending:
            if callback is not None:
                callback(too_large, None)
        producer._pending = []
        return 0

    producer.produce, producer.poll = produce, poll
    writer = _writer(producer)
    with pytest.raises(DeliveryError, match="not delivered, first: Broker: Message size too large.*MSG_SIZE_TOO_LARGE"):
        writer.write_batch("data", [Message(b"big", key=b"a"), Message(b"after", key=b"b")], offset=2)
    assert "commit_transaction" not in producer.calls and writer.last_committed is None
