"""Watermark windows in the offsets ledger: what a committed window records, and where its batch sits in Kafka.

A watermark pipeline stores its state in the ``offset`` field of the offsets ledger record
(:mod:`exactly_once_provider.kafka.offsets`), so the window and its data commit in ONE Kafka transaction and there
is no second ledger. The ledger's schema_version stays 1: ``offset`` was always "any JSON"; a watermark
pipeline's offset is this object (``kind`` tells it apart from other pipelines' offsets)::

    {
      "kind": "watermark", "watermark_version": 1,
      "cursor_kind": "timestamp" | "id",
      "next_lower": "2026-11-21 01:00:00.000000",   # upper bound of the newest window = next lower bound
      "window": {<the window this transaction published>},
      "history": {"<batch_id>": {<window>}, ...}     # the last ``max_windows`` windows, for reruns
    }

and each window is::

    {"batch_id": "...", "batch_version": 1, "lower": <cursor or null>, "upper": <cursor>,
     "upper_reason": "interval_end" | "safety_lag" | "open_transaction" | "max_id" | "lower_bound" | "recorded",
     "rows": 1200, "checksum": "sha256:<hex>", "interval_end": "<ISO-8601 or null>",
     "published_at": "<producer clock ISO-8601>"}

Timestamp cursors are stored as ``YYYY-MM-DD HH:MM:SS.ffffff`` in the session zone of the read (UTC for
TIMESTAMP columns, the data zone for DATETIME columns); id cursors as integers. Bounds are half-open:
``lower <= cursor < upper``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from exactly_once_provider.kafka.offsets import MARKER_HEADER, CommittedOffset
from exactly_once_provider.kafka.topic_reader import read_until
from exactly_once_provider.kafka_config import consumer_config

WATERMARK_VERSION = 1
# Every data record of a window carries this header, so its batch is found even in a topic shared with others.
BATCH_HEADER = "eo.batch"


def batch_header(pipeline: str, source_partition: str, batch_id: str, batch_version: int) -> bytes:
    """Return the ``eo.batch`` header value of the data records of one batch version."""
    return f"{pipeline}/{source_partition}/{batch_id}/v{batch_version}".encode()


@dataclass(frozen=True)
class WindowRecord:
    """One committed window: its bounds, content summary and batch identity."""

    batch_id: str
    batch_version: int
    lower: Any
    upper: Any
    upper_reason: str
    rows: int
    checksum: str
    interval_end: str | None
    published_at: str


@dataclass
class WatermarkState:
    """The watermark part of the ledger: the next lower bound and the recorded windows."""

    cursor_kind: str
    next_lower: Any = None
    history: dict[str, WindowRecord] = field(default_factory=dict)

    @classmethod
    def from_ledger(cls, committed: CommittedOffset | None, cursor_kind: str) -> WatermarkState:
        """
        Return the state recorded by the last committed transaction (an empty state on the first run).

        :param committed: the ledger record read with ``read_committed``.
        :param cursor_kind: the operator's cursor kind; must match what the ledger recorded.
        """
        if committed is None:
            return cls(cursor_kind=cursor_kind)
        offset = committed.offset
        if not isinstance(offset, dict) or offset.get("kind") != "watermark":
            raise ValueError(
                f"The ledger of {committed.pipeline}/{committed.source_partition} holds offset {offset!r}, which "
                "is not a watermark window: another kind of pipeline uses this name. Choose another pipeline "
                "or source_partition."
            )
        if offset.get("watermark_version") != WATERMARK_VERSION:
            raise ValueError(
                f"Watermark ledger version {offset.get('watermark_version')!r} is not "
                f"{WATERMARK_VERSION}; upgrade the provider before resuming."
            )
        if offset["cursor_kind"] != cursor_kind:
            raise ValueError(
                f"The ledger of {committed.pipeline}/{committed.source_partition} was written with "
                f"cursor_kind={offset['cursor_kind']!r}, this task uses {cursor_kind!r}. Keep the cursor kind, "
                "or start a new pipeline name."
            )
        history = {key: WindowRecord(**value) for key, value in offset.get("history", {}).items()}
        return cls(cursor_kind=cursor_kind, next_lower=offset.get("next_lower"), history=history)

    def with_window(self, window: WindowRecord, advance: bool, max_windows: int) -> WatermarkState:
        """Return the state after committing ``window`` (``advance``: its upper becomes the next lower)."""
        history = {k: v for k, v in self.history.items() if k != window.batch_id}
        history[window.batch_id] = window
        while len(history) > max_windows:
            history.pop(next(iter(history)))  # dicts keep insertion order: drop the oldest window
        return WatermarkState(self.cursor_kind, window.upper if advance else self.next_lower, history)

    def to_offset(self, window: WindowRecord) -> dict[str, Any]:
        """Return the ledger ``offset`` JSON of the transaction that publishes ``window``."""
        return {
            "kind": "watermark",
            "watermark_version": WATERMARK_VERSION,
            "cursor_kind": self.cursor_kind,
            "next_lower": self.next_lower,
            "window": asdict(window),
            "history": {key: asdict(value) for key, value in self.history.items()},
        }


def published_now() -> str:
    """Return the producer-clock time stamped on a window (display, and where a batch lookup starts)."""
    return datetime.now().astimezone().isoformat()


def locate_batch(
    client_config: dict[str, Any],
    topic: str,
    pipeline: str,
    source_partition: str,
    batch_id: str,
    batch_version: int,
    published_at: str | None = None,
    timeout: float = 60,
) -> dict[str, dict]:
    """
    Return, per partition, the Kafka offsets of one committed batch: its begin/end markers and data records.

    Data records are recognised by their ``eo.batch`` header (:func:`batch_header`).

    Reads ``topic`` with ``read_committed`` from the first record produced after ``published_at`` minus a
    minute (record timestamps are the producer's create time; the whole topic when ``published_at`` is
    None), up to the end offsets seen at the start.

    :param client_config: the connection's confluent-kafka configuration (at least ``bootstrap.servers``).
    :param topic: the data topic.
    :param pipeline: the pipeline of the batch.
    :param source_partition: the source partition of the batch.
    :param batch_id: the batch identity.
    :param batch_version: the batch version.
    :param published_at: the window's ``published_at`` (ISO-8601).
    :param timeout: seconds before giving up.
    """
    consumer = Consumer(
        consumer_config(
            client_config, f"eo-batch-locator-{uuid.uuid4().hex[:12]}", settings={"enable.partition.eof": True}
        )
    )
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics[topic]
        partitions = sorted(metadata.partitions)
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions}
        starts = dict.fromkeys(partitions, OFFSET_BEGINNING)
        if published_at is not None:
            since_ms = int((datetime.fromisoformat(published_at).timestamp() - 60) * 1000)
            found = consumer.offsets_for_times([TopicPartition(topic, p, since_ms) for p in partitions], 30)
            starts = {tp.partition: tp.offset if tp.offset >= 0 else ends[tp.partition] for tp in found}
        result: dict[str, dict] = {}
        wanted = batch_header(pipeline, source_partition, batch_id, batch_version)
        for message in read_until(consumer, topic, starts, ends, timeout):
            partition = message.partition()
            headers = dict(message.headers() or {})
            marker = headers.get(MARKER_HEADER)
            if marker is not None:
                body = json.loads(message.value())
                ours = (body["pipeline"], body["source_partition"], body["batch_id"], body["batch_version"]) == (
                    pipeline,
                    source_partition,
                    batch_id,
                    batch_version,
                )
                if ours:
                    entry = result.setdefault(str(partition), {"records": 0, "first": None, "last": None})
                    entry["begin_marker" if marker == b"begin" else "end_marker"] = message.offset()
            elif headers.get(BATCH_HEADER) == wanted:
                entry = result.setdefault(str(partition), {"records": 0, "first": None, "last": None})
                entry["records"] += 1
                entry["first"] = message.offset() if entry["first"] is None else entry["first"]
                entry["last"] = message.offset()
        return result
    finally:
        consumer.close()
