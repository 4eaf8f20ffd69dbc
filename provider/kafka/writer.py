"""The exactly-once Kafka writer: data, batch markers and the source offset committed in ONE transaction.

:class:`PipelineWriter` runs the transactions and is where every commit happens (``commit_transaction``);
:class:`~exactly_once_provider.hooks.kafka_producer.TransactionalProducerHook` builds it from the ``kafka``
connection.
The resume point is read from the offsets ledger (:mod:`exactly_once_provider.kafka.offsets`), never from Airflow.

librdkafka's transactional error contract, as applied here:

* ``retriable()`` -> call the same method again (a timed-out commit keeps going in the background);
* ``txn_requires_abort()`` (or a retriable delivery error) -> abort, then replay the whole batch;
* fenced (``_FENCED``, ``PRODUCER_FENCED``, ``INVALID_PRODUCER_EPOCH``) -> a newer writer owns this
  transactional id: stop, never fight it for the id;
* any other fatal or indefinite error -> close the producer, create a new one (``init_transactions``
  aborts what was open), re-read the ledger, and replay the batch only if the ledger shows it missing.
* a non-retriable delivery error (e.g. a record larger than the broker allows) -> abort and fail.

:meth:`PipelineWriter.submit_batch` lets a batch's commit round trip run in a background thread while the
caller builds the next batch (the thread waits in librdkafka with the GIL released); the next call waits for
it first, and only then does ``last_committed`` move. :meth:`PipelineWriter.write_batch` is the same, waiting.
"""

from __future__ import annotations

import reprlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, NamedTuple

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from exactly_once_provider.errors import PipelineError
from exactly_once_provider.faults import fault_point
from exactly_once_provider.kafka.offsets import (
    MARKER_HEADER,
    CommittedOffset,
    check_ledger_partitions,
    ledger_partition,
    marker_value,
    new_committed_offset,
    read_committed_offset,
    validate_name,
)

FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})
# Settings this module owns per delivery mode; a connection or override that sets them differently is refused.
MODE_SETTINGS = {
    "exactly_once": {"enable.idempotence": True, "acks": "all"},
    "at_least_once": {"enable.idempotence": True, "acks": "all"},
}
MIN_COMMIT_INTERVAL_MS = 100
MIN_RECORDS_PER_TRANSACTION = 100
# Delivery errors of records librdkafka dropped because their transaction failed (not the cause).
PURGED_CODES = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})
# Record errors a replay cannot fix: the batch fails with a DeliveryError instead of being replayed.
UNDELIVERABLE_CODES = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_EXCEPTION,
    }
)


def transactional_id_for(pipeline: str, source_partition: str) -> str:
    """
    Return the transactional id of one pipeline's source partition.

    Derived only from the two names, never from try_number or a random value: a retry of the same
    partition gets the same id and fences the zombie of the previous attempt, and two partitions (or
    pipelines) never share one.

    :param pipeline: the pipeline name.
    :param source_partition: the source partition name.
    """
    return f"eo-txn/{validate_name('pipeline', pipeline)}/{validate_name('source_partition', source_partition)}"


@dataclass(frozen=True)
class TransactionPolicy:
    """
    How big a transaction gets before it is committed.

    A commit costs a round trip to the transaction coordinator plus markers in every partition written,
    so tiny transactions cut throughput several-fold (docs/pitfalls.md#kafka: 10 msgs/txn ~6k/s vs 1000 ~420k/s).

    :param max_records: commit once a transaction holds this many records (at a source commit point).
    :param commit_interval_ms: commit at least this often (at a source commit point).
    :param allow_small_transactions: accept settings below the minimums instead of refusing them.
    """

    max_records: int = 10_000
    commit_interval_ms: int = 1_000
    allow_small_transactions: bool = False

    def validate(self) -> TransactionPolicy:
        """Refuse settings that force tiny transactions unless explicitly allowed."""
        if self.max_records < 1 or self.commit_interval_ms < 1:
            raise ValueError("max_records and commit_interval_ms must be positive.")
        if not self.allow_small_transactions and (
            self.max_records < MIN_RECORDS_PER_TRANSACTION or self.commit_interval_ms < MIN_COMMIT_INTERVAL_MS
        ):
            raise ValueError(
                f"Transactions of at most {self.max_records} records or {self.commit_interval_ms} ms are too "
                f"small: each commit costs a coordinator round trip. Use max_records >= "
                f"{MIN_RECORDS_PER_TRANSACTION} and commit_interval_ms >= {MIN_COMMIT_INTERVAL_MS}, or set "
                "allow_small_transactions=True if the latency is worth the throughput."
            )
        return self


