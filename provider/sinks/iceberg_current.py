"""The Iceberg current table: built from the Delta full load in ONE snapshot, then merged by key batch by batch.

The table and its rule are :mod:`~exactly_once_provider.sinks.current_table`'s (the source columns typed as the full
load loads them, then ``_eo_version`` and ``_eo_deleted``; a change replaces a row only if its version is newer;
deletes stay as tombstones). As for the PostgreSQL current table, the full load itself is the Delta one of the
history -> stream template: the job's ``sink_path`` is that Delta table, and the Iceberg table lives beside it
(:func:`current_location`).

:func:`build` (the job's ``prepare``): the full load's rows, read from the Delta commit its handoff names with
delta-rs batch by batch, are written as Parquet files into ``data/load-<load id>-<nonce>/`` and committed in ONE
``overwrite`` snapshot that also removes every data file of an older load (a full reload). The snapshot carries
the load's schema state (``eo.schema``: the load id, its columns) and the stream's newest fence unchanged, so the
table of a load is there whole or the old one is, and the stream goes on from its offsets (its changes older
than the new load are left out by version:
:func:`~exactly_once_provider.spark_jobs.current_changes.typed_changes`' ``since``). A table that already holds
the load is left alone: a restarted job builds nothing.

The batches after it: :mod:`~exactly_once_provider.sinks.iceberg_merge` (one overwrite snapshot each).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import replace
from typing import Any

from exactly_once_provider.sinks.current_table import META_COLUMNS
from exactly_once_provider.sinks.iceberg_merge import FILE_ROWS

log = logging.getLogger(__name__)

BUILD_BATCH_ROWS = 50_000


def current_location(path: str) -> str:
    """Return where the Iceberg current table built from the Delta full load at ``path`` lives: beside it."""
    return path.rstrip("/") + "_iceberg"


def full_load_dataset(handoff: Any, location: str, storage_options: dict | None) -> Any:
    """Return the pyarrow dataset of the full load ``handoff`` names (its Delta commit, read by delta-rs)."""
    from deltalake import DeltaTable

    try:
        return DeltaTable(location, version=handoff.table_version, storage_options=storage_options).to_pyarrow_dataset()
    except Exception as err:
        raise RuntimeError(
            f"The full load {handoff.load_id} of {handoff.schema}.{handoff.table} (version {handoff.table_version} "
            f"of {location}) cannot be read any more ({type(err).__name__}: {err}); run a full reload "
            "(full_reload=true) to build the Iceberg current table again."
        ) from err


def table_schema(handoff: Any, dataset: Any) -> Any:
    """Return the Arrow schema of the current table: the full load's columns and types, every column nullable
    (Spark writes the batches' files with optional columns)."""
    import pyarrow as pa

    names = [c.name for c in handoff.columns] + list(META_COLUMNS)
    return pa.schema([pa.field(name, dataset.schema.field(name).type, nullable=True) for name in names])


def schema_state(handoff: Any) -> dict:
    """Return the schema state of a table just built from ``handoff`` (what CurrentChanges starts from)."""
    return {
        "load_id": handoff.load_id,
        "columns": [c.to_json() for c in handoff.columns],
        "fills": [],
        "applied": handoff.min_version,
    }


def built_load(summaries: Any) -> str | None:
    """Return the load id of the newest schema state among ``summaries`` (newest first), or None."""
    from exactly_once_provider.sinks.iceberg import SCHEMA

    for summary in summaries:
        if SCHEMA in summary:
            return json.loads(summary[SCHEMA]).get("load_id")
    return None


def build(sink: Any, table: Any, dataset: Any) -> bool:
    """Build ``table`` from the full load ``sink.source`` names unless it holds that load; return whether built.

    :param sink: the :class:`~exactly_once_provider.sinks.iceberg.IcebergSink` (current mode).
    :param table: the pyiceberg table, as loaded (the commit asserts its snapshot).
    :param dataset: :func:`full_load_dataset`.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import parquet_file_to_data_file

    from exactly_once_provider.sinks.iceberg import BUILT_BY, SCHEMA, SCHEMA_MARKER, summary_properties

    handoff = sink.source
    if built_load(sink._summaries(table)) == handoff.load_id:
        return False
    started = time.monotonic()
    schema = table_schema(handoff, dataset)
    held = [field.name for field in table.schema().fields]
    if held != schema.names:
        raise ValueError(
            f"Iceberg table {sink.identifier} has the columns {held}, the full load {handoff.load_id} has "
            f"{schema.names}: the Iceberg current table does not follow schema changes yet. Drop the table to "
            "build it again from this load, or use the Delta sink."
        )
    storage = sink.storage()
    folder = f"data/load-{handoff.load_id}-{uuid.uuid4().hex[:8]}"
    files, rows, writer, path = [], 0, None, None
    for batch in dataset.to_batches(columns=schema.names, batch_size=BUILD_BATCH_ROWS):
        # files of the merge's size; the full load's files are its chunks (key ranges), so these hold ranges too,
        # as far as delta-rs lists them in chunk order
        if writer is None or rows >= FILE_ROWS * len(files):
            if writer is not None:
                writer.close()
            key = f"{folder}/part-{len(files):05d}.parquet"
            filesystem, path = storage.arrow_path(key)
            uri = storage.uri(key)
            if not uri.startswith("s3://"):  # an object store has no folders to create
                filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
            writer = pq.ParquetWriter(path, schema, filesystem=filesystem)
            files.append(uri if uri.startswith("s3://") else "file://" + uri)
        writer.write_table(pa.Table.from_batches([batch]).cast(schema))
        rows += batch.num_rows
    if writer is not None:
        writer.close()
    found = sink._commit_in(table)
    state = schema_state(handoff)
    if found is not None:  # the stream's fence goes on unchanged: the build moves no offsets
        properties = summary_properties(replace(found, rows_total=rows, extra={SCHEMA_MARKER: state}))
    else:
        properties = {BUILT_BY: sink.pipeline, SCHEMA: json.dumps(state, sort_keys=True, separators=(",", ":"))}
    old = [task.file for task in table.scan().plan_files()]
    # EO_FAULT_AT=iceberg_current_built: the load's files written, its snapshot not committed
    from exactly_once_provider.faults import fault_point

    fault_point("iceberg_current_built")
    with table.transaction() as tx:
        with tx.update_snapshot(snapshot_properties=properties).overwrite() as overwrite:
            for data_file in old:
                overwrite.delete_data_file(data_file)
            for uri in files:
                overwrite.append_data_file(parquet_file_to_data_file(table.io, tx.table_metadata, uri))
    log.info(
        "Iceberg current table %s built from full load %s: %d rows in %d files, %d files of an older load "
        "removed, in %.1fs",
        sink.identifier,
        handoff.load_id,
        rows,
        len(files),
        len(old),
        time.monotonic() - started,
    )
    return True
