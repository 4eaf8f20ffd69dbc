"""The ``kafka`` connection -> a transactional producer and its :class:`PipelineWriter`.

The writer itself (transactions, the offsets ledger commit, fencing, replay) is
:mod:`exactly_once_provider.kafka.writer`.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from confluent_kafka import Producer

from exactly_once_provider.connections import check_kafka_access, explain_kafka_denials
from exactly_once_provider.hooks.kafka_client import KafkaClientHook
from exactly_once_provider.kafka.offsets import (
    DEFAULT_OFFSETS_TOPIC,
    DELIVERY_MODES,
    ensure_offsets_topic,
    validate_name,
)
from exactly_once_provider.kafka.writer import MODE_SETTINGS, PipelineWriter, transactional_id_for
from exactly_once_provider.kafka_config import producer_config


class TransactionalProducerHook(KafkaClientHook):
    """
    Produce one pipeline's source partition to Kafka exactly once (or, explicitly, at least once).

    Uses the standard ``kafka`` connection: its Extra JSON is the confluent-kafka configuration, built by
    the Kafka provider (``bootstrap.servers``, security settings, allow-listed callbacks) and read once
    (:class:`~exactly_once_provider.hooks.kafka_client.KafkaClientHook`). The producer keeps the producer's share
    of it (:mod:`exactly_once_provider.kafka_config`); this hook adds the transactional id and the delivery-mode
    settings on top, and refuses a connection that contradicts them.

    :param kafka_config_id: the Airflow connection id of the cluster.
    :param pipeline: the pipeline name (part of the transactional id and of the offsets key).
    :param source_partition: the source partition this writer owns (one writer per partition).
    :param delivery_mode: ``"exactly_once"`` (transactions) or ``"at_least_once"`` (idempotent producer,
        no transactions; downstream must dedupe by key). No default: it is a per-pipeline decision.
    :param offsets_topic: the compacted offsets topic.
    :param producer_config: extra producer settings such as ``linger.ms``, ``batch.size``,
        ``compression.type``, ``transaction.timeout.ms``.
    :param batch_markers: frame each transaction with begin/end markers in every partition of the topic.
    """

    conn_name_attr = "kafka_config_id"
    default_conn_name = "kafka_default"
    conn_type = "kafka"
    hook_name = "Apache Kafka (exactly-once producer)"

    def __init__(
        self,
        kafka_config_id: str = default_conn_name,
        *,
        pipeline: str,
        delivery_mode: str,
        source_partition: str = "0",
        offsets_topic: str = DEFAULT_OFFSETS_TOPIC,
        producer_config: dict[str, Any] | None = None,
        batch_markers: bool = False,
    ) -> None:
        super().__init__(kafka_config_id=kafka_config_id)
        self.pipeline = pipeline
        self.source_partition = source_partition
        self.delivery_mode = delivery_mode
        self.offsets_topic = offsets_topic
        self.producer_config = dict(producer_config or {})
        self.batch_markers = batch_markers

    @property
    def transactional_id(self) -> str | None:
        if self.delivery_mode != "exactly_once":
            return None
        return transactional_id_for(self.pipeline, self.source_partition)

    def build_producer_config(self) -> dict[str, Any]:
        """Return the producer configuration for the delivery mode, refusing contradicting settings."""
        if self.delivery_mode not in DELIVERY_MODES:
            raise ValueError(
                f"delivery_mode={self.delivery_mode!r}: choose 'exactly_once' (Kafka transactions) or "
                "'at_least_once' (idempotent producer; downstream dedupes by key)."
            )
        validate_name("pipeline", self.pipeline)
        validate_name("source_partition", self.source_partition)
        config = producer_config(self.client_config(), self.producer_config)
        owned = dict(MODE_SETTINGS[self.delivery_mode])
        if self.transactional_id:
            owned["transactional.id"] = self.transactional_id
        for key, value in owned.items():
            if key in config and str(config[key]).lower() != str(value).lower():
                raise ValueError(
                    f"Kafka setting {key}={config[key]!r} (connection {self.kafka_config_id!r} or "
                    f"producer_config) contradicts delivery_mode={self.delivery_mode!r}, which needs "
                    f"{key}={value!r}. Remove it; this hook sets it."
                )
        if self.delivery_mode == "at_least_once" and "transactional.id" in config:
            raise ValueError(
                "transactional.id is set but delivery_mode='at_least_once'; remove it or use "
                "delivery_mode='exactly_once'."
            )
        config.update(owned)
        return config

    def _get_client(self, config: dict[str, Any]) -> Producer:
        return Producer(config)

    @cached_property
    def get_conn(self) -> Producer:
        """Return a producer configured for the delivery mode (not initialised: use :meth:`open_writer`)."""
        return self._get_client(self.build_producer_config())

    def open_writer(self, ensure_topic: bool = True, track_partition_offsets: bool = True) -> PipelineWriter:
        """
        Create the producer, fence older writers of this id, and read the last committed offset.

        :param ensure_topic: create the compacted offsets topic if it is missing.
        :param track_partition_offsets: keep ``partition_offsets`` (the last offset written per partition, for
            display); exactly_once writers that do not show it skip the delivery reports it needs.
        """
        config = self.build_producer_config()
        client_config = self.client_config()
        # A wrong password or an untrusted certificate otherwise shows as "Broker transport failure" after a timeout.
        admin = check_kafka_access(client_config, self.kafka_config_id)
        with explain_kafka_denials(
            self.kafka_config_id,
            client_config,
            f"Create, Describe, DescribeConfigs, Read and Write on offsets topic {self.offsets_topic!r}",
        ):
            if ensure_topic:
                ensure_offsets_topic(client_config, self.offsets_topic, admin=admin)
        writer = PipelineWriter(
            producer_factory=lambda: self._get_client(dict(config)),
            client_config=client_config,
            pipeline=self.pipeline,
            source_partition=self.source_partition,
            delivery_mode=self.delivery_mode,
            transactional_id=self.transactional_id,
            offsets_topic=self.offsets_topic,
            batch_markers=self.batch_markers,
            log=self.log,
            transaction_timeout_s=int(config.get("transaction.timeout.ms", 60_000)) / 1000,
            track_partition_offsets=track_partition_offsets,
        )
        with explain_kafka_denials(
            self.kafka_config_id,
            client_config,
            f"Write and Describe on transactional id {self.transactional_id!r}, "
            f"Read on offsets topic {self.offsets_topic!r} and on the consumer groups prefixed 'eo-'",
        ):
            writer.open()
        return writer
