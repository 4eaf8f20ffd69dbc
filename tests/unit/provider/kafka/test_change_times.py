"""Source commit times and positions around a sink's position, read from the records (fake consumers; the
real Kafka reads: tests/integration/provider/kafka/test_change_times.py)."""

from __future__ import annotations

from exactly_once_provider.kafka.change_times import newest_applied, source_commit_time, unapplied_since


class Error:
    def code(self):
        from confluent_kafka import KafkaError

        return KafkaError._PARTITION_EOF


class Record:
    """A consumed record (or, with ``eof``, the end-of-partition event) as confluent-kafka's Message shows it."""

    def __init__(self, partition, offset, value=None, stamp=None, eof=False):
        self.partition_, self.offset_, self.value_, self.stamp, self.eof = partition, offset, value, stamp, eof

    def topic(self):
        return "t"

    def partition(self):
        return self.partition_

    def offset(self):
        return self.offset_

    def value(self):
        return self.value_

    def error(self):
        return Error() if self.eof else None

    def timestamp(self):
        return 1, self.stamp


class Replay:
    """A consumer that returns ``records`` in order, as a read_committed consumer would, then nothing."""

    def __init__(self, records):
        self.records = list(records)

    def assign(self, partitions):
        self.assigned = [(p.topic, p.partition, p.offset) for p in partitions]

    def poll(self, timeout):
        return self.records.pop(0) if self.records else None

    def unassign(self):
        pass


def test_freshness_counts_from_a_change_records_source_commit_and_other_records_from_kafka_time():
    from exactly_once_provider.capture.change_record import records_of
    from tests.unit.provider.capture.test_change_record import TOPICS, row, txn

    (change,) = records_of(txn(row("c", None, {"id": 5, "v": 1})), TOPICS)  # committed at 1763694000
    assert source_commit_time(change.value) == 1763694000.0
    assert [source_commit_time(v) for v in (b'{"op":"upsert"}', b"plain", None, b'{"commit_ts":"x"}')] == [None] * 4

    consumer = Replay([Record(0, 40, change.value, 1763694007_000), Record(1, 7, b"plain", 1763694009_500)])
    assert unapplied_since(consumer, [("t", 0, 40), ("t", 1, 7)], wait=1) == {
        ("t", 0): 1763694000.0,
        ("t", 1): 1763694009.5,
    }
    assert consumer.assigned == [("t", 0, 40), ("t", 1, 7)]


def change(version, pos, at):
    return (
        f'{{"op":"u","version":{version},"source":{{"commit_file":"binlog.000002","commit_pos":{pos},'
        f'"gtid":"0-1-{pos}"}},"commit_ts":"{at}"}}'
    ).encode()


def test_the_newest_applied_change_is_the_highest_version_before_each_next_offset():
    consumer = Replay(
        [
            Record(0, 38, change(7, 700, "2026-11-29T01:00:00Z")),
            Record(1, 3, change(9, 900, "2026-11-29T01:00:05Z")),
            Record(0, 39, change(8, 800, "2026-11-29T01:00:02Z")),
            Record(1, 5, change(12, 1200, "2026-11-29T01:00:09Z")),  # past the sink's next offset: not applied
            Record(0, 0, eof=True),
        ]
    )
    found = newest_applied(consumer, [("t", 0, 41), ("t", 1, 5), ("t", 2, 0)], wait=1)
    assert found == {"file": "binlog.000002", "pos": 900, "gtid": "0-1-900", "committed_at": "2026-11-29T01:00:05Z"}
    assert consumer.assigned == [("t", 0, 25), ("t", 1, 0)]  # partition 2: nothing applied, not read
    assert newest_applied(Replay([Record(0, 3, b"plain"), Record(0, 4, eof=True)]), [("t", 0, 5)], wait=1) is None
    assert newest_applied(Replay([]), [("t", 0, 0)], wait=1) is None
