"""When the changes around a sink's position were committed at the source, read from the records themselves.

Two readers of a sink's position in its topics (the next offset of each partition) need the source side of it:

* :func:`unapplied_since`: the source commit time of the first change the sink has NOT applied, per partition
  (the status page's and the commit events' freshness: 0 when nothing is unapplied);
* :func:`newest_applied`: the newest change the sink HAS applied (its binlog position and commit time), for a
  commit event to say how far the source is in the sink.

A binlog change record (docs/formats.md) carries its commit time (``commit_ts``, whole seconds), its position
(``source.commit_file``/``commit_pos``, ``gtid``) and a ``version`` that increases with binlog order; another
record has only its Kafka time. Both read through a ``read_committed`` consumer: an aborted or open transaction's
records are not changes of the source.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

# offsets read back before a partition's next offset to find the last applied record: the offset right before it
# is usually its transaction's commit marker, and aborted batches (a killed capture) leave a few more
LOOK_BACK = 16


def _change(value: bytes | None) -> dict | None:
    """Return a binlog change record's JSON value, None for any other record."""
    if not value or not value.startswith(b'{"'):
        return None
    try:
        found = json.loads(value)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def source_commit_time(value: bytes | None) -> float | None:
    """Return the source commit time (epoch seconds) of a binlog change record's value, None for other records."""
    stamp = (_change(value) or {}).get("commit_ts")
    try:
        return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except (ValueError, TypeError):
        return None


def unapplied_since(consumer: Any, lagging: list[tuple[str, int, int]], wait: float = 2.0) -> dict:
    """Return ``{(topic, partition): epoch seconds}`` of the first record at each sink's next offset: its source
    commit time if it is a binlog change record, else (or if earlier) its Kafka time.

    One fetch for all the partitions, at most ``wait`` seconds (a partition whose next records are in an open
    transaction has none to read yet and is left out).

    :param consumer: a read_committed Kafka consumer.
    :param lagging: ``(topic, partition, sink next offset)`` of partitions with lag.
    :param wait: the most seconds to wait for the records.
    """
    from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, TopicPartition

    consumer.assign([TopicPartition(t, p, o) for t, p, o in lagging])
    pending, found = {(t, p) for t, p, _ in lagging}, {}
    deadline = time.monotonic() + wait
    try:
        while pending and time.monotonic() < deadline:
            message = consumer.poll(max(0.0, deadline - time.monotonic()))
            if message is None or message.error() or (message.topic(), message.partition()) not in pending:
                continue
            pending.discard((message.topic(), message.partition()))
            kind, stamp = message.timestamp()
            times = [stamp / 1000] if kind != TIMESTAMP_NOT_AVAILABLE else []
            committed = source_commit_time(message.value())
            if committed is not None:
                times.append(committed)
            if times:
                found[(message.topic(), message.partition())] = min(times)
    finally:
        consumer.unassign()
    return found


def newest_applied(consumer: Any, applied: list[tuple[str, int, int]], wait: float = 2.0) -> dict | None:
    """Return the newest binlog change a sink applied: ``{"file", "pos", "gtid", "committed_at"}``, or None.

    Reads each partition's last committed record before the sink's next offset (the last :data:`LOOK_BACK`
    offsets) and keeps the change with the highest ``version``: with several tables the newest of them all.
    None when no partition's last applied record is a change record (an append pipeline's records, nothing
    applied yet, or more than :data:`LOOK_BACK` aborted offsets in a row).

    :param consumer: a read_committed Kafka consumer with ``enable.partition.eof`` on (a partition read to its end
        is done at once).
    :param applied: ``(topic, partition, sink next offset)`` of the partitions the sink reads.
    :param wait: the most seconds to wait for the records.
    """
    from confluent_kafka import KafkaError, TopicPartition

    asked = {(t, p): o for t, p, o in applied if o > 0}
    if not asked:
        return None
    consumer.assign([TopicPartition(t, p, max(0, o - LOOK_BACK)) for (t, p), o in asked.items()])
    last: dict[tuple[str, int], Any] = {}
    deadline = time.monotonic() + wait
    try:
        while asked and time.monotonic() < deadline:
            message = consumer.poll(max(0.0, deadline - time.monotonic()))
            if message is None:
                continue
            where = (message.topic(), message.partition())
            if where not in asked:
                continue
            if message.error():  # the partition's end: a caught-up sink's last offset is a commit marker, never read
                if message.error().code() == KafkaError._PARTITION_EOF:
                    del asked[where]
                continue
            if message.offset() < asked[where]:
                last[where] = message
            if message.offset() >= asked[where] - 1:  # the last applied offset (a record or its commit marker)
                del asked[where]
    finally:
        consumer.unassign()
    changes = [c for c in (_change(m.value()) for m in last.values()) if c is not None and "version" in c]
    if not changes:
        return None
    newest = max(changes, key=lambda c: c["version"])
    source = newest.get("source") or {}
    return {
        "file": source.get("commit_file") or source.get("file"),
        "pos": source.get("commit_pos") or source.get("pos"),
        "gtid": source.get("gtid"),
        "committed_at": newest.get("commit_ts"),
    }


def source_state(config: dict[str, Any], offsets: dict[str, dict], wait: float = 2.0) -> dict[str, Any]:
    """Return where the source is in a sink at its position ``offsets``: ``{"source": newest_applied(...),
    "freshness_s": seconds}``.

    Freshness as the status page counts it: seconds since the source commit of the oldest change the sink has not
    applied, 0 when every partition is read to its end (open transactions and commit markers are not changes).

    :param config: the ``kafka`` connection's client settings.
    :param offsets: the sink's next offset per topic and partition (its commit marker's).
    :param wait: the most seconds each of the two reads waits for records.
    """
    import uuid

    from confluent_kafka import Consumer, TopicPartition

    from exactly_once_provider.kafka.offsets import end_offsets_consumer
    from exactly_once_provider.kafka_config import consumer_config

    applied = [(t, int(p), int(o)) for t, parts in sorted(offsets.items()) for p, o in sorted(parts.items())]
    ends_reader = end_offsets_consumer(config)
    try:
        ends = {(t, p): ends_reader.get_watermark_offsets(TopicPartition(t, p), timeout=10)[1] for t, p, _ in applied}
    finally:
        ends_reader.close()
    settings = {"enable.partition.eof": True, "fetch.wait.max.ms": 10}
    consumer = Consumer(consumer_config(config, f"eo-change-times-{uuid.uuid4().hex[:12]}", "read_committed", settings))
    try:
        lagging = [(t, p, o) for t, p, o in applied if ends[(t, p)] > o]
        since = unapplied_since(consumer, lagging, wait) if lagging else {}
        newest = newest_applied(consumer, applied, wait)
    finally:
        consumer.close()
    freshness = max((max(0.0, time.time() - s) for s in since.values()), default=0.0)
    return {"source": newest, "freshness_s": round(freshness, 1)}
