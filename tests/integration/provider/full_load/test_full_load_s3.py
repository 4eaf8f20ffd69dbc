"""Full load with its sink AND its staging area on the stack's MinIO (the default staging, next to the sink).

The executors write the staged chunk objects themselves; the manifest names them. Read back with delta-rs (a
reader sharing no code with the provider's): the table equals the source row by row, every key once, also after
a load stopped part-way resumed from the staged chunks its manifest names (an unlisted object a dead attempt
left is never read). A staged object missing or damaged after its chunk was recorded is refused at the publish.
"""

from __future__ import annotations

import uuid
from collections import Counter
from decimal import Decimal

import pytest

from exactly_once_provider.full_load import job
from exactly_once_provider.full_load.job import FullLoadRequest, run_full_load
from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
from exactly_once_provider.sinks import delta_commit
from exactly_once_provider.storage import open_storage
from exactly_once_provider.storage import s3 as s3_module
from tests.mysql_support import connect, normalise, unique_name

COLUMNS = ["id", "v", "s", "d"]
ROWS = 1_200


@pytest.fixture
def minio(stack, monkeypatch):
    """The driver's registered S3 settings (as a Spark driver registers them from its secrets file) and a fresh
    prefix in the test bucket, emptied afterwards."""
    monkeypatch.setattr(s3_module, "_registered", stack.minio_settings())
    prefix = f"s3://{stack.MINIO_BUCKETS[0]}/it-full-load/{uuid.uuid4().hex[:12]}"
    yield prefix
    open_storage(prefix, stack.minio_settings()).delete_prefix("")


@pytest.fixture
def table(stack, airflow_connections):
    name = unique_name("fls3")
    conn = connect(stack)
    cur = conn.cursor()
    cur.execute(
        f"CREATE TABLE `{name}` (id INT NOT NULL PRIMARY KEY, v BIGINT, s VARCHAR(40) CHARACTER SET utf8mb4, "
        "d DECIMAL(12,2))"
    )
    cur.executemany(
        f"INSERT INTO `{name}` VALUES (%s, %s, %s, %s)",
        [(i, i * 7919 % 1000003, f"s{i}ü😀" if i % 7 else None, Decimal(i) / 4) for i in range(1, ROWS + 1)],
    )
    yield name
    cur.execute(f"DROP TABLE IF EXISTS `{name}`")
    conn.close()


def _source(stack, table: str) -> list[tuple]:
    conn = connect(stack)
    try:
        cur = conn.cursor()
        cur.execute(f"SELECT {', '.join(COLUMNS)} FROM `{table}` ORDER BY id")
        return [tuple(normalise(v) for v in row) for row in cur.fetchall()]
    finally:
        conn.close()


def _delta_rs(stack, location: str) -> list[tuple]:
    """The table's rows through delta-rs with its own S3 client, sorted by id (duplicates kept)."""
    from deltalake import DeltaTable

    read = (
        DeltaTable(location, storage_options=stack.minio_settings().delta_rs_options())
        .to_pyarrow_table(columns=COLUMNS)
        .to_pylist()
    )
    return sorted((tuple(normalise(r[c]) for c in COLUMNS) for r in read), key=lambda row: row[0])


def test_load_stopped_part_way_resumes_from_the_staged_objects_and_equals_the_source_once(stack, spark, minio, table):
    sink = f"{minio}/orders"
    request = FullLoadRequest(schema=stack.DB_NAME, table=table, sink_path=sink, chunk_rows=200, chunks_per_job=2)

    def stop_after_the_first_wave(progress):
        raise RuntimeError(f"stopped after {progress.chunks_done} chunks")

    with pytest.raises(RuntimeError, match="stopped after 2 chunks"):
        run_full_load(spark, MySqlSourceHook(), request, progress=stop_after_the_first_wave)
    staging = request.staging()
    assert str(staging.root) == f"{sink}._eo_full_load"  # the default: next to the sink, on the same store
    first = staging.load()
    assert len(first["done"]) == 2 and len(first["chunks"]) == 6
    store = open_storage(str(staging.root), stack.minio_settings())
    staged = {f"data/{e['data']}" for e in first["done"].values()}
    assert set(store.list("data/")) == staged  # the objects are on MinIO, whole (their sizes were read there)
    assert not open_storage(sink, stack.minio_settings()).list(""), "nothing may be visible in the sink yet"
    # An object a dead task attempt left: a copy of a staged chunk under a name no manifest lists. Were it read,
    # its rows would be in the table twice.
    orphan = f"data/{first['load_id']}-c000005-{uuid.uuid4().hex[:12]}.parquet"
    store.put(orphan, store.read(sorted(staged)[0]))

    result = run_full_load(spark, MySqlSourceHook(), request)
    assert (result.chunks_resumed, result.chunks_read) == (2, 4)  # the staged chunks were not read again
    done = staging.load()["done"]
    assert {k: done[k] for k in first["done"]} == first["done"]  # the same objects, sizes and positions
    assert not store.exists(orphan)
    rows = _delta_rs(stack, sink)
    assert not [k for k, n in Counter(r[0] for r in rows).items() if n > 1], "a key is in the table twice"
    assert rows == _source(stack, table)
    assert result.handoff.rows == ROWS and [c.rows for c in result.handoff.chunks] == [200] * 6
    # Spark reads the same table through s3a
    assert spark.read.format("delta").load(sink.replace("s3://", "s3a://", 1)).count() == ROWS


