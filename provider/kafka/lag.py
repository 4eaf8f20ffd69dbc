"""Consumer lag of a pipeline: Kafka's stable end offsets minus what the sink (or a consumer group) committed.

"Stable" end = the last stable offset (LSO) that a ``read_committed`` reader can reach: records of open
transactions and their successors are not counted, so an open capture transaction is never "lag" the sink
could have applied. The sink's progress is read from the sink itself (the Delta commit marker or the
PostgreSQL offsets table, :mod:`exactly_once_provider.spark_jobs`), the only place it is committed;
a plain consumer group's committed offsets are supported for other consumers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from exactly_once_provider.kafka.topics import partitions_of
from exactly_once_provider.kafka_config import admin_config, consumer_config

# {topic: {partition: offset}}
Offsets = dict[str, dict[int, int]]


def stable_end_offsets(
    client_config: dict[str, Any], topics: list[str], timeout: float = 30, missing_ok: bool = False
) -> Offsets:
    """Return the read_committed end offset (LSO) of every partition of ``topics``.

    :param client_config: the connection's confluent-kafka settings (at least ``bootstrap.servers``).
    :param topics: the topics.
    :param timeout: seconds to wait for the broker.
    :param missing_ok: a topic that does not exist yet has no offsets (nothing to read) instead of an error.
    """
    admin = AdminClient(admin_config(client_config))
    request = {}
    for topic, partitions in partitions_of(admin, topics, timeout).items():
        if partitions is None:
            if missing_ok:
                continue
            raise ValueError(f"Kafka topic {topic!r} does not exist; check the pipeline's topics.")
        for partition in partitions:
            request[TopicPartition(topic, partition)] = OffsetSpec.latest()
    if not request:
        return {}
    futures = admin.list_offsets(request, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=timeout)
    result: Offsets = {}
    for tp, future in futures.items():
        result.setdefault(tp.topic, {})[tp.partition] = future.result().offset
    return result


def group_offsets(client_config: dict[str, Any], group_id: str, topics: list[str], timeout: float = 30) -> Offsets:
    """Return a consumer group's committed offsets for ``topics`` (negative, -1001: nothing committed)."""
    consumer = Consumer(consumer_config(client_config, group_id))
    try:
        wanted = [
            TopicPartition(t, p)
            for t in topics  # by name: a full listing costs what the cluster holds
            for p in consumer.list_topics(t, timeout=timeout).topics[t].partitions
        ]
        return _by_topic(consumer.committed(wanted, timeout=timeout))
    finally:
        consumer.close()


def _by_topic(partitions: list[TopicPartition]) -> Offsets:
    result: Offsets = {}
    for tp in partitions:
        result.setdefault(tp.topic, {})[tp.partition] = tp.offset
    return result


def sink_offsets(
    sink: str,
    location: str,
    pipeline: str,
    postgres_connect: dict | None = None,
    s3: Any = None,
    iceberg_catalog: str | None = None,
) -> Offsets:
    """Return the Kafka offsets a pipeline's sink committed (empty before its first commit).

    :param sink: ``delta``, ``postgres``, ``files`` or ``iceberg``.
    :param location: the Delta table / files directory (local or ``s3://``), the PostgreSQL table, or the Iceberg
        table (``namespace.table``).
    :param pipeline: the Spark job's pipeline name.
    :param postgres_connect: psycopg2 connection arguments (``postgres`` sink; ``iceberg``: its SQL catalog's
        database).
    :param s3: a files or Delta sink on ``s3://``: its :class:`~exactly_once_provider.storage.s3.S3Settings`.
    :param iceberg_catalog: ``iceberg``: the SQL catalog's name; None: ``eo``.
    """
    from exactly_once_provider.sinks.base import open_sink

    catalog = None
    if sink == "iceberg" and iceberg_catalog:
        from exactly_once_provider.sinks.iceberg import sql_catalog

        catalog = sql_catalog(postgres_connect or {}, iceberg_catalog)
    state = open_sink(
        sink, location, pipeline, postgres_connect=postgres_connect or {}, s3=s3, iceberg_catalog=catalog
    ).committed()
    return state.offsets if state else {}


@dataclass(frozen=True)
class Lag:
    """Records a reader still has to process, per partition and in total."""

    end: Offsets
    committed: Offsets

    @property
    def per_partition(self) -> dict[str, dict[int, int]]:
        return {
            t: {p: max(0, end - max(self.committed.get(t, {}).get(p, 0), 0)) for p, end in parts.items()}
            for t, parts in self.end.items()
        }

    @property
    def total(self) -> int:
        return sum(n for parts in self.per_partition.values() for n in parts.values())

    def describe(self) -> str:
        return (
            ", ".join(
                f"{t}[{p}] {n}" for t, parts in sorted(self.per_partition.items()) for p, n in sorted(parts.items())
            )
            or "no partitions"
        )
