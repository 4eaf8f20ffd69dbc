"""The offsets ledger: the ONE place where a pipeline's source offset is committed and read back.

Every Kafka transaction of a pipeline writes, next to its data, one record to a compacted offsets topic.
Both commit together or not at all, so a ``read_committed`` read of the latest record for a key is the only
resume point of that pipeline: no Airflow state, no consumer-group offset, no local file.

Offsets topic format (schema version 1)
---------------------------------------
* topic: compacted (``cleanup.policy=compact``), default name :data:`DEFAULT_OFFSETS_TOPIC`.
* key: UTF-8 ``"<pipeline>/<source_partition>"``; both names match :data:`NAME_PATTERN`, so ``/`` never
  appears inside a name and the key is unambiguous. Compaction keeps the latest record per key.
* value: UTF-8 JSON object::

    {
      "schema_version": 1,              # bump on any incompatible change; readers refuse newer versions
      "pipeline": "orders_cdc",
      "source_partition": "db1.orders",
      "offset": <JSON>,                 # the source position covered, inclusive (int, str or object)
      "sequence": 42,                   # 1 for the first transaction of this key, +1 per commit
      "batch_id": "42",                 # the caller's batch identity (a window name) or str(sequence)
      "batch_version": 1,               # bumps when the same batch is deliberately re-produced
      "records": 750,                   # data records in this transaction (markers excluded)
      "transactional_id": "eo-txn/orders_cdc/db1.orders",   # null in at_least_once mode
      "delivery_mode": "exactly_once",  # or "at_least_once"
      "committed_at": "2026-11-21T00:00:00.000000+00:00"    # producer clock, for display only
    }

Batch markers (:func:`marker_value`) use the same JSON style with ``"marker": "begin"|"end"`` and carry the
``eo.marker`` header, so a consumer of a data topic can tell markers from data without parsing values.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from exactly_once_provider.kafka.topic_reader import read_until

OFFSETS_SCHEMA_VERSION = 1
DEFAULT_OFFSETS_TOPIC = "eo-offsets"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
MARKER_HEADER = "eo.marker"
DELIVERY_MODES = ("exactly_once", "at_least_once")


def validate_name(kind: str, value: object) -> str:
    """
    Return ``value`` if it is a valid pipeline or source-partition name, else raise ``ValueError``.

    :param kind: what the name is, for the error message (``"pipeline"``, ``"source_partition"``).
    :param value: the candidate name.
    """
    if not isinstance(value, str) or not NAME_PATTERN.match(value):
        raise ValueError(
            f"Invalid {kind} {value!r}: use 1-100 characters from letters, digits, '.', '_' and '-', "
            "starting with a letter or digit. It names the transactional id and the offsets key, so it "
            "must stay the same across retries and differ between concurrent writers."
        )
    return value


def ledger_key(pipeline: str, source_partition: str) -> bytes:
    """Return the offsets-topic key of one pipeline's source partition."""
    return f"{validate_name('pipeline', pipeline)}/{validate_name('source_partition', source_partition)}".encode()


