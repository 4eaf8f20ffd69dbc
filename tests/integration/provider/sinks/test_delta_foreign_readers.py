"""Foreign-reader conformance: a Delta table the provider writes reads the same through Spark Delta and delta-rs.

On local disk and on the stack's MinIO, the table gets the provider's own commits (the first one creates it, as
the full load does; appends with txn markers, as the streaming sink does; a replayed batch), a MERGE through
Delta's writer with a marker (the current/CDC modes), other writers between the runs (a plain Spark append and
a delta-rs append, neither knowing of the provider), a Delta checkpoint, ``OPTIMIZE`` and ``VACUUM RETAIN 0
HOURS``. After each step both readers see exactly the rows written (nothing lost, nothing doubled), the same
version and the same live files, and the provider's txn versions read back through delta-rs.
"""

from __future__ import annotations

import uuid

import pytest

from exactly_once_provider.sinks import delta_commit
from exactly_once_provider.storage import open_storage
from tests.integration.provider.sinks.test_delta_commit import SMALL_DELTA_JOBS


@pytest.fixture(params=["local", "s3"])
def table(request, tmp_path, spark):
    """``(storage of a new table, delta-rs storage options)``: local disk, or the stack's MinIO."""
    for key, value in {**SMALL_DELTA_JOBS, "spark.databricks.delta.retentionDurationCheck.enabled": "false"}.items():
        spark.conf.set(key, value)
    if request.param == "local":
        yield open_storage(str(tmp_path / "t")), None
    else:
        stack = request.getfixturevalue("stack")
        s3 = stack.minio_settings()
        storage = open_storage(f"s3a://{stack.MINIO_BUCKETS[0]}/it-delta-readers/{uuid.uuid4().hex}", s3)
        yield storage, s3.delta_rs_options()
        storage.delete_prefix("")
    for key in (*SMALL_DELTA_JOBS, "spark.databricks.delta.retentionDurationCheck.enabled"):
        spark.conf.unset(key)


def _rows(spark, writer: str, start: int, count: int):
    return spark.range(start, start + count).selectExpr(f"'{writer}' AS writer", "id AS n").coalesce(1)


def _same_through_both_readers(spark, storage, options, expected: dict[int, str]) -> None:
    """Both readers hold exactly ``expected`` (n -> writer), at the same version with the same live files."""
    from deltalake import DeltaTable

    from_spark = sorted((r["n"], r["writer"]) for r in spark.read.format("delta").load(storage.spark_uri()).collect())
    table = DeltaTable(storage.uri(), storage_options=options)
    arrow = table.to_pyarrow_table()
    from_delta_rs = sorted(zip(arrow.column("n").to_pylist(), arrow.column("writer").to_pylist()))
    assert from_spark == sorted(expected.items()), "Spark Delta: rows lost or doubled"
    assert from_delta_rs == from_spark, "delta-rs reads other rows than Spark Delta"
    history = spark.sql(f"DESCRIBE HISTORY delta.`{storage.spark_uri()}`").collect()
    assert table.version() == max(r["version"] for r in history)
    spark_files = {f.rsplit("/", 1)[-1] for f in spark.read.format("delta").load(storage.spark_uri()).inputFiles()}
    assert {f.rsplit("/", 1)[-1] for f in table.file_uris()} == spark_files


def test_spark_delta_and_delta_rs_read_the_provider_table_identically(spark, table):
    from deltalake import write_deltalake

    storage, options = table
    uri = storage.spark_uri()
    expected: dict[int, str] = {}

    def own(batch: int, start: int, count: int) -> int:
        version = delta_commit.append_with_marker(
            _rows(spark, "own", start, count), storage, {"b": batch}, "eo-stream", batch
        )
        expected.update(dict.fromkeys(range(start, start + count), "own"))
        return version

    assert own(0, 0, 10) == 0  # the first own commit creates the table (the full load's create_with_files)
    spark.sql(f"ALTER TABLE delta.`{uri}` SET TBLPROPERTIES ('delta.checkpointInterval' = '3')")
    for batch in range(1, 4):
        own(batch, batch * 10, 10)
    assert delta_commit.append_with_marker(_rows(spark, "own", 30, 10), storage, {"b": 3}, "eo-stream", 3) == 4
    assert any(".checkpoint." in key for key in storage.list("_delta_log/")), "Delta should have checkpointed"
    _same_through_both_readers(spark, storage, options, expected)

    # Other writers between the runs: a plain Spark append and a delta-rs append, no markers.
    _rows(spark, "spark", 100, 7).write.format("delta").mode("append").save(uri)
    expected.update(dict.fromkeys(range(100, 107), "spark"))
    import pyarrow as pa

    write_deltalake(
        storage.uri(),
        pa.table({"writer": ["delta-rs"] * 5, "n": pa.array(range(200, 205), pa.int64())}),
        mode="append",
        storage_options=options,
    )
    expected.update(dict.fromkeys(range(200, 205), "delta-rs"))
    own(4, 40, 10)  # the own commit on top of the foreign ones
    _same_through_both_readers(spark, storage, options, expected)

    # OPTIMIZE rewrites every file into one; VACUUM deletes the rewritten ones; the own commits go on.
    spark.sql(f"OPTIMIZE delta.`{uri}`").collect()
    _same_through_both_readers(spark, storage, options, expected)
    spark.sql(f"VACUUM delta.`{uri}` RETAIN 0 HOURS").collect()
    _same_through_both_readers(spark, storage, options, expected)
    data = [k for k in storage.list() if k.endswith(".parquet") and not k.startswith("_delta_log/")]
    assert len(data) == 1, f"VACUUM should have left only OPTIMIZE's file, found {data}"
    own(5, 50, 10)
    assert delta_commit.append_with_marker(
        _rows(spark, "own", 50, 10), storage, {"b": 5}, "eo-stream", 5
    ) == delta_commit.newest_version(storage)  # a replay after VACUUM: nothing written
    _same_through_both_readers(spark, storage, options, expected)

    # A MERGE through Delta's writer with its marker and txn, as the current and CDC modes commit.
    source = spark.range(0, 5).selectExpr("'merged' AS writer", "id AS n")
    delta_commit.merge_with_marker(source, storage, "t.n = s.n", {"b": 6}, "eo-stream", 6)
    expected.update(dict.fromkeys(range(5), "merged"))
    _same_through_both_readers(spark, storage, options, expected)

    from deltalake import DeltaTable

    final = DeltaTable(storage.uri(), storage_options=options)
    assert final.transaction_version("eo-stream") == 6  # the provider's txn markers, as delta-rs reads them
    assert delta_commit.find_commit(storage, "eo-stream", 6) == final.version()
