"""The one Kafka config builder: the Kafka provider's semantics through public API, read once, used by every client."""

from __future__ import annotations

import asyncio
import json

import confluent_kafka
import pytest
from airflow.providers.apache.kafka.hooks.base import KafkaBaseHook

from exactly_once_provider.hooks import kafka_client
from exactly_once_provider.hooks.kafka_producer import TransactionalProducerHook
from exactly_once_provider.kafka import lag
from exactly_once_provider.kafka_config import CONSUMER_GROUP, PRODUCER_ONLY
from exactly_once_provider.plugins.status import Connections
from exactly_once_provider.triggers.consumer_lag import ConsumerLagTrigger, measure_lag

ALLOWED_CALLBACK = f"{__name__}.oauth_token"


def oauth_token(oauthbearer_config: str) -> tuple[str, float]:
    return "token", 0.0


EXTRA = {
    "bootstrap.servers": "b1:9093",
    "client.id": "eo-client",
    "security.protocol": "SSL",
    "enable.ssl.certificate.verification": "false",
    "linger.ms": 5,
    "group.id": "theirs",
    "isolation.level": "read_uncommitted",
}
# Connections the writer accepts; each must reach the lag sensor's clients with the same settings.
WRITER_CONNECTIONS = {
    "scram": {
        "bootstrap.servers": "b1:9095,b2:9095",
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "eo",
        "sasl.password": "pw",
        "ssl.ca.location": "/etc/eo/ca.pem",
        "ssl.endpoint.identification.algorithm": "none",
    },
    "no_verify": EXTRA,
    "oauth": {
        "bootstrap.servers": "b1:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "OAUTHBEARER",
        "oauth_cb": ALLOWED_CALLBACK,
        "socket.keepalive.enable": True,
        "debug": "security",
        "acks": "all",
        "session.timeout.ms": 6000,
    },
}


def _connection(monkeypatch, conn_id: str, extra: dict) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "kafka", "extra": extra}))


@pytest.fixture
def allowlist(monkeypatch):
    monkeypatch.setenv("AIRFLOW__APACHE_KAFKA__CALLBACK_ALLOWLIST", ALLOWED_CALLBACK)


def _provider_config(conn_id: str):
    # The Kafka provider's own reading (its private method, here only as the reference our builder must match).
    try:
        return KafkaBaseHook(kafka_config_id=conn_id)._build_config()
    except Exception as err:  # noqa: BLE001 - the type is what is compared
        return type(err)


def _our_config(conn_id: str):
    try:
        return kafka_client.kafka_client_config(conn_id)
    except Exception as err:  # noqa: BLE001
        return type(err)


@pytest.mark.parametrize(
    "extra",
    [
        EXTRA,
        {"bootstrap.servers": "b:9092", "oauth_cb": ALLOWED_CALLBACK, "error_cb": ALLOWED_CALLBACK},
        {"bootstrap.servers": "b:9092", "error_cb": "os.system"},  # not allowed: refused, not imported
        {"security.protocol": "SSL"},  # no brokers
        # Amazon MSK IAM: a token callback is added (or, without the signer installed, both refuse alike)
        {"bootstrap.servers": "b-1.x.c2.kafka.eu-west-1.amazonaws.com:9098", "sasl.mechanism": "OAUTHBEARER"},
        # ... but never over the user's own callback
        {
            "bootstrap.servers": "b-1.x.c2.kafka.eu-west-1.amazonaws.com:9098",
            "sasl.mechanism": "OAUTHBEARER",
            "oauth_cb": ALLOWED_CALLBACK,
        },
        {"bootstrap.servers": "b-1.x.c2.kafka.eu-west-1.amazonaws.com:9098", "sasl.mechanism": "SCRAM-SHA-512"},
        # Google Managed Kafka (the google provider is not installed here: both refuse alike)
        {"bootstrap.servers": "bootstrap.c.r.managedkafka.p.cloud.goog:9092"},
    ],
    ids=["plain", "allowed-callbacks", "refused-callback", "no-brokers", "msk", "msk-own-cb", "msk-scram", "google"],
)
def test_the_builder_reads_a_connection_as_the_kafka_provider_does(monkeypatch, allowlist, extra):
    _connection(monkeypatch, "kafka_client_parity", extra)
    ours, theirs = _our_config("kafka_client_parity"), _provider_config("kafka_client_parity")
    if isinstance(theirs, dict) and callable(theirs.get("oauth_cb")) and "oauth_cb" not in extra:
        # The managed token callback: a new partial on each reading; the same function for the same region.
        assert (ours["oauth_cb"].args, ours["oauth_cb"].func.__name__) == (("eu-west-1",), "_msk_iam_token")
        ours, theirs = {**ours, "oauth_cb": None}, {**theirs, "oauth_cb": None}
    assert ours == theirs


