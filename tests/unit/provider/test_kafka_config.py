"""The one rule: which settings of a ``kafka`` connection each Kafka client role keeps."""

from __future__ import annotations

import pytest

from exactly_once_provider.kafka_config import (
    ADMIN,
    CONSUMER,
    CONSUMER_GROUP,
    DROPPED,
    PRODUCER,
    PRODUCER_ONLY,
    SPARK_SOURCE,
    admin_config,
    consumer_config,
    for_role,
    producer_config,
    spark_kafka_options,
)


def oauth_token(config_str: str) -> tuple[str, float]:
    return "token", 0.0


# What the lag sensor's clients must keep to connect as the writer does.
CONNECTION = {
    "bootstrap.servers": "b1:9093",
    "client.id": "eo-client",
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "OAUTHBEARER",
    "oauth_cb": oauth_token,
    "ssl.ca.location": "/etc/eo/ca.pem",
    "enable.ssl.certificate.verification": "false",
    "socket.keepalive.enable": True,
    "error_cb": print,
    "debug": "broker",
}
PRODUCER_SETTINGS = {"linger.ms": 5, "acks": "all", "transactional.id": "t", "compression.type": "lz4"}
GROUP_SETTINGS = {"group.id": "theirs", "isolation.level": "read_uncommitted", "enable.auto.commit": True}
WHOLE = {**CONNECTION, **PRODUCER_SETTINGS, **GROUP_SETTINGS}


@pytest.mark.parametrize("role", [PRODUCER, CONSUMER, ADMIN])
def test_every_librdkafka_client_keeps_the_whole_connection(role):
    kept = for_role(WHOLE, role)
    assert {k: kept[k] for k in CONNECTION} == CONNECTION  # oauth_cb, client.id, enable.ssl... included


def test_admin_and_consumer_drop_producer_and_group_settings_producer_drops_group_settings():
    assert admin_config(WHOLE) == CONNECTION
    assert for_role(WHOLE, CONSUMER) == CONNECTION
    assert producer_config(WHOLE) == {**CONNECTION, **PRODUCER_SETTINGS}
    assert DROPPED[PRODUCER] == CONSUMER_GROUP
    assert DROPPED[ADMIN] == DROPPED[CONSUMER] == PRODUCER_ONLY | CONSUMER_GROUP
    assert not PRODUCER_ONLY & CONSUMER_GROUP


def test_a_consumer_owns_its_group_reads_committed_and_never_commits():
    config = consumer_config(WHOLE, "mine", settings={"enable.partition.eof": True})
    assert config == {
        **CONNECTION,
        "group.id": "mine",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
    }
    assert consumer_config(CONNECTION, "g", "read_uncommitted")["isolation.level"] == "read_uncommitted"
    with pytest.raises(ValueError, match="isolation_level"):
        consumer_config(CONNECTION, "g", "uncommitted")


def test_the_callers_producer_settings_win_over_the_connections():
    config = producer_config(WHOLE, {"transactional.id": "mine", "transaction.timeout.ms": 1000})
    assert (config["transactional.id"], config["transaction.timeout.ms"], config["linger.ms"]) == ("mine", 1000, 5)


def test_the_spark_source_drops_what_it_manages_and_refuses_what_it_cannot_take():
    plain = {"bootstrap.servers": "b:9092", "client.id": "c", "debug": "all", "error_cb": print}
    assert spark_kafka_options({**plain, **PRODUCER_SETTINGS, **GROUP_SETTINGS}) == {
        "kafka.bootstrap.servers": "b:9092",
        "kafka.client.id": "c",
        "kafka.security.protocol": "PLAINTEXT",
    }
    with pytest.raises(ValueError, match="oauth_cb"):
        spark_kafka_options({**plain, "oauth_cb": oauth_token})
    assert "oauth_cb" not in DROPPED[SPARK_SOURCE]


def test_an_unknown_role_is_refused():
    with pytest.raises(ValueError, match="role 'reader'"):
        for_role(CONNECTION, "reader")


def test_settings_named_alike_in_both_clients_reach_the_spark_source_as_they_are():
    tuned = {"bootstrap.servers": "b:9092", "retry.backoff.ms": 250, "reconnect.backoff.max.ms": 5000}
    options = spark_kafka_options(tuned)
    assert (options["kafka.retry.backoff.ms"], options["kafka.reconnect.backoff.max.ms"]) == ("250", "5000")
    assert "retry.backoff.ms" not in DROPPED[SPARK_SOURCE]
