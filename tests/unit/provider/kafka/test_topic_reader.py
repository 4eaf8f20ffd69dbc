"""read_until stops exactly at the end offsets fixed at the start, whatever the consumer's pace."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from exactly_once_provider.kafka.topic_reader import read_until


class FakeMessage:
    def __init__(self, partition: int, offset: int, error: KafkaError | None = None) -> None:
        self._partition, self._offset, self._error = partition, offset, error

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def error(self) -> KafkaError | None:
        return self._error


class FakeConsumer:
    def __init__(self, polls: list) -> None:
        self.polls, self.assigned = list(polls), None

    def assign(self, partitions) -> None:
        self.assigned = sorted((tp.partition, tp.offset) for tp in partitions)

    def poll(self, timeout: float):
        return self.polls.pop(0) if self.polls else None


def eof(partition: int, offset: int) -> FakeMessage:
    return FakeMessage(partition, offset, KafkaError(KafkaError._PARTITION_EOF))


def test_reads_each_partition_to_its_end_and_skips_empty_ones():
    consumer = FakeConsumer(
        [None, FakeMessage(0, 0), FakeMessage(1, 5), FakeMessage(0, 1), FakeMessage(0, 2), FakeMessage(1, 6)]
    )
    got = [(m.partition(), m.offset()) for m in read_until(consumer, "t", {0: 0, 1: 5, 2: 3}, {0: 2, 1: 7, 2: 3}, 5)]
    # partition 0 ends after offset 1 (end offset 2): its record at offset 2 arrived later and is not yielded.
    assert got == [(0, 0), (1, 5), (0, 1), (1, 6)]
    assert consumer.assigned == [(0, 0), (1, 5)]


def test_end_of_partition_short_of_the_end_keeps_waiting_and_at_the_end_finishes():
    # read_committed: a transaction marker at offset 3 is never delivered, EOF reports offset 4 == end.
    consumer = FakeConsumer([FakeMessage(0, 2), eof(0, 3), None, eof(0, 4)])
    got = [m.offset() for m in read_until(consumer, "t", {0: 2}, {0: 4}, 5)]
    assert got == [2] and consumer.polls == []


def test_a_partition_that_never_reaches_its_end_times_out_with_the_hint():
    consumer = FakeConsumer([])
    with pytest.raises(TimeoutError, match="did not reach offsets .*an open transaction"):
        list(read_until(consumer, "t", {0: 0}, {0: 1}, 0.6, "an open transaction"))


def test_other_consumer_errors_raise():
    consumer = FakeConsumer([FakeMessage(0, 0, KafkaError(KafkaError._TRANSPORT))])
    with pytest.raises(KafkaException):
        list(read_until(consumer, "t", {0: 0}, {0: 1}, 5))
