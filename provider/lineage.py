"""OpenLineage names of the provider's datasets, their facets, and the Airflow Asset URIs naming the same data.

One place for the naming, after the OpenLineage naming spec (https://openlineage.io/docs/spec/naming):

======================  ===============================  ============================  ==================================
dataset                 namespace                        name                          Asset URI (same dataset)
======================  ===============================  ============================  ==================================
MySQL/MariaDB table     ``mysql://host:port``            ``database.table``            ``mysql://host:port/db/table``
Kafka topic             ``kafka://bootstrap:port``       ``topic``                     ``kafka://bootstrap:port/topic``
PostgreSQL table        ``postgres://host:port``         ``database.schema.table``     ``postgres://host:port/db/s/t``
Delta table, files      ``file`` / ``s3://bucket``       path / key                    ``file:///path`` / ``s3://b/key``
======================  ===============================  ============================  ==================================

The Asset URIs are those the Airflow MySQL, Kafka, PostgreSQL and common-io providers convert back into the
same OpenLineage datasets, so Airflow's asset graph and the lineage agree. The committed source position of a
run (binlog position, window bounds, Kafka offsets) travels as the custom output facet :class:`CommitFacet`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import attr
from openlineage.client.generated.base import InputDataset, OutputDataset, OutputDatasetFacet
from openlineage.client.generated.output_statistics_output_dataset import OutputStatisticsOutputDatasetFacet
from openlineage.client.generated.schema_dataset import SchemaDatasetFacet, SchemaDatasetFacetFields

COMMIT_FACET = "exactlyOnce_commit"
# The record envelopes the producers write (their full description: capture.change_record, source.watermark).
CHANGE_RECORD_FIELDS = ("format", "op", "pk", "before", "after", "version", "source", "commit_ts", "schema_version")
WINDOW_RECORD_FIELDS = ("op", "table", "cursor", "row")


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
    return DatasetName(f"postgres://{server}", f"{database}.{schema}.{name}",
                       f"postgres://{server}/{database}/{schema}/{name}")


def storage_path(location: str) -> DatasetName:
    """Name a Delta table or files sink by its storage location (an absolute path, ``file://`` or ``s3://`` URI).

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
    return DatasetName(f"{parts.scheme}://{parts.netloc}", key or "/", f"{parts.scheme}://{parts.netloc}/{key}")


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


# --------------------------------------------------------------------------------------- schemas
def mysql_fields(cur: Any, table: str, default_schema: str | None = None) -> list[tuple[str, str]]:
    """Return ``(column, type)`` of a source table from ``information_schema``.

    :param cur: an open cursor of the source.
    :param table: ``schema.table`` or ``table``.
    :param default_schema: the schema of a bare table name.
    """
    from exactly_once_provider.full_load.columns import table_columns

    schema, _, name = str(table).rpartition(".")
    return [(c.name, c.column_type) for c in table_columns(cur, schema or default_schema or "", name)]


def delta_fields(location: str) -> list[tuple[str, str]]:
    """Return ``(column, type)`` of a Delta table's newest schema; empty when it has no commit yet.

    :param location: the table's location.
    """
    from exactly_once_provider.sinks.delta_log import table_state

    state = table_state(location)
    if state is None:
        return []
    return [(f["name"], f["type"] if isinstance(f["type"], str) else f["type"].get("type", "struct"))
            for f in json.loads(state.metadata["schemaString"])["fields"]]


def delta_commit_size(location: str, after_version: int, upto_version: int) -> tuple[int, int]:
    """Return ``(bytes, files)`` the commits ``after_version < v <= upto_version`` of a Delta table added.

    :param location: the table's location.
    :param after_version: the newest version before the run (-1: none).
    :param upto_version: the newest version after it.
    """
    from exactly_once_provider.sinks.delta_log import log_dir, read_actions

    size = files = 0
    for version in range(after_version + 1, upto_version + 1):
        for action in read_actions(log_dir(location) / f"{version:020d}.json"):
            if "add" in action:
                size += int(action["add"].get("size") or 0)
                files += 1
    return size, files


def record_fields(envelope: tuple[str, ...], image: str, columns: list[tuple[str, str]]) -> list:
    """Return the schema of a topic's JSON records: the envelope, with the source columns under ``image``.

    :param envelope: the record's top-level fields.
    :param image: the field(s) holding a source row (``"before,after"`` for change records).
    :param columns: the source table's ``(column, type)``.
    """
    images = set(image.split(","))
    return [(f, "struct", columns) if f in images else (f, "json") for f in envelope]


# --------------------------------------------------------------------------------------- facets
@attr.define
class CommitFacet(OutputDatasetFacet):
    """The committed progress a run wrote together with its output (the source of truth, never Airflow's)."""

    pipeline: str | None = attr.field(default=None)
    position: str | None = attr.field(default=None)  # a binlog position, e.g. binlog.000001:18146205
    gtid: str | None = attr.field(default=None)
    window: dict | None = attr.field(default=None)  # a settlement window: id, version, bounds
    kafkaOffsets: dict | None = attr.field(default=None)  # noqa: N815 - topic -> partition -> end offset
    sinkVersion: int | None = attr.field(default=None)  # noqa: N815 - Delta version / sink batch id

    @staticmethod
    def _get_schema() -> str:
        return "urn:exactly-once-provider:facet:CommitFacet:1"


def schema_facet(fields: list) -> SchemaDatasetFacet:
    """Build a schema facet from ``(name, type)`` or ``(name, type, nested fields)`` tuples.

    :param fields: the columns.
    """
    def one(field: tuple) -> SchemaDatasetFacetFields:
        nested = [one(f) for f in field[2]] if len(field) > 2 else None
        return SchemaDatasetFacetFields(name=field[0], type=field[1], fields=nested)

    return SchemaDatasetFacet(fields=[one(f) for f in fields])


def input_dataset(name: DatasetName, fields: list | None = None) -> InputDataset:
    """Build an input dataset, with its schema when known.

    :param name: the dataset.
    :param fields: its columns (see :func:`schema_facet`).
    """
    facets = {"schema": schema_facet(fields)} if fields else {}
    return InputDataset(namespace=name.namespace, name=name.name, facets=facets)


def output_dataset(name: DatasetName, fields: list | None = None, rows: int | None = None, size: int | None = None,
                   files: int | None = None, commit: CommitFacet | None = None) -> OutputDataset:
    """Build an output dataset with its schema, what the run wrote and the progress committed with it.

    :param name: the dataset.
    :param fields: its columns (see :func:`schema_facet`).
    :param rows: rows (records) this run wrote.
    :param size: bytes this run wrote, when known.
    :param files: files this run added, when known.
    :param commit: the progress committed with the output.
    """
    facets = {"schema": schema_facet(fields)} if fields else {}
    output_facets: dict[str, Any] = {}
    if rows is not None:
        output_facets["outputStatistics"] = OutputStatisticsOutputDatasetFacet(rowCount=rows, size=size,
                                                                               fileCount=files)
    if commit is not None:
        output_facets[COMMIT_FACET] = commit
    return OutputDataset(namespace=name.namespace, name=name.name, facets=facets, outputFacets=output_facets)


# --------------------------------------------------------------------------------------- operators
class OpenLineageMixin:
    """Give an operator ``get_openlineage_facets_on_start/complete/failure`` from one method.

    The operator implements :meth:`openlineage_datasets` and keeps its return value (the XCom it returns) in
    :attr:`openlineage_result` before ``execute`` returns; the OpenLineage listener calls these methods on the
    same operator object after the task ran. A failed run reports the datasets without statistics: nothing
    of it was committed.
    """

    openlineage_result: Any = None

    def openlineage_datasets(self, result: Any) -> tuple[list[InputDataset], list[OutputDataset]]:
        """Return the run's inputs and outputs; ``result`` is the task's result, None before or after a failure."""
        raise NotImplementedError

    def lineage_fields(self, what: str, read: Any) -> list | None:
        """Return ``read()`` (a schema), or None with a warning: a schema that cannot be read leaves the
        datasets without it rather than the event without datasets."""
        try:
            return read()
        except Exception as err:
            self.log.warning("OpenLineage: could not read the schema of %s: %s", what, err)  # type: ignore[attr-defined]
            return None

    def _operator_lineage(self, result: Any) -> Any:
        from airflow.providers.openlineage.extractors import OperatorLineage

        inputs, outputs = self.openlineage_datasets(result)
        return OperatorLineage(inputs=inputs, outputs=outputs)

    def get_openlineage_facets_on_start(self) -> Any:
        """Return the datasets the task reads and writes."""
        return self._operator_lineage(None)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """Return the datasets with their schemas, what the run wrote and the progress it committed."""
        return self._operator_lineage(self.openlineage_result)

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        """Return the datasets without statistics (a failed run committed nothing)."""
        return self._operator_lineage(None)