class Message(NamedTuple):
    """One data record to produce; ``topic`` overrides the batch's topic (one transaction, several topics).

    A batch may also hold plain tuples in the same order: ``(value, key, headers, topic)`` or, in a batch of
    them only, ``(value, key)`` pairs; longer tuples whose first four fields are these work too (the capture's
    ChangeRecord). Plain tuples are the cheapest to build, and Python's cyclic garbage collector stops tracking
    a plain tuple of bytes or None, while it keeps scanning every named tuple of a batch held in memory: in
    ``benchmarks/bench_producer.py`` (100 B, 100 ms commits) Message batches cost ~1.6x the CPU per record.
    """

    value: bytes | None
    key: bytes | None = None
    headers: dict[str, bytes] | None = None
    topic: str | None = None


_KEY, _TOPIC = itemgetter(1), itemgetter(3)  # Message fields, read in C loops


def _pairs(messages: Sequence[Any]) -> bool:
    """Return True for a batch of ``(value, key)`` pairs, False for Message-shaped records; refuse others."""
    widths = set(map(len, messages))  # one C loop over the batch
    if widths == {2}:
        return True
    if widths and min(widths) < 4:
        raise ValueError(
            f"A batch holds records of {min(widths)} fields: give every record as Message(value, key, headers, "
            "topic) or a plain tuple in that order, or make the whole batch (value, key) pairs."
        )
    return False


def _as_message(record: Sequence[Any]) -> Message:
    """Return one record of a batch (a pair, a Message or a longer tuple) as a Message: the rare paths' shape."""
    return Message(record[0], record[1]) if len(record) == 2 else Message(*record[:4])


class ProducerFencedError(PipelineError):
    """Raise when a newer producer with the same transactional id took over (this attempt is the zombie)."""


class DeliveryError(PipelineError):
    """Raise when a record could not be delivered; its transaction was aborted."""


class _AbortAndReplay(Exception):
    def __init__(self, error: KafkaError) -> None:
        super().__init__(error)
        self.error = error


class _Recreate(Exception):
    def __init__(self, error: KafkaError | str) -> None:
        super().__init__(error)
        self.error = error


