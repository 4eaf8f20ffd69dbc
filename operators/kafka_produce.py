"""Operator: produce a source partition to Kafka exactly once (or, explicitly, at least once)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from airflow.providers.common.compat.module_loading import import_string
from airflow.sdk import BaseOperator

from exactly_once_provider import lineage
from exactly_once_provider import lineage_facets as facets
from exactly_once_provider.hooks.kafka_producer import TransactionalProducerHook
from exactly_once_provider.kafka.offsets import DEFAULT_OFFSETS_TOPIC, DELIVERY_MODES, CommittedOffset
from exactly_once_provider.kafka.writer import MIN_RECORDS_PER_TRANSACTION, PipelineWriter, TransactionPolicy
from exactly_once_provider.operators.failures import fail_task_on_pipeline_error
from exactly_once_provider.plugins.links import PipelineStatusLink

PROGRESS_EVERY_S = 10.0


@dataclass(frozen=True)
class SourceRecord:
    """
    One record from the source, with the source position it comes from.

    :param offset: the record's source position (JSON-serialisable); the ledger stores the offset of the
        last record of each committed transaction, and a restart passes it back to the producer function.
    :param value: the record value (``str`` is UTF-8 encoded).
    :param key: the record key (``str`` is UTF-8 encoded); records of one key keep their order.
    :param headers: optional record headers.
    :param commit_point: whether a transaction may end after this record (False inside a source transaction).
    """

    offset: Any
    value: bytes | str | None
    key: bytes | str | None = None
    headers: dict[str, bytes] | None = None
    commit_point: bool = True


class TransactionalProduceOperator(facets.OpenLineageMixin, BaseOperator):
    """
    Produce the records of a user function to a topic; each Kafka transaction commits its source offset.

    The producer function is called as ``producer_function(resume_after, *args, **kwargs)`` where
    ``resume_after`` is the offset of the last committed record (None on the first run), read from the
    offsets ledger with ``read_committed``. It returns an iterable of :class:`SourceRecord` (or
    ``(offset, key, value)`` tuples) that come strictly after ``resume_after``, in source order.
    A rerun therefore continues where the last commit ended, and is a no-op if nothing is new.

    Any delivery or commit failure fails the task; in ``exactly_once`` mode nothing of the failed
    transaction is visible. The return value (XCom) mirrors the committed offset and counts for display;
    the truth stays in the offsets topic.

    :param topic: the data topic.
    :param pipeline: the pipeline name (with ``source_partition``, it names the transactional id).
    :param delivery_mode: ``"exactly_once"`` or ``"at_least_once"``; required, there is no fallback.
    :param producer_function: a callable or its dotted import path.
    :param producer_function_args: positional arguments after ``resume_after``.
    :param producer_function_kwargs: keyword arguments for the producer function.
    :param source_partition: the source partition this task owns.
    :param kafka_config_id: the Airflow ``kafka`` connection id.
    :param offsets_topic: the compacted offsets topic.
    :param max_records_per_transaction: commit once a transaction holds this many records.
    :param commit_interval_ms: commit at least this often.
    :param allow_small_transactions: accept a policy below 100 records / 100 ms per transaction.
    :param batch_id: name the whole run as ONE batch (e.g. a settlement window ``"2026-11-20"``): all
        records go into one transaction framed by begin/end markers; a rerun of a batch already committed
        with the same ``batch_version`` is a no-op.
    :param batch_version: bump to re-produce a committed ``batch_id`` on purpose.
    :param batch_markers: frame every transaction with begin/end markers in each partition of the topic.
    :param producer_config: extra producer settings (``linger.ms``, ``batch.size``, ``compression.type``...).
    """

    template_fields: Sequence[str] = (
        "topic",
        "pipeline",
        "delivery_mode",
        "producer_function_args",
        "producer_function_kwargs",
        "source_partition",
        "kafka_config_id",
        "offsets_topic",
        "batch_id",
        "batch_version",
    )
    ui_color = "#e8f4ea"
    operator_extra_links = (PipelineStatusLink(),)

    def __init__(
        self,
        *,
        topic: str,
        pipeline: str,
        delivery_mode: str,
        producer_function: str | Callable,
        producer_function_args: Sequence[Any] | None = None,
        producer_function_kwargs: dict[str, Any] | None = None,
        source_partition: str = "0",
        kafka_config_id: str = "kafka_default",
        offsets_topic: str = DEFAULT_OFFSETS_TOPIC,
        max_records_per_transaction: int = 10_000,
        commit_interval_ms: int = 1_000,
        allow_small_transactions: bool = False,
        batch_id: str | None = None,
        batch_version: int = 1,
        batch_markers: bool = False,
        producer_config: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.topic = topic
        self.pipeline = pipeline
        self.delivery_mode = delivery_mode
        self.producer_function = producer_function
        self.producer_function_args = producer_function_args or ()
        self.producer_function_kwargs = producer_function_kwargs or {}
        self.source_partition = source_partition
        self.kafka_config_id = kafka_config_id
        self.offsets_topic = offsets_topic
        self.max_records_per_transaction = max_records_per_transaction
        self.commit_interval_ms = commit_interval_ms
        self.allow_small_transactions = allow_small_transactions
        self.batch_id = batch_id
        self.batch_version = batch_version
        self.batch_markers = batch_markers
        self.producer_config = producer_config

    @fail_task_on_pipeline_error()
    def execute(self, context: Any) -> dict[str, Any]:
        if self.delivery_mode not in DELIVERY_MODES:
            raise ValueError(
                f"delivery_mode={self.delivery_mode!r}: choose 'exactly_once' (Kafka transactions) or "
                "'at_least_once' (idempotent producer; downstream dedupes by key). There is no default."
            )
        if not self.topic or not isinstance(self.topic, str):
            raise ValueError(f"topic={self.topic!r}: name the Kafka topic to produce to.")
        self.batch_version = int(self.batch_version)
        function = self._producer_function()
        policy = TransactionPolicy(
            self.max_records_per_transaction, self.commit_interval_ms, self.allow_small_transactions
        ).validate()
        hook = TransactionalProducerHook(
            self.kafka_config_id,
            pipeline=self.pipeline,
            source_partition=self.source_partition,
            delivery_mode=self.delivery_mode,
            offsets_topic=self.offsets_topic,
            producer_config=self.producer_config,
            batch_markers=self.batch_markers or self.batch_id is not None,
        )
        writer = hook.open_writer()
        try:
            self.openlineage_result = self._run(writer, function, policy)
            return self.openlineage_result
        finally:
            writer.close()

    def openlineage_datasets(self, result: dict | None) -> tuple[list, list]:
        """The topic out, with the source offset committed with it (the producer function's input is its own)."""
        topic = lineage.kafka_topic_of(self.kafka_config_id, self.topic)
        if result is None:
            return [], [facets.output_dataset(topic)]
        offset = result.get("committed_offset")
        commit = facets.CommitFacet(
            pipeline=self.pipeline,
            position=None if offset is None else json.dumps(offset, sort_keys=True),
            kafkaOffsets={self.topic: result.get("partition_offsets", {})} if result.get("partition_offsets") else None,
        )
        rows = 0 if result.get("skipped") else result["records"]
        return [], [facets.output_dataset(topic, rows=rows, commit=commit)]

    def _producer_function(self) -> Callable:
        function = self.producer_function
        if isinstance(function, str):
            function = import_string(function)
        if not callable(function):
            raise ValueError(f"producer_function must be a callable or its dotted path, got {function!r}.")
        return function

    def _run(self, writer: PipelineWriter, function: Callable, policy: TransactionPolicy) -> dict[str, Any]:
        resumed = writer.last_committed
        summary = {
            "pipeline": self.pipeline,
            "source_partition": self.source_partition,
            "delivery_mode": self.delivery_mode,
            "transactional_id": writer.transactional_id,
            "topic": self.topic,
            "resumed_after": resumed.offset if resumed else None,
            "records": 0,
            "transactions": 0,
        }
        if self.batch_id is not None and resumed is not None and resumed.batch_id == self.batch_id:
            if resumed.batch_version >= self.batch_version:
                self.log.info(
                    "Batch %s version %d is already committed (at offset %r); nothing to do. Raise "
                    "batch_version to produce it again on purpose.",
                    self.batch_id,
                    resumed.batch_version,
                    resumed.offset,
                )
                return {
                    **summary,
                    "committed_offset": resumed.offset,
                    "batch_id": resumed.batch_id,
                    "batch_version": resumed.batch_version,
                    "skipped": True,
                }
        batch: list[tuple] = []  # Message-shaped plain tuples
        batch_offset: Any = None
        started = txn_started = time.monotonic()
        one_batch = self.batch_id is not None

        def count(committed: CommittedOffset | None) -> None:
            if committed is not None:
                summary["records"] += committed.records
                summary["transactions"] += 1
                summary.update(
                    committed_offset=committed.offset,
                    sequence=committed.sequence,
                    batch_id=committed.batch_id,
                    batch_version=committed.batch_version,
                )

        def commit() -> None:
            # The commit finishes in the background while the next batch is collected; submit_batch first
            # waits for the previous one (and raises its error), so what `count` sees is committed.
            count(
                writer.submit_batch(
                    self.topic, batch, batch_offset, batch_id=self.batch_id, batch_version=self.batch_version
                )
            )

        # The hot loop (one pass per record): names bound locally, one clock read and two comparisons a record.
        monotonic, max_records, interval_s = time.monotonic, policy.max_records, policy.commit_interval_ms / 1000
        commit_at = float("inf") if one_batch else txn_started + interval_s
        report_at = started + PROGRESS_EVERY_S
        for item in function(summary["resumed_after"], *self.producer_function_args, **self.producer_function_kwargs):
            if type(item) is tuple and len(item) == 3:  # the common shape: no dataclass per record
                batch_offset, key, value = item
                # Plain tuples in Message's field order: the garbage collector untracks them (not a Message).
                batch.append(
                    (
                        value if type(value) is bytes else _encode(value),
                        key if type(key) is bytes else _encode(key),
                        None,
                        None,
                    )
                )
                commit_point = True
            else:
                record = _as_record(item)
                batch.append((_encode(record.value), _encode(record.key), record.headers, None))
                batch_offset, commit_point = record.offset, record.commit_point
            now = monotonic()
            if now < commit_at and now < report_at and len(batch) < max_records:
                continue
            if commit_point and not one_batch and (len(batch) >= max_records or now >= commit_at):
                commit()
                batch, txn_started = [], monotonic()
                commit_at = txn_started + interval_s
            if now >= report_at:
                done = summary["records"] + len(batch)
                self.log.info(
                    "%d records (%.0f/s), %d transactions committed, last offset %r",
                    done,
                    done / (now - started),
                    summary["transactions"],
                    batch_offset,
                )
                report_at = now + PROGRESS_EVERY_S
        if batch:
            commit()
        count(writer.wait())
        self._report(summary, time.monotonic() - started, writer)
        return summary

    def _report(self, summary: dict[str, Any], elapsed: float, writer: PipelineWriter) -> None:
        summary["partition_offsets"] = {
            str(partition): offset
            for (topic, partition), offset in sorted(writer.partition_offsets.items())
            if topic == self.topic
        }
        if summary["transactions"] == 0:
            self.log.info("Nothing new after offset %r; nothing produced.", summary["resumed_after"])
            summary["committed_offset"] = summary["resumed_after"]
            return
        per_txn = summary["records"] / summary["transactions"]
        self.log.info(
            "Committed %d records in %d transactions (%.0f records/s), offset %r -> %r",
            summary["records"],
            summary["transactions"],
            summary["records"] / max(elapsed, 1e-9),
            summary["resumed_after"],
            summary["committed_offset"],
        )
        if summary["transactions"] > 1 and per_txn < MIN_RECORDS_PER_TRANSACTION:
            self.log.warning(
                "Transactions averaged %.1f records: the source delivers records slower than "
                "commit_interval_ms=%d collects a useful batch. Raise commit_interval_ms to cut commit "
                "overhead.",
                per_txn,
                self.commit_interval_ms,
            )


def _as_record(item: Any) -> SourceRecord:
    if isinstance(item, SourceRecord):
        return item
    if isinstance(item, tuple) and len(item) == 3:
        return SourceRecord(offset=item[0], key=item[1], value=item[2])
    raise TypeError(
        f"producer_function yielded {item!r}; yield SourceRecord(offset=..., value=..., key=...) or an "
        "(offset, key, value) tuple."
    )


def _encode(value: bytes | str | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise TypeError(f"Record keys and values must be bytes, str or None, got {type(value).__name__}.")
