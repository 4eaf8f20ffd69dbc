"""The one rule for Kafka client settings: a ``kafka`` connection's configuration -> each client role's settings.

A connection's Extra is ONE librdkafka configuration (:func:`~exactly_once_provider.hooks.kafka_client.kafka_client_config`
reads it). Every client of the product takes it whole, minus the settings that belong to another role:

================================  ====================================================  ==========================
role                              drops from the connection                             then sets
================================  ====================================================  ==========================
producer, transactional producer  consumer-group settings (:data:`CONSUMER_GROUP`)      the caller's settings
                                                                                        (transactional id, timeouts)
consumer (``read_committed``)     producer-only settings (:data:`PRODUCER_ONLY`) and    its own ``group.id``,
                                  consumer-group settings                               ``isolation.level``,
                                                                                        ``enable.auto.commit=false``
admin                             producer-only and consumer-group settings             --
Spark's Kafka source              producer-only, consumer-group, librdkafka tuning      the Java client's names;
(:func:`spark_kafka_options`)     (:data:`LIBRDKAFKA_TUNING`) and observability         an unmapped setting is
                                  callbacks (:data:`OBSERVABILITY_CALLBACKS`)           refused by name
================================  ====================================================  ==========================

Why: a producer-only setting on an admin or consumer is at best a warning line and at worst changes the client
(``transactional.id`` on an admin); a connection's ``group.id`` or ``isolation.level`` would make two readers
share a group or read uncommitted records, so every consumer here sets its own. Everything else -- brokers,
``client.id``, ``security.protocol``, ``sasl.*``, ``ssl.*``, ``enable.ssl.certificate.verification``,
``oauth_cb`` and the other callbacks, diagnostics -- reaches every librdkafka client unchanged: the lag sensor's
admin and consumer connect exactly as the writer does.

Pure dictionaries, no client library and no Airflow: the Spark driver imports it for :func:`spark_kafka_options`.
The results hold secrets: never log them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PRODUCER = "producer"
CONSUMER = "consumer"
ADMIN = "admin"
SPARK_SOURCE = "spark_source"

# librdkafka's producer-only properties (a consumer logs "is a producer property and will be ignored"), plus
# max.in.flight(.requests.per.connection), which only the producer's ordering and idempotence depend on.
PRODUCER_ONLY = frozenset(
    {
        "transactional.id",
        "transaction.timeout.ms",
        "enable.idempotence",
        "enable.gapless.guarantee",
        "acks",
        "request.required.acks",
        "request.timeout.ms",
        "message.timeout.ms",
        "delivery.timeout.ms",
        "linger.ms",
        "queue.buffering.max.ms",
        "queue.buffering.max.messages",
        "queue.buffering.max.kbytes",
        "queue.buffering.backpressure.threshold",
        "batch.size",
        "batch.num.messages",
        "compression.type",
        "compression.codec",
        "compression.level",
        "retries",
        "message.send.max.retries",
        "max.in.flight.requests.per.connection",
        "max.in.flight",
        "partitioner",
        "sticky.partitioning.linger.ms",
        "delivery.report.only.error",
        "on_delivery",
    }
)
# A consumer group's settings: each consumer of the product owns its group (a unique one, or the group whose
# offsets it reads) and never commits; Spark's source manages its own (it refuses kafka.group.id with its offsets).
CONSUMER_GROUP = frozenset(
    {
        "group.id",
        "group.instance.id",
        "group.protocol",
        "group.remote.assignor",
        "partition.assignment.strategy",
        "session.timeout.ms",
        "heartbeat.interval.ms",
        "max.poll.interval.ms",
        "enable.auto.commit",
        "auto.commit.interval.ms",
        "enable.auto.offset.store",
        "auto.offset.reset",
        "isolation.level",
        "enable.partition.eof",
    }
)
# librdkafka diagnostics and tuning the Java client of the Spark source has no use for.
LIBRDKAFKA_TUNING = frozenset(
    {"debug", "log_level", "statistics.interval.ms", "api.version.request", "broker.address.family"}
)
# Client settings with the same name and meaning in librdkafka and the Java client: passed to Spark's source as
# they are (kafka.<name>), so a connection tuned for a slow or flaky network reads there as it writes here.
SAME_IN_JAVA = frozenset(
    {
        "retry.backoff.ms",
        "reconnect.backoff.ms",
        "reconnect.backoff.max.ms",
        "socket.connection.setup.timeout.ms",
        "socket.connection.setup.timeout.max.ms",
        "metadata.max.age.ms",
        "connections.max.idle.ms",
    }
)
# Callbacks the Kafka provider resolves from the Extra that only observe: safe to leave out of a client that runs
# elsewhere. oauth_cb authenticates (a client without it cannot connect), so it is never among them.
OBSERVABILITY_CALLBACKS = frozenset({"error_cb", "throttle_cb", "stats_cb", "log_cb", "on_commit"})

# THE rule: the connection settings each role leaves out.
DROPPED: dict[str, frozenset[str]] = {
    PRODUCER: CONSUMER_GROUP,
    CONSUMER: PRODUCER_ONLY | CONSUMER_GROUP,
    ADMIN: PRODUCER_ONLY | CONSUMER_GROUP,
    # enable.ssl.certificate.verification: the Java client always verifies; spark_kafka_options refuses "false".
    SPARK_SOURCE: PRODUCER_ONLY
    | CONSUMER_GROUP
    | LIBRDKAFKA_TUNING
    | OBSERVABILITY_CALLBACKS
    | {"enable.ssl.certificate.verification"},
}


def for_role(config: Mapping[str, Any], role: str) -> dict[str, Any]:
    """Return the connection settings client ``role`` keeps (:data:`DROPPED`), nothing added.

    :param config: the connection's confluent-kafka configuration.
    :param role: :data:`PRODUCER`, :data:`CONSUMER`, :data:`ADMIN` or :data:`SPARK_SOURCE`.
    """
    if role not in DROPPED:
        raise ValueError(f"Kafka client role {role!r}: choose one of {', '.join(DROPPED)}.")
    return {k: v for k, v in config.items() if k not in DROPPED[role]}


def admin_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Return the settings of an ``AdminClient`` of the connection ``config``.

    :param config: the connection's confluent-kafka configuration.
    """
    return for_role(config, ADMIN)