def test_a_callback_outside_the_allowlist_is_refused_naming_the_connection(monkeypatch):
    _connection(monkeypatch, "kafka_client_refused", {"bootstrap.servers": "b:9092", "oauth_cb": ALLOWED_CALLBACK})
    with pytest.raises(ValueError, match=r"'kafka_client_refused'.*oauth_cb=.*callback_allowlist \(empty\)"):
        kafka_client.kafka_client_config("kafka_client_refused")


def test_a_connection_without_brokers_is_named(monkeypatch):
    _connection(monkeypatch, "kafka_client_empty", {"security.protocol": "SSL"})
    with pytest.raises(ValueError, match="Kafka connection 'kafka_client_empty' cannot be used"):
        kafka_client.kafka_client_config("kafka_client_empty")


def test_the_client_hook_reads_the_whole_connection_once(monkeypatch):
    _connection(monkeypatch, "kafka_client_once", EXTRA)
    hook = kafka_client.KafkaClientHook("kafka_client_once")
    reads = []
    original = hook.get_connection
    monkeypatch.setattr(hook, "get_connection", lambda conn_id: reads.append(conn_id) or original(conn_id))
    assert hook.client_config() == EXTRA
    hook.client_config()["group.id"] = "changed by a caller"
    assert hook.client_config() == EXTRA and reads == ["kafka_client_once"]


def test_the_producer_keeps_the_connection_but_its_consumer_group_settings(monkeypatch):
    _connection(monkeypatch, "kafka_client_producer", EXTRA)
    hook = TransactionalProducerHook(
        "kafka_client_producer", pipeline="p", delivery_mode="exactly_once", producer_config={"linger.ms": 20}
    )
    config = hook.build_producer_config()
    assert "group.id" not in config and "isolation.level" not in config
    assert (config["client.id"], config["enable.ssl.certificate.verification"]) == ("eo-client", "false")
    assert (config["linger.ms"], config["transactional.id"], config["acks"]) == (20, "eo-txn/p/0", "all")


class _Built(Exception):
    """Raised by a recording client once it has its settings: nothing connects in a unit test."""


def _recorder(kind: str, seen: dict):
    def build(config):
        seen[kind] = dict(config)
        raise _Built(kind)

    return build


@pytest.mark.parametrize("name", sorted(WRITER_CONNECTIONS))
def test_the_lag_sensor_and_status_page_take_every_connection_the_writer_takes_with_the_same_settings(
    monkeypatch, allowlist, name
):
    conn_id = f"kafka_client_lag_{name}"
    _connection(monkeypatch, conn_id, WRITER_CONNECTIONS[name])
    writer = TransactionalProducerHook(conn_id, pipeline=f"lag_{name}", delivery_mode="exactly_once")
    producer = writer.build_producer_config()

    seen: dict[str, dict] = {}
    monkeypatch.setattr(lag, "AdminClient", _recorder("admin", seen))
    monkeypatch.setattr(lag, "Consumer", _recorder("consumer", seen))
    trigger = ConsumerLagTrigger(kafka_config_id=conn_id, topics=["t"], max_lag=0, consumer_group="g")
    kafka, _, _ = asyncio.run(trigger._connections())  # what the triggerer reads
    with pytest.raises(_Built):
        measure_lag(kafka, ["t"], consumer_group="g")  # its admin client (stable end offsets)
    with pytest.raises(_Built):
        lag.group_offsets(kafka, "g", ["t"])  # its consumer (the group's offsets)

    monkeypatch.setattr(confluent_kafka, "Consumer", _recorder("status", seen))
    with pytest.raises(_Built):
        Connections().consumer(conn_id)  # the status page's consumer

    connection = writer.client_config()
    shared = {k: v for k, v in connection.items() if k not in PRODUCER_ONLY | CONSUMER_GROUP}
    assert shared and {k: producer[k] for k in shared} == shared  # the writer connects with these...
    assert seen["admin"] == shared  # ...the lag's admin with exactly these
    assert {k: seen["consumer"][k] for k in shared} == shared  # ...and its consumer too, plus its own group
    assert (seen["consumer"]["group.id"], seen["consumer"]["isolation.level"]) == ("g", "read_committed")
    assert {k: seen["status"][k] for k in shared} == shared and seen["status"]["isolation.level"] == "read_committed"
    if name == "oauth":
        assert producer["oauth_cb"] is seen["admin"]["oauth_cb"] is oauth_token
