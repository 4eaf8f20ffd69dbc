"""OpenLineage names of the provider's datasets, their facets, and the Airflow Asset URIs naming the same data.

One place for the naming, after the OpenLineage naming spec (https://openlineage.io/docs/spec/naming):

======================  ===============================  ============================  ==================================
dataset                 namespace                        name                          Asset URI (same dataset)
======================  ===============================  ============================  ==================================
MySQL/MariaDB table     ``mysql://host:port``            ``database.table``            ``mysql://host:port/db/table``
Kafka topic             ``kafka://bootstrap:port``       ``topic``                     ``kafka://bootstrap:port/topic``
PostgreSQL table        ``postgres://host:port``         ``database.schema.table``     ``postgres://host:port/db/s/t``
Delta table, files      ``file`` / ``s3://bucket``       path / key                    ``file:///path`` / ``s3://b/key``
Iceberg table           ``file`` / ``s3://bucket``       its location's path / key     ``file:///path`` / ``s3://b/key``
======================  ===============================  ============================  ==================================

A Delta or Iceberg table is named by where it lives, as the spec names a dataset on a file system or object store
(and as OpenLineage's Spark integration names both formats): never by a catalog's ``namespace.table``, which another
catalog of the same files would name differently.

The Asset URIs are those the Airflow MySQL, Kafka, PostgreSQL and common-io providers convert back into the
same OpenLineage datasets, so Airflow's asset graph and the lineage agree. The facets and the operators' lineage
methods are in :mod:`exactly_once_provider.lineage_facets`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


@dataclass(frozen=True)
class DatasetName:
    """An OpenLineage dataset identity, and the Airflow Asset URI of the same dataset."""

    namespace: str
    name: str
    asset_uri: str


def mysql_table(host: str, port: int | None, database: str, table: str) -> DatasetName:
    """Name a MySQL/MariaDB table.

    :param host: the server host.
    :param port: the server port (default 3306).
    :param database: the database (MySQL schema).
    :param table: the table.
    """
    _require(host=host, database=database, table=table)
    server = f"{host}:{port or 3306}"
    return DatasetName(f"mysql://{server}", f"{database}.{table}", f"mysql://{server}/{database}/{table}")


def kafka_topic(bootstrap_servers: str, topic: str) -> DatasetName:
    """Name a Kafka topic by the first of the cluster's bootstrap servers.

    :param bootstrap_servers: ``bootstrap.servers`` (comma-separated ``host:port``; a scheme is dropped).
    :param topic: the topic.
    """
    first = str(bootstrap_servers or "").split(",")[0].strip()
    server = first.split("://", 1)[-1]
    _require(bootstrap_servers=server, topic=topic)
    return DatasetName(f"kafka://{server}", topic, f"kafka://{server}/{topic}")


def postgres_table(host: str, port: int | None, database: str, table: str) -> DatasetName:
    """Name a PostgreSQL table.

    :param host: the server host.
    :param port: the server port (default 5432).
    :param database: the database.
    :param table: ``schema.table`` or ``table`` (schema ``public``).
    """
    schema, _, name = str(table).rpartition(".")
    schema = schema or "public"
    _require(host=host, database=database, table=name)
    server = f"{host}:{port or 5432}"
    return DatasetName(
        f"postgres://{server}", f"{database}.{schema}.{name}", f"postgres://{server}/{database}/{schema}/{name}"
    )


def storage_path(location: str) -> DatasetName:
    """Name a Delta table or files sink by its location (an absolute path, ``file://``, ``s3://`` or ``s3a://`` URI).

    :param location: the table's location as the operators take it.
    """
    _require(location=location)
    parts = urlsplit(str(location))
    if parts.scheme in ("", "file"):
        path = parts.path if parts.scheme else str(location)
        if not path.startswith("/"):
            raise ValueError(f"location {location!r}: use an absolute path (lineage names a file by its path).")
        path = path.rstrip("/") or "/"
        return DatasetName("file", path, f"file://{path}")
    if not parts.netloc:
        raise ValueError(f"location {location!r} names no bucket or host.")
    key = parts.path.strip("/")
    # s3a:// (Spark's name) is the same object as s3://: one dataset, named as the spec and the Amazon provider do.
    scheme = "s3" if parts.scheme in ("s3a", "s3n") else parts.scheme
    return DatasetName(f"{scheme}://{parts.netloc}", key or "/", f"{scheme}://{parts.netloc}/{key}")


def iceberg_table(location: str, mode: str = "append") -> DatasetName:
    """Name an Iceberg sink's table by its location, as a Delta table is named.

    :param location: the operator's ``sink_path``: the table's location; in ``current`` mode the Delta full load
        the table is built from, beside which the Iceberg table lives (``<sink_path>_iceberg``).
    :param mode: the sink's mode.
    """
    from exactly_once_provider.sinks.iceberg_current import current_location

    _require(location=location)
    return storage_path(current_location(location) if mode == "current" else location)


def _require(**values: Any) -> None:
    empty = [k for k, v in values.items() if not v]
    if empty:
        raise ValueError(f"Lineage needs {', '.join(empty)}: got an empty value.")


# --------------------------------------------------------------------------------------- from connections
def mysql_table_of(mysql_conn_id: str, table: str) -> DatasetName:
    """Name ``table`` (``schema.table``, or ``table`` in the connection's schema) of a ``mysql`` connection.

    :param mysql_conn_id: the Airflow connection.
    :param table: the table.
    """
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(mysql_conn_id)
    schema, _, name = str(table).rpartition(".")
    return mysql_table(conn.host, conn.port, schema or conn.schema, name)


def kafka_topic_of(kafka_config_id: str, topic: str) -> DatasetName:
    """Name ``topic`` of a ``kafka`` connection (its Extra's ``bootstrap.servers``).

    :param kafka_config_id: the Airflow connection.
    :param topic: the topic.
    """
    from airflow.sdk import BaseHook

    servers = BaseHook.get_connection(kafka_config_id).extra_dejson.get("bootstrap.servers", "")
    return kafka_topic(servers, topic)


def postgres_table_of(postgres_conn_id: str, table: str) -> DatasetName:
    """Name ``table`` of a ``postgres`` connection (its schema field is the database).

    :param postgres_conn_id: the Airflow connection.
    :param table: ``schema.table`` or ``table``.
    """
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(postgres_conn_id)
    return postgres_table(conn.host, conn.port, conn.schema, table)