def producer_config(config: Mapping[str, Any], settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Return the settings of a producer of the connection ``config``, ``settings`` on top.

    :param config: the connection's confluent-kafka configuration.
    :param settings: the caller's producer settings (``transactional.id``, ``transaction.timeout.ms``...); they
        win over the connection's. A caller that must refuse a contradicting connection value checks first.
    """
    return {**for_role(config, PRODUCER), **(settings or {})}


def consumer_config(
    config: Mapping[str, Any],
    group_id: str,
    isolation_level: str = "read_committed",
    settings: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Return the settings of a consumer of the connection ``config``: its own group, never committing.

    :param config: the connection's confluent-kafka configuration.
    :param group_id: the consumer's group (a unique one, or the group whose committed offsets it reads).
    :param isolation_level: ``read_committed`` (what every reader of a pipeline's data uses) or
        ``read_uncommitted`` (end offsets that include open transactions).
    :param settings: further consumer settings (``enable.partition.eof``, ``fetch.wait.max.ms``...).
    """
    if isolation_level not in ("read_committed", "read_uncommitted"):
        raise ValueError(f"isolation_level={isolation_level!r}: use read_committed or read_uncommitted.")
    return {
        **for_role(config, CONSUMER),
        "group.id": group_id,
        "isolation.level": isolation_level,
        "enable.auto.commit": False,
        **(settings or {}),
    }


# ------------------------------------------------------------------------------- Spark's Kafka source (Java)

_SASL_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def _jaas_quoted(value: str) -> str:
    # Kafka parses sasl.jaas.config with a StreamTokenizer: backslash escapes inside double quotes.
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def spark_kafka_options(config: dict[str, Any]) -> dict[str, str]:
    """Map a confluent-kafka (librdkafka) configuration to the Spark Kafka source's ``kafka.*`` options.

    The Spark source is the Java Kafka client: same broker, different setting names. Mapped: ``bootstrap.servers``,
    ``client.id``, ``security.protocol``, ``sasl.mechanism(s)`` ``PLAIN``/``SCRAM-SHA-256``/``SCRAM-SHA-512`` with
    ``sasl.username``/``sasl.password`` (-> ``sasl.jaas.config``), ``ssl.ca.location``/``ssl.ca.pem`` (-> a PEM
    truststore), ``ssl.keystore.location``/``ssl.keystore.password`` (PKCS#12), a client certificate and key in
    one PEM file (``ssl.certificate.location`` == ``ssl.key.location``), ``ssl.key.password``,
    ``ssl.endpoint.identification.algorithm``, and the settings named alike in both clients (:data:`SAME_IN_JAVA`,
    e.g. ``retry.backoff.ms``). The settings :data:`DROPPED` for :data:`SPARK_SOURCE` are left
    out (they do not concern the job's read_committed source). Anything else raises ValueError naming the
    setting. The result holds secrets: never log it or put it on a command line.

    :param config: the connection's configuration (:func:`~exactly_once_provider.hooks.kafka_client.kafka_client_config`).
    """
    settings = for_role(config, SPARK_SOURCE)
    options: dict[str, str] = {}

    def take(key: str) -> Any:
        return settings.pop(key, None)

    servers = take("bootstrap.servers")
    if not servers:
        raise ValueError("Kafka setting bootstrap.servers is missing: the Spark job cannot reach the brokers.")
    options["kafka.bootstrap.servers"] = str(servers)
    if (client_id := take("client.id")) is not None:
        options["kafka.client.id"] = str(client_id)
    protocol = str(take("security.protocol") or "PLAINTEXT").upper()
    if protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        raise ValueError(f"Kafka setting security.protocol={protocol!r} is not a protocol the Java client knows.")
    options["kafka.security.protocol"] = protocol
    mechanism, alias = take("sasl.mechanism"), take("sasl.mechanisms")
    mechanism = str(mechanism or alias or ("GSSAPI" if protocol.startswith("SASL") else "")).upper()
    username, password = take("sasl.username"), take("sasl.password")
    if protocol.startswith("SASL"):
        if mechanism not in _SASL_LOGIN_MODULES:
            raise ValueError(
                f"Kafka setting sasl.mechanism={mechanism!r} cannot be passed to the Spark job (supported: "
                f"{', '.join(_SASL_LOGIN_MODULES)})."
            )
        if username is None or password is None:
            raise ValueError(f"Kafka setting sasl.username/sasl.password is missing for sasl.mechanism={mechanism}.")
        options["kafka.sasl.mechanism"] = mechanism
        options["kafka.sasl.jaas.config"] = (
            f"{_SASL_LOGIN_MODULES[mechanism]} required username="
            f"{_jaas_quoted(username)} password={_jaas_quoted(password)};"
        )
    elif mechanism or username is not None or password is not None:
        raise ValueError(
            f"Kafka settings sasl.* are set but security.protocol={protocol}: use SASL_SSL or "
            "SASL_PLAINTEXT, or remove them."
        )
    if (ca := take("ssl.ca.location")) is not None:
        options.update({"kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": str(ca)})
    if (ca_pem := take("ssl.ca.pem")) is not None:
        if ca is not None:
            raise ValueError("Kafka settings ssl.ca.location and ssl.ca.pem are both set: keep one.")
        options.update({"kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.certificates": str(ca_pem)})
    if (keystore := take("ssl.keystore.location")) is not None:
        options.update({"kafka.ssl.keystore.type": "PKCS12", "kafka.ssl.keystore.location": str(keystore)})
        if (store_password := take("ssl.keystore.password")) is not None:
            options["kafka.ssl.keystore.password"] = str(store_password)
    certificate, key = take("ssl.certificate.location"), take("ssl.key.location")
    if certificate is not None or key is not None:
        if certificate != key or keystore is not None:
            raise ValueError(
                "Kafka setting ssl.certificate.location/ssl.key.location cannot be passed to the Spark job as two "
                "files: put the key and its certificate chain into one PEM file named by both, or use "
                "ssl.keystore.location (PKCS#12)."
            )
        options.update({"kafka.ssl.keystore.type": "PEM", "kafka.ssl.keystore.location": str(certificate)})
    if (key_password := take("ssl.key.password")) is not None:
        options["kafka.ssl.key.password"] = str(key_password)
    if (algorithm := take("ssl.endpoint.identification.algorithm")) is not None:
        algorithm = str(algorithm).lower()
        if algorithm not in ("https", "none", ""):
            raise ValueError(f"Kafka setting ssl.endpoint.identification.algorithm={algorithm!r}: use https or none.")
        options["kafka.ssl.endpoint.identification.algorithm"] = "https" if algorithm == "https" else ""
    verify = str(config.get("enable.ssl.certificate.verification", "true")).strip().lower()
    if verify not in ("true", "1", "yes"):
        raise ValueError(
            "Kafka setting enable.ssl.certificate.verification=false cannot be passed to the Spark job "
            "(the Java client always verifies): give the broker's CA in ssl.ca.location instead."
        )
    for name in sorted(SAME_IN_JAVA & set(settings)):
        options[f"kafka.{name}"] = str(take(name))
    if "oauth_cb" in settings:
        raise ValueError("Kafka setting oauth_cb (OAUTHBEARER) cannot be passed to the Spark job.")
    if settings:
        raise ValueError(
            f"Kafka setting {sorted(settings)[0]} cannot be passed to the Spark job's Kafka source "
            f"(not mapped: {', '.join(sorted(settings))}); remove it from the connection's Extra."
        )
    return options


def portable_kafka_config(config: dict[str, Any]) -> dict[str, Any]:
    """Return ``config`` without observability callbacks, for a client in another process (JSON-serialisable).

    :param config: the connection's configuration (:func:`~exactly_once_provider.hooks.kafka_client.kafka_client_config`).
    """
    portable = {k: v for k, v in config.items() if k not in OBSERVABILITY_CALLBACKS}
    if callable(portable.get("oauth_cb")):
        raise ValueError("Kafka setting oauth_cb (OAUTHBEARER) cannot be passed to another process.")
    return portable
