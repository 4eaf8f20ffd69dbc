"""The offsets ledger: the ONE place where a pipeline's source offset is committed and read back.

Every Kafka transaction of a pipeline writes, next to its data, one record to a compacted offsets topic.
Both commit together or not at all, so a ``read_committed`` read of the latest record for a key is the only
resume point of that pipeline: no Airflow state, no consumer-group offset, no local file.

Offsets topic format (schema version 1)
---------------------------------------
* topic: compacted (``cleanup.policy=compact``), default name :data:`DEFAULT_OFFSETS_TOPIC`, created with
  :data:`LEDGER_PARTITIONS` partitions and the compaction settings of :data:`COMPACTION_CONFIG`. A key lives
  in partition :func:`ledger_partition` (CRC-32 of the pipeline name modulo the partition count), so every
  key of one pipeline shares one partition and a reader of one key reads one partition. A topic created
  before partitioning has 1 partition: everything is partition 0 and keeps working unchanged
  (:mod:`~exactly_once_provider.kafka.ledger_migration` copies it into a partitioned topic). The partition
  count of a ledger never changes (a key would move): only 1 or :data:`LEDGER_PARTITIONS` are accepted.
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

Reading one key costs the records written after that key's last record in its partition, not the
partition's history: :func:`read_committed_offset` reads backwards from the end in growing windows until it
meets the key (see there).

Batch markers (:func:`marker_value`) use the same JSON style with ``"marker": "begin"|"end"`` and carry the
``eo.marker`` header, so a consumer of a data topic can tell markers from data without parsing values.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
import zlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from exactly_once_provider.kafka.topic_reader import read_until
from exactly_once_provider.kafka.topics import ensure_topics, partitions_of
from exactly_once_provider.kafka_config import admin_config, consumer_config

OFFSETS_SCHEMA_VERSION = 1
DEFAULT_OFFSETS_TOPIC = "eo-offsets"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
MARKER_HEADER = "eo.marker"
DELIVERY_MODES = ("exactly_once", "at_least_once")
# 16 partitions: another pipeline shares a partition with probability 1/16, so one busy pipeline slows
# ~1/16 of the others (and only until compaction), while a whole-ledger read (the status page) still opens
# few fetches. Never change it for an existing topic: keys would move partitions (migrate instead).
LEDGER_PARTITIONS = 16
# Compaction never touches the active segment: with Kafka's default segment.ms (7 days) a busy pipeline's
# records pile up uncompacted for a week. Rolling hourly with a low dirty ratio keeps each partition near
# "one record per key + the last hour". min.compaction.lag.ms=0: a record is compactable once superseded.
COMPACTION_CONFIG = {
    "cleanup.policy": "compact",
    "segment.ms": str(3_600_000),
    "min.cleanable.dirty.ratio": "0.1",
    "min.compaction.lag.ms": "0",
}
# The backward read starts with the last FIRST_WINDOW records of the key's partition (one fetch of a few
# hundred KB: an active pipeline's last record is almost always there) and multiplies the window by
# WINDOW_GROWTH while the key is not found, so a key far back costs at most ~WINDOW_GROWTH/(WINDOW_GROWTH-1)
# times the records behind it, in O(log n) round trips.
FIRST_WINDOW = 512
WINDOW_GROWTH = 4
log = logging.getLogger(__name__)


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


def ledger_partition(pipeline: str, partitions: int) -> int:
    """
    Return the offsets-topic partition of every key of ``pipeline`` (writer and readers use this, never the
    client library's default partitioner, whose hash differs between clients).

    :param pipeline: the pipeline name.
    :param partitions: the offsets topic's partition count (1 for a legacy ledger: always partition 0).
    """
    if partitions < 1:
        raise ValueError(f"An offsets topic has at least one partition, not {partitions}.")
    return zlib.crc32(validate_name("pipeline", pipeline).encode()) % partitions


def check_ledger_partitions(topic: str, partitions: int) -> int:
    """
    Return ``partitions`` if it is a partition count a ledger may have, else raise ``ValueError``.

    :param topic: the offsets topic (for the message).
    :param partitions: its partition count.
    """
    if partitions not in (1, LEDGER_PARTITIONS):
        raise ValueError(
            f"Offsets topic {topic!r} has {partitions} partitions; a ledger has 1 (legacy) or {LEDGER_PARTITIONS}. "
            "Its partition count must never change (a pipeline's keys would move to another partition and "
            "its resume point would be missed): copy it into a new topic with "
            "exactly_once_provider.kafka.ledger_migration.migrate_ledger instead."
        )
    return partitions


class LedgerMovedError(ValueError):
    """Raise when a key's latest record says its ledger was migrated to another topic."""


def moved_to(value: bytes) -> str | None:
    """
    Return the topic a *moved* record (written by the ledger migration) points to, or None for any other value.

    :param value: a raw offsets-topic value.
    """
    try:
        data = json.loads(value)
    except ValueError:
        return None
    return data.get("moved_to") if isinstance(data, dict) and set(data) == {"schema_version", "moved_to"} else None


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
        target = moved_to(value)
        if target is not None:
            raise LedgerMovedError(
                f"This pipeline's offsets ledger was migrated to topic {target!r}; set offsets_topic={target!r} "
                "(its resume point is there). Nothing was read from the old ledger."
            )
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


def new_committed_offset(
    pipeline: str,
    source_partition: str,
    offset: Any,
    sequence: int,
    batch_id: str,
    batch_version: int,
    records: int,
    transactional_id: str | None,
    delivery_mode: str,
) -> CommittedOffset:
    """Build the ledger record of a transaction about to be committed (stamped with the producer clock)."""
    json.dumps(offset)  # fail before producing anything if the offset cannot be stored
    return CommittedOffset(
        pipeline=pipeline,
        source_partition=source_partition,
        offset=offset,
        sequence=sequence,
        batch_id=batch_id,
        batch_version=batch_version,
        records=records,
        transactional_id=transactional_id,
        delivery_mode=delivery_mode,
        committed_at=datetime.now(UTC).isoformat(),
    )


def marker_value(kind: str, committed: CommittedOffset, partition_records: int | None = None) -> bytes:
    """
    Return the value of a batch begin/end marker written into a data-topic partition.

    :param kind: ``"begin"`` or ``"end"``.
    :param committed: the ledger record of the transaction the marker frames.
    :param partition_records: for ``"end"``: how many data records of the batch this partition holds.
    """
    body = {
        "schema_version": OFFSETS_SCHEMA_VERSION,
        "marker": kind,
        "pipeline": committed.pipeline,
        "source_partition": committed.source_partition,
        "sequence": committed.sequence,
        "batch_id": committed.batch_id,
        "batch_version": committed.batch_version,
    }
    if kind == "end":
        body.update(offset=committed.offset, records=partition_records, batch_records=committed.records)
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def ensure_offsets_topic(
    client_config: dict[str, Any],
    topic: str = DEFAULT_OFFSETS_TOPIC,
    replication_factor: int = -1,
    timeout: float = 30,
    admin: Any = None,
) -> int:
    """
    Create the offsets topic if missing; refuse an existing topic that is not compacted; return its partitions.

    A new topic gets :data:`LEDGER_PARTITIONS` partitions and :data:`COMPACTION_CONFIG`. An existing topic
    whose settings leave compaction ineffective (the active segment rolls too seldom, a high dirty ratio, a
    compaction lag) is used as it is, with a warning naming the settings to alter: refusing it would stop
    every pipeline on upgrade, and its reads stay correct, only slower.

    :param client_config: the connection's confluent-kafka configuration (at least ``bootstrap.servers``).
    :param topic: the offsets topic name.
    :param replication_factor: -1 uses the broker's ``default.replication.factor``.
    :param timeout: seconds to wait for the broker.
    :param admin: an AdminClient already connected with ``client_config`` (saves a TLS and SASL handshake).
    """
    admin = admin or AdminClient(admin_config(client_config))
    ensure_topics(admin, [topic], LEDGER_PARTITIONS, timeout, replication_factor, COMPACTION_CONFIG)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    deadline = time.monotonic() + timeout
    while True:
        try:
            config = admin.describe_configs([resource])[resource].result(timeout=timeout)
            partitions = partitions_of(admin, [topic], timeout)[topic]
            if partitions is None:
                raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
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
    _warn_if_fragile(admin, topic, config, timeout)
    ineffective = compaction_problems({name: entry.value for name, entry in config.items()})
    if ineffective:
        log.warning(
            "Offsets topic %s keeps uncompacted history (%s): every read of it gets slower with "
            "traffic. Alter it with kafka-configs.sh --alter --add-config %s",
            topic,
            ", ".join(ineffective),
            ",".join(f"{k}={v}" for k, v in COMPACTION_CONFIG.items() if k != "cleanup.policy"),
        )
    return check_ledger_partitions(topic, len(partitions))


_WARNED: set[str] = set()  # offsets topics already warned about in this process (every writer open asks)


def durability_problems(replication_factor: int, min_insync_replicas: int) -> list[str]:
    """
    Return the settings under which a broker restart can break the exactly-once contract (empty if none).

    Kafka 4.3.1's transaction coordinator skips the end marker of a partition without a leader and completes
    the transaction anyway (docs/pitfalls.md#kafka): with fewer than 3 replicas, or ``min.insync.replicas`` < 2,
    one broker's restart leaves partitions leaderless, and an open transaction there is later committed with the
    next one (a duplicate) or hangs. The ledger's partitions are the ones this process can see.

    :param replication_factor: the smallest replica count of the topic's partitions.
    :param min_insync_replicas: the topic's ``min.insync.replicas``.
    """
    problems = []
    if replication_factor < 3:
        problems.append(f"replication factor {replication_factor} (< 3)")
    if min_insync_replicas < 2:
        problems.append(f"min.insync.replicas={min_insync_replicas} (< 2)")
    return problems


def _warn_if_fragile(admin: Any, topic: str, config: dict[str, Any], timeout: float) -> None:
    """Log once per process a WARNING when the offsets topic's replication leaves it exposed to a broker restart."""
    from confluent_kafka import TopicCollection

    if topic in _WARNED:
        return
    description = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout)[topic].result(timeout)
    replicas = min(len(p.replicas) for p in description.partitions)
    problems = durability_problems(replicas, int(config["min.insync.replicas"].value or 1))
    _WARNED.add(topic)
    if problems:
        log.warning(
            "Offsets topic %s has %s: a broker restart can leave a transaction's end marker unwritten on a "
            "leaderless partition (Kafka 4.3.1), which later commits an aborted batch with the next one. "
            "In production give the offsets and data topics replication factor >= 3 and "
            "min.insync.replicas=2 (docs/pitfalls.md#kafka).",
            topic,
            " and ".join(problems),
        )