@dataclass(frozen=True)
class CommittedOffset:
    """One record of the offsets topic: the source offset a committed transaction covers, and its batch."""

    pipeline: str
    source_partition: str
    offset: Any
    sequence: int
    batch_id: str
    batch_version: int
    records: int
    transactional_id: str | None
    delivery_mode: str
    committed_at: str
    schema_version: int = OFFSETS_SCHEMA_VERSION

    @property
    def key(self) -> bytes:
        return ledger_key(self.pipeline, self.source_partition)

    def to_value(self) -> bytes:
        """Serialise to the versioned JSON value of the offsets topic."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_value(cls, value: bytes) -> CommittedOffset:
        """
        Parse an offsets-topic value, refusing unknown schema versions.

        :param value: the raw record value.
        """
        try:
            data = json.loads(value)
        except ValueError as err:
            raise ValueError(f"Offsets record is not JSON ({err}): {value[:200]!r}") from err
        version = data.get("schema_version") if isinstance(data, dict) else None
        if version != OFFSETS_SCHEMA_VERSION:
            raise ValueError(
                f"Offsets record has schema_version {version!r}; this provider reads version "
                f"{OFFSETS_SCHEMA_VERSION}. Upgrade the provider before resuming this pipeline."
            )
        fields = set(cls.__dataclass_fields__)
        missing = fields - set(data)
        if missing:
            raise ValueError(f"Offsets record lacks {sorted(missing)}: {value[:200]!r}")
        return cls(**{name: data[name] for name in fields})


def new_committed_offset(pipeline: str, source_partition: str, offset: Any, sequence: int, batch_id: str,
                         batch_version: int, records: int, transactional_id: str | None,
                         delivery_mode: str) -> CommittedOffset:
    """Build the ledger record of a transaction about to be committed (stamped with the producer clock)."""
    json.dumps(offset)  # fail before producing anything if the offset cannot be stored
    return CommittedOffset(
        pipeline=pipeline, source_partition=source_partition, offset=offset, sequence=sequence, batch_id=batch_id,
        batch_version=batch_version, records=records, transactional_id=transactional_id,
        delivery_mode=delivery_mode, committed_at=datetime.now(timezone.utc).isoformat(),
    )


def marker_value(kind: str, committed: CommittedOffset, partition_records: int | None = None) -> bytes:
    """
    Return the value of a batch begin/end marker written into a data-topic partition.

    :param kind: ``"begin"`` or ``"end"``.
    :param committed: the ledger record of the transaction the marker frames.
    :param partition_records: for ``"end"``: how many data records of the batch this partition holds.
    """
    body = {
        "schema_version": OFFSETS_SCHEMA_VERSION, "marker": kind, "pipeline": committed.pipeline,
        "source_partition": committed.source_partition, "sequence": committed.sequence,
        "batch_id": committed.batch_id,
        "batch_version": committed.batch_version,
    }
    if kind == "end":
        body.update(offset=committed.offset, records=partition_records, batch_records=committed.records)
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def ensure_offsets_topic(admin_config: dict[str, Any], topic: str = DEFAULT_OFFSETS_TOPIC,
                         replication_factor: int = -1, timeout: float = 30) -> None:
    """
    Create the compacted offsets topic if missing; refuse an existing topic that is not compacted.

    :param admin_config: confluent-kafka client configuration (at least ``bootstrap.servers``).
    :param topic: the offsets topic name.
    :param replication_factor: -1 uses the broker's ``default.replication.factor``.
    :param timeout: seconds to wait for the broker.
    """
    admin = AdminClient(_admin_only(admin_config))
    if topic not in admin.list_topics(timeout=timeout).topics:
        future = admin.create_topics(
            [NewTopic(topic, 1, replication_factor, config={"cleanup.policy": "compact"})])[topic]
        try:
            future.result(timeout=timeout)
        except KafkaException as err:
            if err.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    deadline = time.monotonic() + timeout
    while True:
        try:
            config = admin.describe_configs([resource])[resource].result(timeout=timeout)
            break
        except KafkaException as err:
            # A topic just created may not be known to the broker's metadata cache yet.
            if err.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    policy = config["cleanup.policy"].value
    if "compact" not in policy or "delete" in policy:
        raise ValueError(
            f"Offsets topic {topic!r} has cleanup.policy={policy!r}; it must be 'compact' so the last "
            "committed offset of every pipeline is kept forever. Alter the topic or choose another name."
        )


def read_committed_offset(consumer_config: dict[str, Any], pipeline: str, source_partition: str,
                          topic: str = DEFAULT_OFFSETS_TOPIC, timeout: float = 120) -> CommittedOffset | None:
    """
    Return the last committed offset of ``pipeline``/``source_partition``, or None if it never committed.

    Reads the whole offsets topic with ``read_committed`` up to the high watermark seen at the start (asked
    with ``read_uncommitted``: a read_committed client reports the last stable offset instead, which stops
    before the first open transaction). Reaching that watermark means every transaction open when the read
    began (ours, fenced by ``init_transactions``, or another pipeline's) has ended: no committed record of
    this key can hide behind another pipeline's open transaction.

    :param consumer_config: confluent-kafka configuration (at least ``bootstrap.servers``).
    :param pipeline: the pipeline name.
    :param source_partition: the source partition name.
    :param topic: the offsets topic.
    :param timeout: seconds before giving up; should exceed the producers' ``transaction.timeout.ms``.
    """
    key = ledger_key(pipeline, source_partition)
    latest = _latest_values(consumer_config, topic, timeout, key.__eq__)
    return CommittedOffset.from_value(latest[key]) if key in latest else None


def read_ledger(consumer_config: dict[str, Any], topic: str = DEFAULT_OFFSETS_TOPIC,
                timeout: float = 120) -> dict[str, CommittedOffset | ValueError]:
    """
    Return the last committed record of every key of the offsets topic (for display and discovery).

    Reads like :func:`read_committed_offset`. A record this provider cannot parse (newer schema version, not
    JSON) is returned as its ``ValueError`` instead of hiding the key.

    :param consumer_config: confluent-kafka configuration (at least ``bootstrap.servers``).
    :param topic: the offsets topic.
    :param timeout: seconds before giving up.
    """
    result: dict[str, CommittedOffset | ValueError] = {}
    for key, value in _latest_values(consumer_config, topic, timeout, lambda _: True).items():
        try:
            result[key.decode()] = CommittedOffset.from_value(value)
        except ValueError as err:
            result[key.decode(errors="replace")] = err
    return result


def topic_end_offsets(config: dict[str, Any], topic: str) -> dict[int, int]:
    """
    Return the end offset (high watermark, open transactions included) of every partition of ``topic``.

    :param config: confluent-kafka configuration (at least ``bootstrap.servers``).
    :param topic: the topic; ``ValueError`` if it does not exist.
    """
    consumer = _consumer(config, "read_uncommitted")
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics.get(topic)
        if metadata is None or metadata.error is not None:
            raise ValueError(f"Topic {topic!r} does not exist.")
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                for p in sorted(metadata.partitions)}
    finally:
        consumer.close()


def _latest_values(consumer_config: dict[str, Any], topic: str, timeout: float,
                   wanted: Callable[[bytes], bool]) -> dict[bytes, bytes]:
    """Return the latest committed value of each key for which ``wanted(key)`` holds (see read_committed_offset)."""
    try:
        targets = topic_end_offsets(consumer_config, topic)
    except ValueError as err:
        raise ValueError(f"Offsets topic {topic!r} does not exist; create it with ensure_offsets_topic().") from err
    consumer = _consumer(consumer_config, "read_committed")
    try:
        latest: dict[bytes, bytes] = {}
        for message in read_until(consumer, topic, {p: OFFSET_BEGINNING for p in targets}, targets, timeout,
                                  "A transaction stays open on it; it ends at the producer's "
                                  "transaction.timeout.ms."):
            if message.key() is not None and message.value() is not None and wanted(message.key()):
                latest[message.key()] = message.value()
        return latest
    finally:
        consumer.close()


def _consumer(config: dict[str, Any], isolation_level: str) -> Consumer:
    return Consumer({
        **_admin_only(config),
        "group.id": f"eo-offsets-reader-{uuid.uuid4().hex[:12]}",
        "isolation.level": isolation_level,
        "enable.auto.commit": False,
        "enable.partition.eof": True,
    })


def _admin_only(config: dict[str, Any]) -> dict[str, Any]:
    """Keep the connection settings of a producer config and drop producer-only ones."""
    producer_only = {"transactional.id", "enable.idempotence", "acks", "linger.ms", "batch.size",
                     "transaction.timeout.ms", "compression.type", "queue.buffering.max.messages",
                     "queue.buffering.max.kbytes", "message.timeout.ms", "delivery.timeout.ms",
                     "max.in.flight.requests.per.connection", "retries", "batch.num.messages"}
    return {k: v for k, v in config.items() if k not in producer_only}
