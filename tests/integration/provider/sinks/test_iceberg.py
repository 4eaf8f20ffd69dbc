"""The Iceberg sink against the stack's PostgreSQL (the SQL catalog) on local disk and on MinIO.

Batches committed through the sink (Spark writes the files, the driver commits one fenced snapshot each), a replay,
a batch of no rows, and two zombies (one planned on an older commit, one whose snapshot moved while it wrote) are
read back by two readers the sink does not use for its commits: DuckDB's ``iceberg_scan`` and pyiceberg's scan.
Both must hold exactly the committed rows, row by row: none lost, none doubled, nothing of a refused batch.
"""

from __future__ import annotations

import os
import uuid
from collections import Counter

import pytest

from exactly_once_provider.sinks.base import BatchCommit, StaleBatchError, open_sink
from exactly_once_provider.sinks.iceberg import BATCH_ID, PIPELINE, IcebergSink, catalog_settings
from exactly_once_provider.storage import open_storage

COLUMNS = ("kafka_partition", "kafka_offset", "record_key", "record_value")


def duckdb_rows(metadata_location: str, s3=None) -> list[tuple]:
    """Rows of the table's current snapshot through DuckDB's Iceberg reader (the duckdb-ext-* packages, offline)."""
    import duckdb

    extensions = os.path.join(os.path.dirname(os.path.dirname(duckdb.__file__)), "duckdb_ext", "extensions")
    con = duckdb.connect()
    try:
        con.execute("SET extension_directory = ?", [extensions])
        con.execute("SET autoinstall_known_extensions = false")
        con.execute("LOAD iceberg")
        if s3 is not None:
            con.execute("LOAD httpfs")
            endpoint = s3.endpoint_url.split("://", 1)[1]
            # the stack's development credentials, in this test's own DuckDB only
            con.execute(
                f"CREATE SECRET minio (TYPE s3, KEY_ID '{s3.access_key_id}', SECRET '{s3.secret_access_key}', "
                f"ENDPOINT '{endpoint}', URL_STYLE 'path', USE_SSL false, REGION '{s3.region_name}')"
            )
        return con.execute(f"SELECT {', '.join(COLUMNS)} FROM iceberg_scan(?)", [metadata_location]).fetchall()
    finally:
        con.close()


def pyiceberg_rows(table) -> list[tuple]:
    """Rows of the table's current snapshot through pyiceberg's scan (its own planning over the manifests)."""
    arrow = table.scan(selected_fields=COLUMNS).to_arrow()
    return list(zip(*(arrow.column(c).to_pylist() for c in COLUMNS)))


def read_both(sink: IcebergSink, s3=None) -> list[tuple]:
    """The rows both readers see; fail unless they see the same rows (as multisets)."""
    table = sink.catalog().load_table(sink.identifier)
    from_duckdb = duckdb_rows(table.metadata_location, s3)
    from_pyiceberg = pyiceberg_rows(table)
    assert Counter(from_duckdb) == Counter(from_pyiceberg), "DuckDB and pyiceberg read different rows"
    return from_pyiceberg


@pytest.fixture(params=["local", "s3"])
def iceberg_table(request, tmp_path, stack, airflow_connections):
    """``(identifier, location, S3 settings or None)`` of a new table; dropped (and its objects deleted) after."""
    identifier = f"it_iceberg_{uuid.uuid4().hex[:10]}.events"
    s3 = None
    if request.param == "local":
        location = str(tmp_path / "events")
    else:
        s3 = stack.minio_settings()
        location = f"s3://{stack.MINIO_BUCKETS[0]}/it-iceberg/{uuid.uuid4().hex}"
    yield identifier, location, s3
    catalog = IcebergSink(identifier, "-", catalog_settings("postgres_default"), s3=s3).catalog()
    if catalog.table_exists(identifier):
        catalog.drop_table(identifier)
    catalog.drop_namespace(identifier.rsplit(".", 1)[0])
    if s3 is not None:
        open_storage(location, s3).delete_prefix("")


def _batch(spark, topic: str, start: int, end: int):
    """Records ``start``..``end - 1`` as the append mode's columns (two partitions, offsets = record numbers)."""
    return spark.range(start, end, numPartitions=2).selectExpr(
        f"'{topic}' AS kafka_topic",
        "CAST(id % 2 AS INT) AS kafka_partition",
        "id AS kafka_offset",
        "concat('k', id) AS record_key",
        "concat('{\"n\":', id, '}') AS record_value",
    )


