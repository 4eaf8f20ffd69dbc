"""The lag trigger serialises without credentials and fires once the measured lag is within the limit."""

from __future__ import annotations

import asyncio
import json

import pytest

from exactly_once_provider.kafka.lag import Lag
from exactly_once_provider.triggers import consumer_lag
from exactly_once_provider.triggers.consumer_lag import ConsumerLagTrigger

SECURE = {
    "bootstrap.servers": "k:9093",
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "eo",
    "sasl.password": "kafka-MARKER-pw",
    "ssl.ca.location": "/etc/eo/ca.pem",
}
POSTGRES = {
    "conn_type": "postgres",
    "host": "db",
    "login": "u",
    "password": "pg-MARKER-pw",
    "extra": {"sslmode": "verify-full"},
}


@pytest.fixture
def secure_connections(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_SECURE", json.dumps({"conn_type": "kafka", "extra": SECURE}))
    monkeypatch.setenv("AIRFLOW_CONN_PG_SECURE", json.dumps(POSTGRES))


def test_serialize_round_trip_carries_connection_ids_not_secrets(secure_connections):
    trigger = ConsumerLagTrigger(
        "kafka_secure", ["t"], 10, sink="postgres", sink_location="s.t", sink_pipeline="p", postgres_conn_id="pg_secure"
    )
    path, kwargs = trigger.serialize()
    assert path == "exactly_once_provider.triggers.consumer_lag.ConsumerLagTrigger"
    assert ConsumerLagTrigger(**kwargs).serialize() == (path, kwargs)
    assert kwargs["kafka_config_id"] == "kafka_secure" and kwargs["postgres_conn_id"] == "pg_secure"
    text = json.dumps(kwargs)
    assert "MARKER" not in text and "k:9093" not in text and "sasl" not in text


def test_run_reads_the_whole_connection_again_in_the_triggerer(secure_connections, monkeypatch):
    seen = []

    def measure(config, topics, sink, location, pipeline, group, connect, missing_ok, s3, iceberg_catalog):
        seen.append((config, connect))
        return Lag({"t": {0: 5}}, {"t": {0: 5}})

    monkeypatch.setattr(consumer_lag, "measure_lag", measure)
    trigger = ConsumerLagTrigger(
        "kafka_secure",
        ["t"],
        0,
        sink="postgres",
        sink_location="s.t",
        sink_pipeline="p",
        postgres_conn_id="pg_secure",
        poll_interval=0.01,
    )

    async def first():
        async for event in trigger.run():
            return event.payload

    assert asyncio.run(first())["status"] == "ok"
    config, connect = seen[0]
    assert {k: config[k] for k in SECURE} == SECURE  # SASL/TLS included, not only bootstrap.servers
    assert connect["sslmode"] == "verify-full" and connect["password"] == "pg-MARKER-pw"


def test_fires_when_lag_drops(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": "h:9092"}})
    )
    measured = iter([Lag({"t": {0: 50}}, {"t": {0: 10}}), Lag({"t": {0: 50}}, {"t": {0: 45}})])
    monkeypatch.setattr(consumer_lag, "measure_lag", lambda *args: next(measured))
    trigger = ConsumerLagTrigger(
        "kafka_default", ["t"], 5, sink="delta", sink_location="/d", sink_pipeline="p", poll_interval=0.01
    )

    async def first():
        async for event in trigger.run():
            return event.payload

    payload = asyncio.run(first())
    assert payload["status"] == "ok" and payload["lag"] == 5 and payload["detail"] == "t[0] 5"


def test_the_lag_of_one_reader_over_several_tables_adds_up_their_sinks(monkeypatch):
    ends = {"p.s.a": {0: 10, 1: 4}, "p.s.b": {0: 7}}
    held = {"/lake/a": {"p.s.a": {0: 10, 1: 1}}, "/lake/b": {"p.s.b": {0: 2}}}
    monkeypatch.setattr(consumer_lag, "stable_end_offsets", lambda config, topics, missing_ok: ends)
    monkeypatch.setattr(consumer_lag, "sink_offsets", lambda sink, location, *args: held[location])
    lag = consumer_lag.measure_lag({}, ["p.s.a", "p.s.b"], "delta", ["/lake/a", "/lake/b"], "p-apply")
    assert (lag.total, lag.per_partition) == (8, {"p.s.a": {0: 0, 1: 3}, "p.s.b": {0: 5}})
    assert consumer_lag.measure_lag({}, ["p.s.a"], "delta", "/lake/a", "p-apply").committed == held["/lake/a"]


def test_an_iceberg_reader_gets_its_catalogs_database_and_the_named_aws_connection(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_CATALOG", json.dumps(POSTGRES))
    monkeypatch.setenv(
        "AIRFLOW_CONN_AWS_LAKE",
        json.dumps({"conn_type": "aws", "login": "AK", "password": "SK", "extra": {"endpoint_url": "http://m:9"}}),
    )
    connect, s3 = asyncio.run(consumer_lag.sink_connections("iceberg", ["lake.orders"], "lake_catalog", None))
    assert (connect["host"], connect["password"], connect["sslmode"], s3) == ("db", "pg-MARKER-pw", "verify-full", None)
    _, s3 = asyncio.run(consumer_lag.sink_connections("iceberg", ["lake.orders"], "lake_catalog", "aws_lake"))
    assert (s3.access_key_id, s3.endpoint_url) == ("AK", "http://m:9")


def test_an_iceberg_sinks_lag_is_read_from_its_snapshot_summary_in_the_named_catalog(tmp_path, monkeypatch):
    """The real reader (IcebergSink.committed) on a SQLite SqlCatalog standing in for the PostgreSQL one; the
    catalog's name reaches it from the sensor's argument through the trigger's serialised arguments."""
    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog

    from exactly_once_provider.sinks import iceberg
    from exactly_once_provider.sinks.base import BatchCommit

    catalogs = {}
    for name in ("eo", "lake"):
        catalogs[name] = SqlCatalog(name, uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}")
    monkeypatch.setattr(iceberg, "open_catalog", lambda settings, s3=None: catalogs[settings["name"]])
    catalogs["lake"].create_namespace("lake")
    rows = pa.table({"n": pa.array([1, 2], pa.int64())})
    table = catalogs["lake"].create_table("lake.orders", schema=rows.schema)
    table.append(rows, snapshot_properties=iceberg.summary_properties(BatchCommit("p", "ck", 0, {"t": {0: 7}}, 2)))
    monkeypatch.setattr(consumer_lag, "stable_end_offsets", lambda config, topics, missing_ok: {"t": {0: 10}})

    trigger = ConsumerLagTrigger("kafka_default", ["t"], 0, "iceberg", "lake.orders", "p", iceberg_catalog="lake")
    arguments = trigger.serialize()[1]
    lag = consumer_lag.measure_lag(
        {}, ["t"], "iceberg", "lake.orders", "p", None, {"host": "db"}, iceberg_catalog=arguments["iceberg_catalog"]
    )
    assert lag.committed == {"t": {0: 7}} and lag.total == 3
    # the same table is not in catalog eo (the default): its whole topic is lag
    assert consumer_lag.measure_lag({}, ["t"], "iceberg", "lake.orders", "p", None, {"host": "db"}).total == 10
