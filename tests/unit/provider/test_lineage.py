"""The OpenLineage naming: every dataset kind by the naming spec, and its Asset URI converted back by the Airflow
providers' own converters into the same OpenLineage dataset (so the asset graph and the lineage agree)."""

from __future__ import annotations

import json

import pytest
from airflow.sdk import Asset

from exactly_once_provider import lineage

pytestmark = pytest.mark.unit


def _converted(name: lineage.DatasetName) -> tuple[str, str]:
    """Return (namespace, name) of ``name.asset_uri`` as Airflow's OpenLineage integration converts the Asset."""
    from airflow.providers.openlineage.utils.utils import translate_airflow_asset

    dataset = translate_airflow_asset(Asset(uri=name.asset_uri), None)
    assert dataset is not None, f"no provider converts {name.asset_uri}"
    return dataset.namespace, dataset.name


@pytest.mark.parametrize(
    ("name", "namespace", "dataset"),
    [
        (lineage.mysql_table("127.0.0.1", 13306, "eo", "orders"), "mysql://127.0.0.1:13306", "eo.orders"),
        (lineage.mysql_table("db.example", None, "shop", "orders"), "mysql://db.example:3306", "shop.orders"),
        (
            lineage.kafka_topic("127.0.0.1:19095,127.0.0.1:19096", "p.eo.orders"),
            "kafka://127.0.0.1:19095",
            "p.eo.orders",
        ),
        (lineage.kafka_topic("SASL_SSL://broker:9093", "t"), "kafka://broker:9093", "t"),
        (lineage.postgres_table("127.0.0.1", 15432, "eo", "report"), "postgres://127.0.0.1:15432", "eo.public.report"),
        (lineage.postgres_table("pg", None, "eo", "fin.report"), "postgres://pg:5432", "eo.fin.report"),
        (lineage.storage_path("/var/lake/orders"), "file", "/var/lake/orders"),
        (lineage.storage_path("file:///var/lake/orders/"), "file", "/var/lake/orders"),
        (lineage.storage_path("s3://lake/tables/orders"), "s3://lake", "tables/orders"),
        (lineage.storage_path("s3a://lake/tables/orders/"), "s3://lake", "tables/orders"),  # Spark's name, same object
        # an Iceberg table by its location, as a Delta table; the current table lives beside its Delta full load
        (lineage.iceberg_table("s3a://lake/warehouse/orders"), "s3://lake", "warehouse/orders"),
        (lineage.iceberg_table("/var/lake/orders/", "current"), "file", "/var/lake/orders_iceberg"),
        (lineage.iceberg_table("s3://lake/loads/orders", "current"), "s3://lake", "loads/orders_iceberg"),
    ],
)
def test_names_follow_the_spec_and_their_asset_uris_convert_back(name, namespace, dataset):
    assert (name.namespace, name.name) == (namespace, dataset)
    if not name.asset_uri.startswith("s3://"):  # the Amazon provider (s3 converter) is not installed here
        assert _converted(name) == (namespace, dataset)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: lineage.mysql_table("", 3306, "eo", "t"), "host"),
        (lambda: lineage.kafka_topic("", "t"), "bootstrap_servers"),
        (lambda: lineage.kafka_topic("b:1", ""), "topic"),
        (lambda: lineage.postgres_table("h", 1, "", "t"), "database"),
        (lambda: lineage.storage_path("relative/path"), "absolute path"),
        (lambda: lineage.storage_path("s3:///key"), "no bucket"),
        (lambda: lineage.iceberg_table("", "current"), "location"),
    ],
)
def test_incomplete_names_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_the_iceberg_current_table_is_named_where_the_job_creates_it():
    from exactly_once_provider.sinks.iceberg_current import current_location

    assert lineage.iceberg_table("/var/lake/orders", "current").name == current_location("/var/lake/orders")
    assert lineage.iceberg_table("/var/lake/orders", "cdc").name == "/var/lake/orders"


def test_names_from_connections(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_EO_MYSQL",
        json.dumps(
            {"conn_type": "mysql", "host": "10.0.0.5", "port": 3307, "schema": "shop", "login": "u", "password": "p"}
        ),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_EO_KAFKA",
        json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": "k1:9092,k2:9092", "sasl.password": "x"}}),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_EO_PG",
        json.dumps(
            {"conn_type": "postgres", "host": "pg", "port": 5433, "schema": "dw", "login": "u", "password": "p"}
        ),
    )
    assert lineage.mysql_table_of("eo_mysql", "orders").asset_uri == "mysql://10.0.0.5:3307/shop/orders"
    assert lineage.mysql_table_of("eo_mysql", "other.orders").name == "other.orders"
    assert lineage.kafka_topic_of("eo_kafka", "t").asset_uri == "kafka://k1:9092/t"
    assert lineage.postgres_table_of("eo_pg", "r").asset_uri == "postgres://pg:5433/dw/public/r"