def _writer(identifier: str, pipeline: str, location: str, s3) -> IcebergSink:
    """The sink as the Spark job opens it (``open_sink``), its catalog the ``postgres_default`` connection's."""
    return open_sink(
        "iceberg",
        identifier,
        pipeline,
        iceberg_catalog=catalog_settings("postgres_default"),
        iceberg_location=location,
        s3=s3,
    )


def _expected(start: int, end: int) -> list[tuple]:
    return [(n % 2, n, f"k{n}", f'{{"n":{n}}}') for n in range(start, end)]


def test_batches_commit_once_each_and_zombies_commit_nothing(spark, iceberg_table):
    identifier, location, s3 = iceberg_table
    pipeline, topic = f"it-{uuid.uuid4().hex[:8]}", "events"
    sink = _writer(identifier, pipeline, location, s3)
    sink.prepare()
    sink.prepare()  # idempotent: the second start finds the table
    assert sink.committed() is None and sink.commit_location() == ""

    def offsets(end: int) -> dict:
        return {topic: {0: (end + 1) // 2, 1: end // 2}}

    assert sink.commit(_batch(spark, topic, 0, 30), BatchCommit(pipeline, "c1", 0, offsets(30)), expected=None)
    first = sink.committed()
    assert (first.batch_id, first.offsets, first.rows_total) == (0, offsets(30), 30)
    assert sink.commit(_batch(spark, topic, 30, 50), BatchCommit(pipeline, "c1", 1, offsets(50)), expected=first)
    second = sink.committed()
    snapshot = sink.commit_location()

    # A replay of batch 1 (a crash between the sink commit and the checkpoint commit): skipped, no new snapshot.
    assert not sink.commit(_batch(spark, topic, 30, 50), BatchCommit(pipeline, "c1", 1, offsets(50)), expected=first)
    assert sink.commit_location() == snapshot

    # A zombie of an older checkpoint, planned on batch 0: refused before it writes anything.
    with pytest.raises(StaleBatchError, match="another driver commits this pipeline"):
        sink.commit(_batch(spark, topic, 30, 60), BatchCommit(pipeline, "c0", 7, offsets(60)), expected=first)
    assert sink.commit_location() == snapshot

    # A batch of no rows (only aborted records, say) still moves the offsets in its own snapshot.
    assert sink.commit(_batch(spark, topic, 50, 50), BatchCommit(pipeline, "c1", 2, offsets(52)), expected=second)
    third = sink.committed()
    assert (third.batch_id, third.rows_total) == (2, 50)

    # A driver whose snapshot moved while Spark wrote its files (another driver committed in between): its commit
    # asserts the snapshot it read and is refused; no blind retry appends it on top of the other one.
    other = _writer(identifier, pipeline, location, s3)
    write = sink._write

    def write_then_lose_the_race(df, folder):
        written = write(df, folder)
        assert other.commit(_batch(spark, topic, 52, 60), BatchCommit(pipeline, "c2", 0, offsets(60)), expected=third)
        return written

    sink._write = write_then_lose_the_race
    with pytest.raises(StaleBatchError, match="got a new snapshot while batch 3 was being written"):
        sink.commit(_batch(spark, topic, 52, 60), BatchCommit(pipeline, "c1", 3, offsets(60)), expected=third)
    sink._write = write

    final = sink.committed()
    assert (final.checkpoint_id, final.batch_id, final.offsets, final.rows_total) == ("c2", 0, offsets(60), 58)
    rows = read_both(sink, s3)
    assert sorted(rows) == sorted(_expected(0, 50) + _expected(52, 60)), "rows lost, doubled or of a refused batch"
    table = sink.catalog().load_table(identifier)
    fences = [s.summary.additional_properties for s in table.snapshots()]
    assert [(f[PIPELINE], f[BATCH_ID]) for f in fences] == [(pipeline, b) for b in ("0", "1", "2", "0")]
    if s3 is not None:  # the data files and the metadata are objects in the bucket
        assert table.metadata_location.startswith(location + "/metadata/")
        assert all(task.file.file_path.startswith(location + "/data/") for task in table.scan().plan_files())


def test_a_table_at_another_location_is_refused(iceberg_table, tmp_path):
    identifier, location, s3 = iceberg_table
    settings = catalog_settings("postgres_default")
    IcebergSink(identifier, "p", settings, location, s3).prepare()
    elsewhere = IcebergSink(identifier, "p", settings, str(tmp_path / "elsewhere"), s3)
    with pytest.raises(ValueError, match="lives at"):
        elsewhere.prepare()