def compaction_problems(config: dict[str, str | None]) -> list[str]:
    """
    Return the topic settings that keep compaction from bounding the ledger (empty if none).

    :param config: the topic's configuration, name -> value.
    """
    limits = {
        "segment.ms": float(COMPACTION_CONFIG["segment.ms"]),
        "min.cleanable.dirty.ratio": 0.5,  # Kafka's default: half the log may be history
        "min.compaction.lag.ms": float(COMPACTION_CONFIG["segment.ms"]),
    }
    problems = []
    for name, limit in limits.items():
        value = config.get(name)
        if value is not None and float(value) > limit:
            problems.append(f"{name}={value} > {limit:.10g}")
    return problems


def read_committed_offset(
    consumer_config: dict[str, Any],
    pipeline: str,
    source_partition: str,
    topic: str = DEFAULT_OFFSETS_TOPIC,
    timeout: float = 120,
) -> CommittedOffset | None:
    """
    Return the last committed offset of ``pipeline``/``source_partition``, or None if it never committed.

    Reads the key's partition (:func:`ledger_partition`) with ``read_committed`` backwards from its end: first
    the window ``[high - FIRST_WINDOW, high)``, then windows WINDOW_GROWTH times longer just before it, until
    a window holds the key (its last record there is the latest: every later offset was read already) or the
    log start is reached (never committed). ``high`` is the high watermark seen at the start, asked with
    ``read_uncommitted`` (a read_committed client reports the last stable offset instead, which stops before
    the first open transaction). Reaching ``high`` means every transaction open when the read began (ours,
    fenced by ``init_transactions``, or another pipeline's) has ended: no committed record of this key can
    hide behind an open transaction. The earlier windows end below ``high``, where every transaction is
    decided; aborted records and transaction markers are skipped by ``read_committed``. A key that never
    committed costs its whole partition (a pipeline's first run only), as does proving a key absent.

    :param consumer_config: confluent-kafka configuration (at least ``bootstrap.servers``).
    :param pipeline: the pipeline name.
    :param source_partition: the source partition name.
    :param topic: the offsets topic.
    :param timeout: seconds before giving up; should exceed the producers' ``transaction.timeout.ms``.
    """
    key = ledger_key(pipeline, source_partition)
    value = latest_values_of_keys(consumer_config, topic, [(pipeline, source_partition)], timeout).get(key)
    return None if value is None else CommittedOffset.from_value(value)


