"""The ``kafka`` connection -> the product's Kafka clients: its settings read once, each client given its share.

Which settings each client role keeps is the one rule of :mod:`exactly_once_provider.kafka_config`; this hook
reads the connection once (:func:`~exactly_once_provider.connections.kafka_client_config`, the Kafka provider's
``KafkaBaseHook`` semantics) and hands each role its settings. Subclasses only pick the client they build
(:class:`~exactly_once_provider.hooks.kafka_producer.TransactionalProducerHook`: a producer).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.providers.apache.kafka.hooks.base import KafkaBaseHook
from confluent_kafka.admin import AdminClient

from exactly_once_provider.connections import kafka_client_config
from exactly_once_provider.kafka_config import admin_config


class KafkaClientHook(KafkaBaseHook):
    """
    Build the clients of one ``kafka`` connection: ``get_conn`` is an ``AdminClient``.

    The connection is read once per hook: every client it builds connects alike (SASL, TLS, ``oauth_cb``,
    ``client.id``). The settings hold secrets: never log them.

    :param kafka_config_id: the Airflow connection id of the cluster.
    """

    conn_name_attr = "kafka_config_id"
    default_conn_name = "kafka_default"
    conn_type = "kafka"
    hook_name = "Apache Kafka (exactly-once clients)"

    def __init__(self, kafka_config_id: str = default_conn_name) -> None:
        super().__init__(kafka_config_id=kafka_config_id)

    @cached_property
    def _connection_config(self) -> dict[str, Any]:
        return kafka_client_config(self.kafka_config_id)

    def _build_config(self) -> dict[str, Any]:
        # What KafkaBaseHook.get_conn and test_connection build their client from: the one reading, cached.
        return dict(self._connection_config)

    def client_config(self) -> dict[str, Any]:
        """Return the connection's whole confluent-kafka configuration (each client takes its share of it)."""
        return self._build_config()

    def _get_client(self, config: dict[str, Any]) -> Any:
        return AdminClient(admin_config(config))
