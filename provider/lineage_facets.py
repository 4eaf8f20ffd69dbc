"""OpenLineage facets of the provider's datasets, and the operators' lineage methods.

The datasets are named by :mod:`exactly_once_provider.lineage`. Each operator reports its inputs and outputs
with their schemas (read from ``information_schema`` or the Delta log), what a run wrote (output statistics)
and the progress it committed with its output (binlog position, window, Kafka offsets) as the custom output
facet :class:`CommitFacet` (``exactlyOnce_commit``).
"""

from __future__ import annotations

import json
from typing import Any

import attr
from openlineage.client.generated.base import InputDataset, OutputDataset, OutputDatasetFacet
from openlineage.client.generated.output_statistics_output_dataset import OutputStatisticsOutputDatasetFacet
from openlineage.client.generated.schema_dataset import SchemaDatasetFacet, SchemaDatasetFacetFields

from exactly_once_provider.lineage import DatasetName

COMMIT_FACET = "exactlyOnce_commit"
# The record envelopes the producers write (their full description: capture.change_record, source.watermark).
CHANGE_RECORD_FIELDS = ("format", "op", "pk", "before", "after", "version", "source", "commit_ts", "schema_version")
WINDOW_RECORD_FIELDS = ("op", "table", "cursor", "row")


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


def delta_fields(location) -> list[tuple[str, str]]:
    """Return ``(column, type)`` of a Delta table's newest schema; empty when it has no commit yet.

    :param location: the table's location (or the storage rooted at it: a table on S3).
    """
    from exactly_once_provider.sinks.delta_log import table_state

    state = table_state(location)
    if state is None:
        return []
    return [
        (f["name"], f["type"] if isinstance(f["type"], str) else f["type"].get("type", "struct"))
        for f in json.loads(state.metadata["schemaString"])["fields"]
    ]


def delta_commit_size(location, after_version: int, upto_version: int) -> tuple[int, int]:
    """Return ``(bytes, files)`` the commits ``after_version < v <= upto_version`` of a Delta table added.

    :param location: the table's location (or the storage rooted at it: a table on S3).
    :param after_version: the newest version before the run (-1: none).
    :param upto_version: the newest version after it.
    """
    from exactly_once_provider.sinks.delta_log import read_log_file

    size = files = 0
    for version in range(after_version + 1, upto_version + 1):
        for action in read_log_file(location, f"{version:020d}.json"):
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


def output_dataset(
    name: DatasetName,
    fields: list | None = None,
    rows: int | None = None,
    size: int | None = None,
    files: int | None = None,
    commit: CommitFacet | None = None,
) -> OutputDataset:
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
        output_facets["outputStatistics"] = OutputStatisticsOutputDatasetFacet(
            rowCount=rows, size=size, fileCount=files
        )
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
