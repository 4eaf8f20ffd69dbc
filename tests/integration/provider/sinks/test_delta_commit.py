"""Own append commits on a real Delta table: Delta's readers and writers see them, before and after a checkpoint;
writers racing for the same commit or interleaving their commits lose nothing and duplicate nothing."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
import uuid
from pathlib import Path

import pytest

from exactly_once_provider.sinks import delta_commit, delta_log

ROWS_SCHEMA = json.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "writer", "type": "string", "nullable": True, "metadata": {}},
            {"name": "n", "type": "long", "nullable": True, "metadata": {}},
        ],
    }
)


def batch(spark, writer: str, start: int, count: int):
    return spark.range(start, start + count).selectExpr(f"'{writer}' AS writer", "id AS n").coalesce(1)


def delta_count(spark, path: str, **options) -> int:
    return spark.read.format("delta").options(**options).load(path).count()


# Delta rebuilds table states with 50 tasks and VACUUM lists files with 10 000 (a minute on 2 cores): 2 each.
SMALL_DELTA_JOBS = {
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
}


@pytest.fixture
def small_delta_jobs(spark):
    for key, value in SMALL_DELTA_JOBS.items():
        spark.conf.set(key, value)
    yield spark
    for key in SMALL_DELTA_JOBS:
        spark.conf.unset(key)


def test_delta_reads_writes_time_travels_and_vacuums_a_table_of_own_commits_across_a_checkpoint(
    small_delta_jobs, tmp_path
):
    spark = small_delta_jobs
    from delta.tables import DeltaTable

    path = str(tmp_path / "t")
    log_dir = Path(path) / "_delta_log"
    assert delta_commit.append_with_marker(batch(spark, "a", 0, 10), path, {"b": 0}, "app", 0) == 0
    assert delta_commit.append_with_marker(batch(spark, "a", 10, 5), path, {"b": 1}, "app", 1) == 1
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.checkpointInterval' = '4')")  # Delta: v2

    # Before any checkpoint: Delta lists the history with our markers, travels back in time.
    history = {r["version"]: r for r in DeltaTable.forPath(spark, path).history().collect()}
    assert sorted(history) == [0, 1, 2]
    assert (history[1]["operation"], json.loads(history[1]["userMetadata"])) == ("WRITE", {"b": 1})
    assert history[1]["operationParameters"]["mode"] == "Append" and history[1]["isBlindAppend"]
    assert delta_count(spark, path, versionAsOf=0) == 10
    assert not list(log_dir.glob("*.checkpoint*.parquet"))

    assert delta_commit.append_with_marker(batch(spark, "a", 15, 5), path, {"b": 2}, "app", 2) == 3
    assert not list(log_dir.glob("*.checkpoint*.parquet"))  # 3 commits since version 0: not due yet
    assert delta_commit.append_with_marker(batch(spark, "a", 20, 5), path, {"b": 3}, "app", 3) == 4
    assert (log_dir / f"{4:020d}.checkpoint.parquet").exists(), "Delta should have checkpointed version 4"
    assert json.loads((log_dir / "_last_checkpoint").read_text())["version"] == 4

    # After the checkpoint: a replay is skipped, the state read from the checkpoint agrees with Delta.
    assert delta_commit.append_with_marker(batch(spark, "a", 15, 5), path, {"b": 2}, "app", 2) == 3
    state = delta_log.table_state(path)
    assert (state.version, state.checkpoint, state.txns, state.configuration) == (
        4,
        4,
        {"app": 3},
        {"delta.checkpointInterval": "4"},
    )
    assert delta_count(spark, path, versionAsOf=3) == 20

    # Delta's own writers continue the table: a plain append, then a MERGE; then an own commit again.
    batch(spark, "delta", 0, 3).write.format("delta").mode("append").save(path)  # v5
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(batch(spark, "a", 0, 2).selectExpr("'merged' AS writer", "n").alias("s"), "t.n = s.n AND t.writer = 'a'")
        .whenMatchedUpdateAll()
        .execute()
    )  # v6: two rows of version 0 rewritten
    assert delta_commit.append_with_marker(batch(spark, "a", 25, 5), path, {"b": 4}, "app", 4) == 7
    rows = spark.read.format("delta").load(path).groupBy("writer").count().collect()
    assert {r["writer"]: r["count"] for r in rows} == {"a": 28, "merged": 2, "delta": 3}
    assert delta_commit.latest_marker(path, "b") == (7, {"b": 4})
    # the own adds carry the integer column bounds; a filter Delta skips files with still finds every row
    add = next(a["add"] for a in delta_log.read_actions(log_dir / f"{7:020d}.json") if "add" in a)
    assert json.loads(add["stats"]) == {
        "numRecords": 5,
        "minValues": {"n": 25},
        "maxValues": {"n": 29},
        "nullCount": {"n": 0},
    }
    assert spark.read.format("delta").load(path).where("writer = 'a' AND n BETWEEN 12 AND 26").count() == 15

    # VACUUM (dry run) lists only files no version references: an orphan a killed writer left, not our
    # live files (each own append's files are in their own eo-<uuid>/ directory).
    orphan = Path(path) / "part-orphan.snappy.parquet"
    orphan.write_bytes(b"x")
    old = time.time() - 8 * 24 * 3600
    os.utime(orphan, (old, old))
    vacuumed = [r[0] for r in spark.sql(f"VACUUM delta.`{path}` DRY RUN").collect()]
    assert [os.path.basename(p) for p in vacuumed] == [orphan.name]


def race(location: str, s3: dict | None, app_id: str, versions: list[int], writer: str, barrier, results) -> None:
    """One writer process: create the table at once with the others, then per version stage its own file, wait
    for the others, commit (its own storage client, as a separate driver has)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from exactly_once_provider.storage import open_storage
    from exactly_once_provider.storage.s3 import S3Settings

    storage = open_storage(location, S3Settings.from_json(s3) if s3 else None)
    barrier.wait(60)  # first all create the table at once: one creates it, the others find it created
    try:
        results.put(
            (writer, "create", 0, delta_commit.create_with_files(storage, ROWS_SCHEMA, [], {}, writer, 0), True)
        )
    except delta_commit.TableExistsError:
        results.put((writer, "create", 0, None, False))
    for version in versions:
        name = f"part-{writer}-{app_id}-{version}.parquet"
        buffer = io.BytesIO()
        pq.write_table(pa.table({"writer": [writer] * 3, "n": pa.array([version] * 3, pa.int64())}), buffer)
        storage.put(name, buffer.getvalue())
        files = [{"name": name, "bytes": len(buffer.getvalue()), "rows": 3}]
        barrier.wait(60)
        table_version, written = delta_commit.append_with_files(
            storage, ROWS_SCHEMA, files, {"w": writer}, app_id, version
        )
        if not written:
            storage.delete(name)
        results.put((writer, app_id, version, table_version, written))


