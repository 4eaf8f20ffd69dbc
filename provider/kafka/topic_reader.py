"""Read partitions of a topic up to end offsets fixed at the start: the one "read to the end" loop.

Readers of the offsets ledger and of committed batches must stop at a known end, not at "no message for a
while": an idle poll says nothing about records still to come. A partition is done when a record at or past
its end offset arrived, or when the consumer reports end-of-partition at or past it (``read_committed``
consumers skip transaction markers and aborted records, so the last offset seen can be short of the end).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition


def read_until(
    consumer: Any, topic: str, starts: dict[int, int], ends: dict[int, int], timeout: float, stuck_hint: str = ""
) -> Iterator[Any]:
    """
    Yield the records of ``topic`` from ``starts`` up to ``ends`` (exclusive end offsets), per partition.

    The consumer must be created with ``enable.partition.eof=True``. Partitions whose start equals their end
    or whose end is 0 are not read.

    :param consumer: a confluent-kafka Consumer (its isolation level decides what is yielded).
    :param topic: the topic.
    :param starts: per partition, the offset (or logical offset such as OFFSET_BEGINNING) to start at.
    :param ends: per partition, the end offset to reach.
    :param timeout: seconds before raising TimeoutError.
    :param stuck_hint: appended to the TimeoutError message (what usually keeps a read from finishing).
    """
    pending = {p for p, end in ends.items() if end > 0 and starts.get(p) != end}
    consumer.assign([TopicPartition(topic, p, starts[p]) for p in sorted(pending)])
    deadline = time.monotonic() + timeout
    while pending:
        if time.monotonic() > deadline:
            raise TimeoutError(f"Reading topic {topic!r} did not reach offsets {ends} within {timeout}s. " + stuck_hint)
        message = consumer.poll(0.5)
        if message is None:
            continue
        if message.error():
            if message.error().code() == KafkaError._PARTITION_EOF:
                if message.offset() >= ends[message.partition()]:
                    pending.discard(message.partition())
                continue
            raise KafkaException(message.error())
        end = ends[message.partition()]
        if message.offset() >= end:  # fetched past the end: records that arrived after the read began
            pending.discard(message.partition())
            continue
        if message.offset() + 1 >= end:
            pending.discard(message.partition())
        yield message