def latest_values_of_keys(
    consumer_config: dict[str, Any], topic: str, keys: Iterable[tuple[str, str]], timeout: float = 120
) -> dict[bytes, bytes]:
    """
    Return the latest committed raw value of each ``(pipeline, source_partition)`` key that has one.

    Each ledger partition holding some of the keys is read backwards from its high watermark as
    :func:`read_committed_offset` describes, until every key of that partition is found or its log start is
    reached: the cost is the distance back to the oldest of those keys' last records, not the partition.

    :param consumer_config: confluent-kafka configuration (at least ``bootstrap.servers``).
    :param topic: the offsets topic.
    :param keys: the ``(pipeline, source_partition)`` pairs.
    :param timeout: seconds before giving up.
    """
    deadline = time.monotonic() + timeout
    pairs = list(keys)
    count, bounds = _ledger_bounds(consumer_config, topic, {p for p, _ in pairs}, timeout)
    by_partition: dict[int, set[bytes]] = {}
    for pipeline, source_partition in pairs:
        by_partition.setdefault(ledger_partition(pipeline, count), set()).add(ledger_key(pipeline, source_partition))
    consumer = _consumer(consumer_config, "read_committed")
    try:
        found: dict[bytes, bytes] = {}
        for partition, wanted in sorted(by_partition.items()):
            (low, high), missing = bounds[partition], set(wanted)
            end, window = high, FIRST_WINDOW
            while end > low and missing:
                start = max(low, end - window)
                newest: dict[bytes, bytes] = {}  # a key's last record in this window is its latest overall
                for message in read_until(
                    consumer, topic, {partition: start}, {partition: end}, max(deadline - time.monotonic(), 0.0), _STUCK
                ):
                    if message.key() in missing and message.value() is not None:
                        newest[message.key()] = message.value()
                found.update(newest)
                missing -= newest.keys()
                end, window = start, window * WINDOW_GROWTH
        return found
    finally:
        consumer.close()