def collect(results, writers: list, count: int, timeout: float) -> list:
    """Return ``count`` results of the writer processes; fail naming the writers that died or hung."""
    import queue

    outcomes, deadline = [], time.monotonic() + timeout
    while len(outcomes) < count:
        try:
            outcomes.append(results.get(timeout=1))
            continue
        except queue.Empty:
            pass
        dead = [(w.name, w.exitcode) for w in writers if w.exitcode not in (None, 0)]
        assert not dead, f"writers died (name, exit code): {dead}; {len(outcomes)} of {count} results came"
        assert time.monotonic() < deadline, f"{len(outcomes)} of {count} results in {timeout:.0f} s: {outcomes}"
    return outcomes


@pytest.fixture(params=[pytest.param("local", marks=pytest.mark.matrix), "s3"])
def table_location(request, tmp_path):
    """A new table's location, its S3 settings and its storage: on local disk, or on the stack's MinIO
    (put-if-absent = ``If-None-Match: *``)."""
    from exactly_once_provider.storage import open_storage

    if request.param == "local":
        path = str(tmp_path / "t")
        yield path, None, open_storage(path)
        return
    stack = request.getfixturevalue("stack")
    s3 = stack.minio_settings()
    location = f"s3a://{stack.MINIO_BUCKETS[0]}/it-delta-race/{uuid.uuid4().hex}"
    storage = open_storage(location, s3)
    yield location, s3, storage
    storage.delete_prefix("")


def test_writers_racing_for_one_txn_commit_it_once_and_other_app_ids_interleave_without_loss(
    small_delta_jobs, table_location
):
    spark = small_delta_jobs
    path, s3, storage = table_location
    # spawn, not fork: a child forked from this process (Spark's gateway threads, boto3 and Arrow pools) can
    # inherit a lock held by one of its threads and hang before its first commit
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    versions = list(range(1, 9))
    settings = s3.to_json() if s3 else None
    # zombies: three processes commit the SAME (app "zombie", version) at once; a fourth, another app id,
    # commits its own versions at the same instants
    writers = [
        ctx.Process(target=race, args=(path, settings, "zombie", versions, f"z{i}", barrier, results)) for i in range(3)
    ]
    writers.append(ctx.Process(target=race, args=(path, settings, "other", versions, "o", barrier, results)))
    for w in writers:
        w.start()
    try:
        outcomes = collect(results, writers, 4 * (1 + len(versions)), timeout=300)
        for w in writers:
            w.join(30)
            assert w.exitcode == 0
    finally:
        for w in writers:
            if w.is_alive():
                w.kill()
    creates = [o for o in outcomes if o[1] == "create"]
    assert [o[3] for o in creates if o[4]] == [0], f"the table must be created once: {creates}"
    creator = next(o[0] for o in creates if o[4])
    outcomes = [o for o in outcomes if o[1] != "create"]
    for version in versions:
        zombies = [o for o in outcomes if o[1] == "zombie" and o[2] == version]
        assert sum(o[4] for o in zombies) == 1, f"(zombie, {version}) committed by {zombies}"
        assert len({o[3] for o in zombies}) == 1, "every racer must report the one winning table version"
    assert all(o[4] for o in outcomes if o[1] == "other")
    assert sorted(o[3] for o in outcomes if o[4]) == list(range(1, 2 * len(versions) + 1))  # no gap, no clash

    txns = [
        a["txn"]
        for v in range(2 * len(versions) + 1)
        for a in delta_log.read_log_file(storage, f"{v:020d}.json")
        if "txn" in a
    ]
    assert sorted((t["appId"], t["version"]) for t in txns) == sorted(
        [(creator, 0)] + [("zombie", v) for v in versions] + [("other", v) for v in versions]
    )
    rows = spark.read.format("delta").load(storage.spark_uri()).groupBy("n").agg({"writer": "collect_list"}).collect()
    per_version = {r["n"]: sorted(r[1]) for r in rows}
    assert set(per_version) == set(versions)
    for names in per_version.values():  # 3 rows of the other app + 3 rows of ONE zombie, per version
        assert names.count("o") == 3 and len(names) == 6 and len({n for n in names if n != "o"}) == 1, names
    assert sorted(k for k in storage.list("part-")) == sorted(
        f"part-{w}-{a}-{v}.parquet" for w, a, v, _, written in outcomes if written
    )