@dataclass
class _Deliveries:
    """Delivery reports of the current transaction."""

    errors: list[KafkaError] = field(default_factory=list)
    per_partition: Counter = field(default_factory=Counter)
    last_offsets: dict[tuple[str, int], int] = field(default_factory=dict)

    def __call__(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.errors.append(err)
            return
        self.per_partition[(msg.topic(), msg.partition())] += 1
        self.last_offsets[(msg.topic(), msg.partition())] = msg.offset()


@dataclass
class _Batch:
    """One batch on its way: what a replay needs, and the outcome of its background commit."""

    topic: str
    messages: Sequence[Message]
    committed: CommittedOffset
    consumer: Any
    consumer_offsets: Sequence[TopicPartition] | None
    before: CommittedOffset | None
    deliveries: _Deliveries = field(default_factory=_Deliveries)
    ledger: _Deliveries = field(default_factory=_Deliveries)
    ledger_record: Message | None = None
    partitions: list[int] = field(default_factory=list)
    pairs: bool = False
    thread: threading.Thread | None = None
    failure: BaseException | None = None


class PipelineWriter:
    """
    Write batches of one source partition; each batch commits with its source offset in the ledger.

    Build it with :meth:`TransactionalProducerHook.open_writer`. Not thread-safe; one per source partition.
    """

    def __init__(
        self,
        producer_factory: Callable[[], Producer],
        client_config: dict[str, Any],
        pipeline: str,
        source_partition: str,
        delivery_mode: str,
        transactional_id: str | None,
        offsets_topic: str,
        batch_markers: bool,
        log: Any,
        transaction_timeout_s: float = 60,
        max_replays: int = 3,
        max_recreates: int = 3,
        track_partition_offsets: bool = True,
    ) -> None:
        self._producer_factory = producer_factory
        self._client_config = client_config
        self.pipeline = pipeline
        self.source_partition = source_partition
        self.delivery_mode = delivery_mode
        self.transactional_id = transactional_id
        self.offsets_topic = offsets_topic
        self.batch_markers = batch_markers
        self.log = log
        self.transaction_timeout_s = transaction_timeout_s
        self.max_replays = max_replays
        self.max_recreates = max_recreates
        self.track_partition_offsets = track_partition_offsets
        self.producer: Producer | None = None
        self.last_committed: CommittedOffset | None = None
        self.partition_offsets: dict[tuple[str, int], int] = {}
        self._partitions: dict[str, list[int]] = {}
        self._pending: _Batch | None = None

    @property
    def transactional(self) -> bool:
        return self.delivery_mode == "exactly_once"

    def open(self) -> CommittedOffset | None:
        """Start the producer (fencing older epochs of the id) and read the resume point from the ledger."""
        self.producer = self._producer_factory()
        try:
            if self.transactional:
                self._retry("init_transactions", self.producer.init_transactions, self.transaction_timeout_s)
            self.last_committed = read_committed_offset(
                self._client_config,
                self.pipeline,
                self.source_partition,
                self.offsets_topic,
                timeout=2 * self.transaction_timeout_s + 30,
            )
        except BaseException:
            # The caller never gets this writer, so nobody else would close its producer: left to the garbage
            # collector, a transactional producer lives on with this id's epoch while the next writer starts.
            self.close(timeout=5)
            raise
        self.log.info(
            "Pipeline %s/%s (%s, transactional.id=%s) resumes after %s",
            self.pipeline,
            self.source_partition,
            self.delivery_mode,
            self.transactional_id,
            "nothing (first run)"
            if self.last_committed is None
            # reprlib: a structured offset (a watermark pipeline's window history) stays one short line
            else f"offset {reprlib.repr(self.last_committed.offset)} (batch {self.last_committed.batch_id})",
        )
        return self.last_committed

    def close(self, timeout: float = 30) -> None:
        """Flush and drop the producer (an open transaction is aborted by the broker or the next writer)."""
        batch = self._pending
        if batch is not None and batch.thread is not threading.current_thread():
            # Never flush or drop the producer under a running commit. Normally wait() ran already; here the
            # caller failed on its own, so a failed commit is only logged: the ledger says where to resume.
            self._pending = None
            if batch.thread is not None:
                batch.thread.join()
            if batch.failure is None:
                self._committed(batch)
            else:
                self.log.warning("Batch %s was not committed: %s", batch.committed.batch_id, batch.failure)
        if self.producer is not None:
            producer, self.producer = self.producer, None
            try:
                producer.flush(timeout)
            except KafkaException as exc:
                # A fenced or failed producer raises its fatal error again here. Closing runs in `finally`
                # blocks: raising would replace the error that explains the failure (e.g. "was fenced").
                self.log.warning("Producer closed after a fatal error: %s", exc.args[0])

    def write_batch(
        self,
        topic: str,
        messages: Sequence[Message],
        offset: Any,
        batch_id: str | None = None,
        batch_version: int = 1,
        consumer: Any = None,
        consumer_offsets: Sequence[TopicPartition] | None = None,
    ) -> CommittedOffset:
        """
        Produce ``messages`` and the ledger record for ``offset``; return the committed ledger record.

        In ``exactly_once`` mode all of it (plus batch markers and, for consume-transform-produce, the
        consumer's offsets) is one transaction: visible to read_committed readers together or never.

        :param topic: the data topic.
        :param messages: the batch: :class:`Message` objects or plain tuples of the same fields (see there);
            kept in memory so it can be replayed after an abortable error.
        :param offset: the source position the batch covers, inclusive; JSON-serialisable.
        :param batch_id: the batch identity (e.g. a settlement window); default: the ledger sequence.
        :param batch_version: the version of this batch identity (bump to re-produce a window on purpose).
        :param consumer: for consume-transform-produce: the input consumer (its group metadata).
        :param consumer_offsets: the input offsets to commit with this transaction (next offset to read).
        """
        self.submit_batch(topic, messages, offset, batch_id, batch_version, consumer, consumer_offsets)
        return self.wait()

    def submit_batch(
        self,
        topic: str,
        messages: Sequence[Message],
        offset: Any,
        batch_id: str | None = None,
        batch_version: int = 1,
        consumer: Any = None,
        consumer_offsets: Sequence[TopicPartition] | None = None,
    ) -> CommittedOffset | None:
        """
        Produce a batch like :meth:`write_batch`, but return while its commit is still on its way.

        The commit (exactly_once: ``commit_transaction``; at_least_once: the final flush and the ledger
        record) finishes in a background thread, so the caller can build the next batch meanwhile. The next
        ``submit_batch``, :meth:`write_batch` or :meth:`wait` waits for it and raises its error (after the
        same abort-and-replay or recreate handling as :meth:`write_batch`). Nothing is committed until then:
        ``last_committed`` and ``partition_offsets`` move only when the commit has returned. Do not modify
        ``messages`` afterwards (a replay sends them again). Parameters as for :meth:`write_batch`.

        :return: the ledger record of the previous batch, which this call waited for (None if there was none).
        """
        if (consumer is None) != (consumer_offsets is None):
            raise ValueError("Pass both consumer and consumer_offsets for consume-transform-produce, or neither.")
        if consumer is not None and not self.transactional:
            raise ValueError("send_offsets_to_transaction needs delivery_mode='exactly_once'.")
        pairs = _pairs(messages)
        previous = self.wait()
        before = self.last_committed
        sequence = (before.sequence if before else 0) + 1
        committed = new_committed_offset(
            self.pipeline,
            self.source_partition,
            offset,
            sequence,
            batch_id or str(sequence),
            batch_version,
            len(messages),
            self.transactional_id,
            self.delivery_mode,
        )
        batch = _Batch(topic, messages, committed, consumer, consumer_offsets, before, pairs=pairs)
        try:
            self._produce_batch(batch)
        except (_AbortAndReplay, _Recreate) as exc:
            batch.failure = exc  # wait() aborts and replays it, or recreates the producer
        else:
            batch.thread = threading.Thread(
                target=self._commit_in_background, args=(batch,), name=f"eo-commit-{committed.batch_id}", daemon=True
            )
            batch.thread.start()
        self._pending = batch
        return previous

    def wait(self) -> CommittedOffset | None:
        """Wait for the batch of the last :meth:`submit_batch`; return its ledger record (None if none)."""
        batch, self._pending = self._pending, None
        if batch is None:
            return None
        if batch.thread is not None:
            batch.thread.join()
        if isinstance(batch.failure, (_AbortAndReplay, _Recreate)):
            return self._settle(batch, batch.failure)
        if batch.failure is not None:
            raise batch.failure
        return self._committed(batch)

    def _commit_in_background(self, batch: _Batch) -> None:
        try:
            self._commit_batch(batch)
        except BaseException as exc:  # handed to the caller's thread by wait()
            batch.failure = exc

    def _committed(self, batch: _Batch) -> CommittedOffset:
        self.last_committed = batch.committed
        self.partition_offsets.update(batch.deliveries.last_offsets)
        return batch.committed

    def _settle(self, batch: _Batch, failure: _AbortAndReplay | _Recreate) -> CommittedOffset:
        """Recover a batch whose write failed: abort and replay it, or recreate the producer (synchronously)."""
        committed, before = batch.committed, batch.before
        replays = recreates = 0
        while True:
            if failure is None:
                try:
                    self._produce_batch(batch)
                    self._commit_batch(batch)
                    return self._committed(batch)
                except (_AbortAndReplay, _Recreate) as exc:
                    failure = exc
            if isinstance(failure, _AbortAndReplay):
                replays += 1
                self.log.warning(
                    "Transaction of batch %s must be aborted (%s); replay %d/%d",
                    committed.batch_id,
                    failure.error,
                    replays,
                    self.max_replays,
                )
                if self._abort():
                    if replays > self.max_replays:
                        raise PipelineError(
                            f"Batch {committed.batch_id} of {self.pipeline}/{self.source_partition} was "
                            f"aborted {replays} times, last because of {failure.error}; nothing of it is "
                            "visible. Check the broker and retry the task."
                        ) from None
                    failure = None
                    continue
            recreate_error, failure = failure.error, None
            recreates += 1
            if recreates > self.max_recreates:
                raise PipelineError(
                    f"Producer of {self.pipeline}/{self.source_partition} failed fatally {recreates} times, "
                    f"last: {recreate_error}. The ledger still says offset "
                    f"{before.offset if before else None!r}; retry the task to resume from there."
                )
            self.log.warning("Producer failed fatally (%s); recreating it and re-reading the ledger", recreate_error)
            self.close(timeout=0)
            self.open()
            if self.last_committed is not None and (
                self.last_committed.sequence,
                self.last_committed.batch_id,
                self.last_committed.offset,
            ) == (committed.sequence, committed.batch_id, committed.offset):
                self.log.info("Batch %s turned out committed before the failure", committed.batch_id)
                return self.last_committed
            if self.last_committed != before:
                raise PipelineError(
                    f"The ledger of {self.pipeline}/{self.source_partition} moved to "
                    f"{self.last_committed} while this writer held batch {committed.batch_id}: another writer "
                    "uses the same pipeline and source_partition. Give each writer its own source_partition."
                )

    def _produce_batch(self, batch: _Batch) -> None:
        """Begin the transaction and hand every record of the batch to librdkafka (the caller's thread)."""
        producer, topic, messages, committed = self.producer, batch.topic, batch.messages, batch.committed
        batch.deliveries, batch.ledger = _Deliveries(), _Deliveries()
        batch.ledger_record = Message(committed.to_value(), key=committed.key)
        if self.transactional:
            self._classify("begin_transaction", producer.begin_transaction)
            # Inside a transaction the order does not matter (all or nothing), so the ledger record goes
            # first: its partition joins the transaction together with the data partitions instead of
            # costing one more AddPartitionsToTxn round trip right before the commit.
            self._produce(self.offsets_topic, batch.ledger_record, batch.ledger, self._ledger_partition())
        batch.partitions = self._topic_partitions(topic) if self.batch_markers else []
        for partition in batch.partitions:
            self._produce(
                topic, Message(marker_value("begin", committed), headers={MARKER_HEADER: b"begin"}), None, partition
            )
        reported = self._reported_records(topic, messages, batch.partitions, batch.pairs)
        if messages:
            half = len(messages) // 2 + 1
            self._produce_records(topic, messages, 0, half, batch.deliveries, reported, batch.pairs)
            fault_point("mid_produce")
            self._produce_records(topic, messages, half, len(messages), batch.deliveries, reported, batch.pairs)

    def _produce_records(
        self,
        topic: str,
        messages: Sequence[Message],
        start: int,
        stop: int,
        deliveries: _Deliveries,
        reported: set[int] | None,
        pairs: bool = False,
    ) -> None:
        """Produce ``messages[start:stop]`` in a tight loop (one C call per record): the hot path of every
        writer. A full local queue sends that one record through :meth:`_produce`, which waits for room; a
        refused record is classified as there."""
        produce = self.producer.produce
        index = start
        while index < stop:
            try:
                # Fields by position: a record may be a longer tuple whose first four are Message's (ChangeRecord).
                if pairs:  # (value, key) pairs: no headers, no topic of their own
                    for index in range(index, stop):  # noqa: B020 - resumes where a full queue stopped it
                        value, key = messages[index]
                        if reported is None or index in reported:
                            produce(topic, value, key, on_delivery=deliveries)
                        else:
                            produce(topic, value, key)
                elif reported is None:
                    for index in range(index, stop):  # noqa: B020 - resumes where a full queue stopped it
                        message = messages[index]
                        produce(message[3] or topic, message[0], message[1], on_delivery=deliveries, headers=message[2])
                else:  # exactly_once: a few records get a report; the rest pass no keyword (cheaper C call)
                    for index in range(index, stop):  # noqa: B020 - resumes where a full queue stopped it
                        message = messages[index]
                        if index in reported:
                            produce(
                                message[3] or topic, message[0], message[1], on_delivery=deliveries, headers=message[2]
                            )
                        elif message[2] is None:
                            produce(message[3] or topic, message[0], message[1])
                        else:
                            produce(message[3] or topic, message[0], message[1], headers=message[2])
                return
            except BufferError:  # the local queue is full: serve delivery reports, then _produce waits for room
                self.producer.poll(0.05)
                report = deliveries if reported is None or index in reported else None
                message = _as_message(messages[index])
                self._produce(message.topic or topic, message, report)
                index += 1
            except KafkaException as exc:
                message = _as_message(messages[index])
                raise self._produce_error(exc.args[0], message.topic or topic, message, deliveries) from None

    def _reported_records(
        self, topic: str, messages: Sequence[Message], markers: list[int], pairs: bool = False
    ) -> set[int] | None:
        """
        Return the indexes of the records that need a delivery report, or None for all of them.

        A transaction's commit fails if any of its records failed, so exactly_once needs reports only to
        learn the last offset of every partition written: records of one key land in one partition in
        produce order, so the last record of each (topic, key) is enough; keyless records are spread by
        the partitioner, so each gets one. Batch markers count every partition's records, and
        at_least_once has no commit to fail: there every record is reported.
        """
        if not self.transactional or markers:
            return None
        if not self.track_partition_offsets:
            return set()  # the commit alone tells whether every record arrived
        # (If the topic gains partitions during the batch, a key may move: partition_offsets, a display
        # mirror, may then show an older offset for the partition it left. The ledger is unaffected.)
        if not pairs and any(map(_TOPIC, messages)):
            last_of_key = {(message[3] or topic, message[1]): index for index, message in enumerate(messages)}
            keyless = any(key is None for _, key in last_of_key)
        else:  # one topic (the common case): the keys alone, in C loops
            last_of_key = dict(zip(map(_KEY, messages), range(len(messages))))
            keyless = None in last_of_key
        reported = set(last_of_key.values())
        if keyless:
            reported.update(index for index, message in enumerate(messages) if message[1] is None)
        return reported

    def _commit_batch(self, batch: _Batch) -> None:
        """Wait for the records and commit them with the ledger record (may run in a background thread)."""
        producer, topic, committed, deliveries = self.producer, batch.topic, batch.committed, batch.deliveries
        self._flush(deliveries)
        fault_point("produced")
        for partition in batch.partitions:
            count = deliveries.per_partition[(topic, partition)]
            self._produce(
                topic, Message(marker_value("end", committed, count), headers={MARKER_HEADER: b"end"}), None, partition
            )
        if batch.consumer is not None:
            self._classify(
                "send_offsets_to_transaction",
                producer.send_offsets_to_transaction,
                list(batch.consumer_offsets),
                batch.consumer.consumer_group_metadata(),
                self.transaction_timeout_s,
            )
        if self.transactional:
            fault_point("before_commit")
            try:
                # The commit: data, markers, consumer offsets and the ledger record become visible together.
                self._retry("commit_transaction", producer.commit_transaction, self.transaction_timeout_s)
            except _AbortAndReplay as exc:
                self._check_deliveries(deliveries)  # a reported record's error explains the failed commit
                if exc.error.code() in UNDELIVERABLE_CODES:  # an unreported record failed; a replay cannot help
                    raise self._undeliverable([exc.error]) from None
                raise
            if deliveries.errors:  # librdkafka never commits a transaction with a failed delivery
                raise PipelineError(
                    f"Batch {committed.batch_id} of {self.pipeline}/{self.source_partition} was committed although "
                    f"records failed ({deliveries.errors[0]}); the topic may miss them. Report this as a bug."
                )
        else:
            # Without a transaction the ledger record must follow the delivered data: written first, a crash
            # between the two would skip data that never arrived.
            self._produce(self.offsets_topic, batch.ledger_record, batch.ledger, self._ledger_partition())
            self._flush(batch.ledger)
        self._check_deliveries(batch.ledger)
        fault_point("after_commit")

    def _produce(
        self, topic: str, message: Message, deliveries: _Deliveries | None, partition: int | None = None
    ) -> None:
        kwargs: dict[str, Any] = {"value": message.value, "key": message.key, "headers": message.headers}
        if partition is not None:
            kwargs["partition"] = partition
        if deliveries is not None:
            kwargs["on_delivery"] = deliveries
        while True:
            try:
                self.producer.produce(topic, **kwargs)
                return
            except BufferError:
                self.producer.poll(0.05)  # the local queue is full: serve delivery reports, then retry
            except KafkaException as exc:
                raise self._produce_error(exc.args[0], topic, message, deliveries) from None

    def _produce_error(
        self, error: KafkaError, topic: str, message: Message, deliveries: _Deliveries | None = None
    ) -> Exception:
        """Return what to raise for a record librdkafka refused (aborting the transaction if needed)."""
        if error.fatal():
            return self._fatal(error)
        if error.txn_requires_abort():
            return _AbortAndReplay(error)
        if error.code() == KafkaError._STATE and self.transactional and deliveries is not None:
            # "Erroneous state": the transaction already failed on an earlier record (e.g. one larger than the
            # topic's max.message.bytes) whose delivery report was not served yet. That report names the cause.
            deadline = time.monotonic() + 2
            while not deliveries.errors and time.monotonic() < deadline:
                self.producer.poll(0.1)
            self._check_deliveries(deliveries)
        self._abort_quietly()
        return DeliveryError(
            f"Cannot produce a record of {len(message.value or b'')} bytes to {topic!r}: {error.str()} "
            f"({error.name()}). Nothing of this batch is committed.{_advice(error)}"
        )

    def _flush(self, deliveries: _Deliveries) -> None:
        deadline = time.monotonic() + self.transaction_timeout_s + 30
        while self.producer.flush(0.5) > 0:
            if deliveries.errors:
                # The batch has failed: stop waiting for the rest (it would sit until transaction.timeout.ms);
                # aborting purges what is still queued.
                break
            if time.monotonic() > deadline:
                raise _Recreate(f"records still undelivered after {self.transaction_timeout_s + 30:.0f}s")
        self._check_deliveries(deliveries)

    def _check_deliveries(self, deliveries: _Deliveries) -> None:
        if not deliveries.errors:
            return
        if self.transactional and all(e.code() in PURGED_CODES for e in deliveries.errors):
            # librdkafka purged these records because the transaction failed on a record without a delivery
            # report; the commit refuses and names the cause (see _commit_batch).
            return
        error = next(e for e in deliveries.errors if e.code() not in PURGED_CODES)
        fatal = next((e for e in deliveries.errors if e.fatal()), None)
        if fatal is not None:
            raise self._fatal(fatal)
        if self.transactional and all(e.retriable() or e.txn_requires_abort() for e in deliveries.errors):
            raise _AbortAndReplay(error)
        raise self._undeliverable(deliveries.errors)

    def _undeliverable(self, errors: list[KafkaError]) -> DeliveryError:
        """Abort the transaction of records that cannot be delivered; return the error to raise."""
        self._abort_quietly()
        error = errors[0]
        return DeliveryError(
            f"{len(errors)} record(s) (or record batches) of {self.pipeline}/{self.source_partition} were not "
            f"delivered, first: {error.str()} ({error.name()}). "
            + (
                "The transaction was aborted; nothing of this batch is visible."
                if self.transactional
                else "at_least_once mode: the batch will be produced again on retry."
            )
            + _advice(error)
        )

    def _abort(self) -> bool:
        """Abort the open transaction; return False if the producer must be recreated instead."""
        try:
            self._retry("abort_transaction", self.producer.abort_transaction, self.transaction_timeout_s)
            return True
        except (_AbortAndReplay, _Recreate) as exc:
            self.log.warning("Abort failed (%s); recreating the producer aborts the transaction", exc)
            return False

    def _abort_quietly(self) -> None:
        if self.transactional and not self._abort():
            self.close(timeout=0)  # the next init_transactions of this id (or the broker's timeout) aborts it

    def _ledger_partition(self) -> int:
        """The offsets-topic partition of this pipeline: chosen here, not by librdkafka's partitioner, so it is
        the one partition :func:`read_committed_offset` reads."""
        count = check_ledger_partitions(self.offsets_topic, len(self._topic_partitions(self.offsets_topic)))
        return ledger_partition(self.pipeline, count)

    def _topic_partitions(self, topic: str) -> list[int]:
        if topic not in self._partitions:
            metadata = self.producer.list_topics(topic, timeout=30).topics[topic]
            if metadata.error is not None:
                raise ValueError(f"Topic {topic!r} is not available: {metadata.error.str()}")
            self._partitions[topic] = sorted(metadata.partitions)
        return self._partitions[topic]

    def _retry(self, what: str, call: Callable, *args: Any) -> Any:
        """Call a transactional API method, repeating it while librdkafka says the error is retriable."""
        deadline = time.monotonic() + 2 * self.transaction_timeout_s
        while True:
            try:
                return self._classify(what, call, *args)
            except _Retry as exc:
                if time.monotonic() > deadline:
                    # An indefinite outcome (Jepsen): only a new producer plus the ledger tell what happened.
                    raise _Recreate(exc.error) from None
                self.log.warning("%s failed with a retriable error (%s); calling it again", what, exc.error)
                time.sleep(0.5)

    def _classify(self, what: str, call: Callable, *args: Any) -> Any:
        try:
            return call(*args)
        except KafkaException as exc:
            error = exc.args[0]
            if error.fatal() or error.code() in FENCED_CODES:
                raise self._fatal(error) from None
            if error.retriable():
                raise _Retry(error) from None
            if error.txn_requires_abort():
                raise _AbortAndReplay(error) from None
            raise _Recreate(error) from None

    def _fatal(self, error: KafkaError) -> Exception:
        if error.code() in FENCED_CODES or (error.code() == KafkaError._FATAL and "fenced" in error.str().lower()):
            return ProducerFencedError(
                f"Producer {self.transactional_id} was fenced: a newer writer with the same transactional id "
                f"took over ({error.str()}). Its open transaction is aborted and never visible; this attempt "
                "stops so the two writers do not fight. Make sure only one task writes this source partition."
            )
        return _Recreate(error)


def _advice(error: KafkaError) -> str:
    """Return what to change for a delivery error the user can fix, or an empty string."""
    if error.code() in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE):
        return (
            " A record (or a record batch) is larger than the topic's max.message.bytes or the producer's "
            "message.max.bytes allows: raise the topic's max.message.bytes (and the broker's "
            "message.max.bytes / replica.fetch.max.bytes), keep producer_config batch.size below it, or "
            "make the records smaller."
        )
    return ""


class _Retry(Exception):
    def __init__(self, error: KafkaError) -> None:
        super().__init__(error)
        self.error = error
