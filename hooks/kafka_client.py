"""The ``kafka`` connection -> the settings of every Kafka client of the product: the one place they are built.

:meth:`KafkaClientHook.client_config` reads the Airflow ``kafka`` connection through Airflow's public connection
API and keeps the Kafka provider's documented semantics: the Extra JSON is the librdkafka configuration,
``bootstrap.servers`` is required, a callback given as a dotted path (``oauth_cb``, ``error_cb``...) is imported
only when ``[apache_kafka] callback_allowlist`` lists it, and the managed OAuth token callbacks (Amazon MSK IAM,
Google Managed Kafka) are added. Which of these settings each client role keeps, and their Java names for the
Spark job's Kafka source, is the one rule of :mod:`exactly_once_provider.kafka_config`. Every producer, consumer,
admin client, the lag trigger, the status page and the Spark job's ``kafka.*`` options start from here.

Subclasses only pick the client they build
(:class:`~exactly_once_provider.hooks.kafka_producer.TransactionalProducerHook`: a producer).
"""

from __future__ import annotations

from functools import cached_property, partial
from typing import Any

from airflow.providers.apache.kafka.hooks.base import (
    CALLBACK_ALLOWLIST_CONFIG_OPTION,
    CALLBACK_CONFIG_KEYS,
    KAFKA_COMMON_CONFIG_SECTION,
    MSK_BOOTSTRAP_SERVERS_REGEX,
    KafkaBaseHook,
)
from airflow.sdk.exceptions import AirflowOptionalProviderFeatureException
from airflow.sdk.module_loading import import_string
from confluent_kafka.admin import AdminClient

from exactly_once_provider import connections
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
        config = dict(self.get_connection(self.kafka_config_id).extra_dejson)
        servers = config.get("bootstrap.servers")
        if not servers:
            # The provider's own message does not say which connection lacks them.
            raise ValueError(
                f"Kafka connection {self.kafka_config_id!r} cannot be used: bootstrap.servers is missing. Put the "
                'brokers into its Extra JSON, e.g. {"bootstrap.servers": "host:9092"}, or pass the id of a kafka '
                "connection."
            )
        _resolve_allowed_callbacks(config, self.kafka_config_id)
        self._add_managed_token(config, str(servers))
        return config

    def _add_managed_token(self, config: dict[str, Any], servers: str) -> None:
        # The Kafka provider adds these token callbacks itself for its own clients: a connection that works with
        # its operators must work with ours, so the same endpoints get the same tokens.
        if "cloud.goog" in servers and "managedkafka" in servers:
            try:
                from airflow.providers.google.cloud.hooks.managed_kafka import ManagedKafkaHook
            except ImportError:
                raise AirflowOptionalProviderFeatureException(
                    f"Kafka connection {self.kafka_config_id!r} names Google Managed Kafka: install "
                    "apache-airflow-providers-google >= 14.1.0 for its OAuth tokens."
                ) from None
            self.log.info("Kafka connection %r: OAuth tokens from Google Managed Kafka.", self.kafka_config_id)
            config["oauth_cb"] = ManagedKafkaHook().get_confluent_token
            return
        mechanism = config.get("sasl.mechanism") or config.get("sasl.mechanisms")
        msk = MSK_BOOTSTRAP_SERVERS_REGEX.search(servers)
        if mechanism != "OAUTHBEARER" or msk is None or "oauth_cb" in config:
            return  # not MSK IAM, or the user's own oauth_cb (never replaced)
        try:
            import aws_msk_iam_sasl_signer  # noqa: F401 - present, or the connection cannot authenticate
        except ImportError:
            raise AirflowOptionalProviderFeatureException(
                f"Kafka connection {self.kafka_config_id!r} uses Amazon MSK IAM: install "
                "apache-airflow-providers-apache-kafka[msk] (aws-msk-iam-sasl-signer-python)."
            ) from None
        region = msk.group("region").lower()
        self.log.info(
            "Kafka connection %r: OAuth tokens from Amazon MSK IAM (region %s).", self.kafka_config_id, region
        )
        config["oauth_cb"] = partial(_msk_iam_token, region)

    def client_config(self) -> dict[str, Any]:
        """Return the connection's whole confluent-kafka configuration, a fresh copy (each client takes its share).

        Read once per hook. It holds secrets: never log it.
        """
        return dict(self._connection_config)

    def checked_config(self) -> dict[str, Any]:
        """Return :meth:`client_config` once the brokers accepted it.

        What a task opening Kafka clients calls first: a wrong password, an untrusted CA or a plaintext client on a
        TLS listener fails the task in seconds, naming the connection and the fix
        (:func:`~exactly_once_provider.connections.check_kafka_access`).
        """
        config = self.client_config()
        connections.check_kafka_access(config, self.kafka_config_id)
        return config

    def _build_config(self) -> dict[str, Any]:
        # What KafkaBaseHook.get_conn and test_connection build their client from: this hook's one reading.
        return self.client_config()

    def _get_client(self, config: dict[str, Any]) -> Any:
        return AdminClient(admin_config(config))


def kafka_client_config(kafka_config_id: str) -> dict[str, Any]:
    """Return the confluent-kafka configuration of the ``kafka`` connection (:meth:`KafkaClientHook.client_config`).

    :param kafka_config_id: the ``kafka`` connection.
    """
    return KafkaClientHook(kafka_config_id).client_config()


def checked_kafka_config(kafka_config_id: str) -> dict[str, Any]:
    """Return the ``kafka`` connection's configuration once its brokers accepted it (:meth:`KafkaClientHook.checked_config`).

    :param kafka_config_id: the ``kafka`` connection.
    """
    return KafkaClientHook(kafka_config_id).checked_config()


def _resolve_allowed_callbacks(config: dict[str, Any], kafka_config_id: str) -> None:
    """Import the callbacks given as dotted paths, each only if the Airflow configuration allows it.

    Importing a path named in a connection runs code: the Kafka provider (2.0.0) lets an administrator allow each
    callback by its full path in ``[apache_kafka] callback_allowlist``, empty by default. A callable already in
    the configuration (not from a connection's JSON) is left as it is.
    """
    from airflow.sdk.configuration import conf

    named = {key: value for key in CALLBACK_CONFIG_KEYS if isinstance(value := config.get(key), str)}
    if not named:
        return
    setting = conf.get(KAFKA_COMMON_CONFIG_SECTION, CALLBACK_ALLOWLIST_CONFIG_OPTION, fallback="") or ""
    allowed = {path.strip() for path in setting.split(",") if path.strip()}
    for key, path in named.items():
        if path not in allowed:
            raise ValueError(
                f"Kafka connection {kafka_config_id!r}: callback {key}={path!r} is not in "
                f"[{KAFKA_COMMON_CONFIG_SECTION}] {CALLBACK_ALLOWLIST_CONFIG_OPTION} "
                f"({', '.join(sorted(allowed)) or 'empty'}); an administrator adds its full path there to allow it."
            )
        config[key] = import_string(path)


def _msk_iam_token(region: str, oauthbearer_config: str) -> tuple[str, float]:
    """librdkafka's ``oauth_cb`` for Amazon MSK IAM: a signed token and its expiry in seconds since the epoch.

    :param region: the cluster's AWS region (from its bootstrap address).
    :param oauthbearer_config: ``sasl.oauthbearer.config``, which librdkafka passes; MSK's signer does not need it.
    """
    from aws_msk_iam_sasl_signer import MSKAuthTokenProvider

    token, expiry_ms = MSKAuthTokenProvider.generate_auth_token(region)
    return token, expiry_ms / 1000  # the signer answers milliseconds, librdkafka wants seconds