def read_ledger(
    consumer_config: dict[str, Any],
    topic: str = DEFAULT_OFFSETS_TOPIC,
    timeout: float = 120,
    pipelines: Iterable[str] | None = None,
    keys: Iterable[tuple[str, str]] | None = None,
) -> dict[str, CommittedOffset | ValueError]:
    """
    Return the last committed record of every key of the offsets topic (for display and discovery).

    Reads like :func:`read_committed_offset`, forwards from each partition's start (every key is wanted).
    With ``pipelines`` only their partitions are read and only their keys returned: the cost is those
    partitions (one record per key plus what compaction has not cleaned yet), not the whole ledger.
    A record this provider cannot parse (newer schema version, not JSON) is returned as its ``ValueError``
    instead of hiding the key.

    :param consumer_config: confluent-kafka configuration (at least ``bootstrap.servers``).
    :param topic: the offsets topic.
    :param timeout: seconds before giving up.
    :param pipelines: only these pipelines' keys; default: every key.
    :param keys: only these ``(pipeline, source_partition)`` keys, read backwards
        (:func:`latest_values_of_keys`): the cost no longer grows with the partitions' history.
    """
    if keys is not None:
        values = latest_values_of_keys(
            consumer_config,
            topic,
            [(validate_name("pipeline", p), validate_name("source_partition", s)) for p, s in keys],
            timeout,
        )
    else:
        wanted = None if pipelines is None else {validate_name("pipeline", p) for p in pipelines}
        values = latest_raw_values(consumer_config, topic, timeout, wanted)
    result: dict[str, CommittedOffset | ValueError] = {}
    for key, value in values.items():
        try:
            result[key.decode()] = CommittedOffset.from_value(value)
        except ValueError as err:
            result[key.decode(errors="replace")] = err
    return result


def topic_end_offsets(config: dict[str, Any], topic: str, consumer: Consumer | None = None) -> dict[int, int]:
    """
    Return the end offset (high watermark, open transactions included) of every partition of ``topic``.

    :param config: confluent-kafka configuration (at least ``bootstrap.servers``).
    :param topic: the topic; ``ValueError`` if it does not exist.
    :param consumer: a ``read_uncommitted`` consumer to ask (one that many calls share, e.g. one page read);
        default: one of its own, closed after the call.
    """
    own = consumer is None
    consumer = end_offsets_consumer(config) if own else consumer
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics.get(topic)
        if metadata is None or metadata.error is not None:
            raise ValueError(f"Topic {topic!r} does not exist.")
        return {p: _watermarks(consumer, TopicPartition(topic, p), 30)[1] for p in sorted(metadata.partitions)}
    finally:
        if own:
            consumer.close()