def test_a_missing_or_damaged_staged_object_is_refused_at_the_publish(stack, spark, minio, table, monkeypatch):
    sink = f"{minio}/orders"
    request = FullLoadRequest(schema=stack.DB_NAME, table=table, sink_path=sink, chunk_rows=400, chunks_per_job=4)

    def stop_before_publish(name):
        if name == "full_load_before_publish":
            raise RuntimeError("stopped before the publish")

    monkeypatch.setattr(job, "fault_point", stop_before_publish)
    with pytest.raises(RuntimeError, match="stopped before the publish"):
        run_full_load(spark, MySqlSourceHook(), request)
    monkeypatch.undo()
    monkeypatch.setattr(s3_module, "_registered", stack.minio_settings())  # undone with the fault point
    staging = request.staging()
    done = staging.load()["done"]
    assert len(done) == 3
    store = open_storage(str(staging.root), stack.minio_settings())
    first, second = (f"data/{done[k]['data']}" for k in ("0", "1"))
    original = store.read(second)
    store.put(second, original[:-100])  # truncated after its chunk was recorded
    with pytest.raises(
        delta_commit.CommitMarkerError,
        match=rf"Staged file .* of chunk 1 has {len(original) - 100} bytes, not {len(original)}: the "
        rf"staging area {staging.root} is damaged",
    ):
        run_full_load(spark, MySqlSourceHook(), request)
    store.put(second, original)
    store.delete(first)  # lost after its chunk was recorded as done
    with pytest.raises(
        delta_commit.CommitMarkerError,
        match=rf"Staged file .* of chunk 0 is missing: the staging area {staging.root} is damaged",
    ):
        run_full_load(spark, MySqlSourceHook(), request)
    assert not open_storage(sink, stack.minio_settings()).list(""), "a refused publish must write nothing"
    # the way out the error names: a full reload stages everything again and publishes the source once
    run_full_load(spark, MySqlSourceHook(), FullLoadRequest(**{**request.__dict__, "full_reload": True}))
    assert _delta_rs(stack, sink) == _source(stack, table)


def test_a_chunk_failing_mid_upload_leaves_no_staged_object(stack, minio):
    """pyarrow completes an S3 upload when its stream closes on an error (docs/pitfalls.md): the staged file
    must not keep those partial bytes as an object."""
    import pyarrow as pa

    from exactly_once_provider.full_load.spark_source import StagedFile

    schema = pa.schema([pa.field("id", pa.int64())])

    def batches():
        yield pa.record_batch([pa.array(range(100_000), pa.int64())], schema=schema)
        raise RuntimeError("the source connection broke mid-chunk")

    target = StagedFile(f"{minio}/stage/data", "chunk.parquet", stack.minio_settings())
    with pytest.raises(RuntimeError, match="broke mid-chunk"):
        target.write(schema, batches())
    assert open_storage(f"{minio}/stage", stack.minio_settings()).list("data/") == []
    assert target.write(schema, iter([pa.record_batch([pa.array([1, 2], pa.int64())], schema=schema)])) == 2
    assert open_storage(f"{minio}/stage", stack.minio_settings()).list("data/") == ["data/chunk.parquet"]
    assert target.size() == len(open_storage(f"{minio}/stage", stack.minio_settings()).read("data/chunk.parquet"))