def end_offsets_consumer(config: dict[str, Any]) -> Consumer:
    """Return a ``read_uncommitted`` consumer for :func:`topic_end_offsets` (a ``read_committed`` one would
    report the last stable offset: before an open transaction, and before the last one's commit markers)."""
    return _consumer(config, "read_uncommitted")


_ELECTING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.UNKNOWN_LEADER_EPOCH,
    }
)
_STUCK = (
    "A transaction stays open on it; it ends at the producer's transaction.timeout.ms. If it never ends (a broker "
    "restart can leave a transaction without its end marker: docs/pitfalls.md#kafka), find and abort it with "
    "kafka-transactions.sh find-hanging / abort."
)


def _ledger_bounds(
    config: dict[str, Any], topic: str, pipelines: set[str] | None, timeout: float
) -> tuple[int, dict[int, tuple[int, int]]]:
    """Return the ledger's partition count and (log start, high watermark) of the partitions of ``pipelines``
    (None: every partition), asked read_uncommitted: the high watermark includes open transactions."""
    consumer = _consumer(config, "read_uncommitted")
    try:
        metadata = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if metadata is None or metadata.error is not None:
            raise ValueError(f"Offsets topic {topic!r} does not exist; create it with ensure_offsets_topic().")
        count = check_ledger_partitions(topic, len(metadata.partitions))
        wanted = range(count) if pipelines is None else sorted({ledger_partition(p, count) for p in pipelines})
        # Explicit start offsets: a logical OFFSET_BEGINNING costs librdkafka an offset lookup and a
        # ~500 ms wait before the first fetch.
        return count, {p: _watermarks(consumer, TopicPartition(topic, p), timeout) for p in wanted}
    finally:
        consumer.close()


def latest_raw_values(
    consumer_config: dict[str, Any], topic: str, timeout: float, pipelines: set[str] | None
) -> dict[bytes, bytes]:
    """
    Return the latest committed raw value of each key (of ``pipelines``, if given), reading forwards from
    each partition's start to the high watermark (as :func:`read_ledger`, without parsing: the migration
    copies values byte for byte).

    :param consumer_config: confluent-kafka configuration (at least ``bootstrap.servers``).
    :param topic: the offsets topic.
    :param timeout: seconds before giving up.
    :param pipelines: only these pipelines' partitions and keys; None: every key.
    """
    _, bounds = _ledger_bounds(consumer_config, topic, pipelines, timeout)
    consumer = _consumer(consumer_config, "read_committed")
    try:
        latest: dict[bytes, bytes] = {}
        for message in read_until(
            consumer,
            topic,
            {p: low for p, (low, _) in bounds.items()},
            {p: high for p, (_, high) in bounds.items()},
            timeout,
            _STUCK,
        ):
            key = message.key()
            if (
                key is not None
                and message.value() is not None
                and (pipelines is None or key.split(b"/", 1)[0].decode(errors="replace") in pipelines)
            ):
                latest[key] = message.value()
        return latest
    finally:
        consumer.close()


def _watermarks(consumer: Consumer, partition: TopicPartition, timeout: float) -> tuple[int, int]:
    """Return (log start, high watermark), asking again while the partition's leader is still being elected
    (a ledger just created answers NOT_LEADER_FOR_PARTITION for a moment)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return consumer.get_watermark_offsets(partition, timeout=timeout)
        except KafkaException as err:
            if (not err.args[0].retriable() and err.args[0].code() not in _ELECTING) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _consumer(config: dict[str, Any], isolation_level: str) -> Consumer:
    return Consumer(
        consumer_config(
            config,
            f"eo-offsets-reader-{uuid.uuid4().hex[:12]}",
            isolation_level,
            {
                "enable.partition.eof": True,
                # End of partition is only known from a fetch that finds nothing more, which the broker holds for
                # fetch.wait.max.ms (default 500 ms) hoping for data: the whole cost of a small read. 10 ms keeps
                # the wait for an open transaction's end just as correct, with polls every 10 ms.
                "fetch.wait.max.ms": 10,
            },
        )
    )
