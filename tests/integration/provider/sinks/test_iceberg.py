"""The Iceberg sink against the stack's PostgreSQL (the SQL catalog) on local disk and on MinIO.

Batches committed through the sink (Spark writes the files, the driver commits one fenced snapshot each), a replay,
a batch of no rows, and two zombies (one planned on an older commit, one whose snapshot moved while it wrote) are
read back by two readers the sink does not use for its commits: DuckDB's ``iceberg_scan`` and pyiceberg's scan.
Both must hold exactly the committed rows, row by row: none lost, none doubled, nothing of a refused batch.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections import Counter

import pytest

from exactly_once_provider.sinks.base import BatchCommit, StaleBatchError, open_sink
from exactly_once_provider.sinks.iceberg import BATCH_ID, PIPELINE, IcebergSink, catalog_settings
from exactly_once_provider.storage import open_storage

COLUMNS = ("kafka_partition", "kafka_offset", "record_key", "record_value")


def duckdb_rows(metadata_location: str, s3=None, columns=COLUMNS) -> list[tuple]:
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
        return con.execute(f"SELECT {', '.join(columns)} FROM iceberg_scan(?)", [metadata_location]).fetchall()
    finally:
        con.close()


def pyiceberg_rows(table, columns=COLUMNS) -> list[tuple]:
    """Rows of the table's current snapshot through pyiceberg's scan (its own planning over the manifests)."""
    arrow = table.scan(selected_fields=tuple(columns)).to_arrow()
    return list(zip(*(arrow.column(c).to_pylist() for c in columns)))


def read_both(sink: IcebergSink, s3=None, columns=COLUMNS) -> list[tuple]:
    """The rows both readers see; fail unless they see the same rows (as multisets)."""
    table = sink.catalog().load_table(sink.identifier)
    from_duckdb = duckdb_rows(table.metadata_location, s3, columns)
    from_pyiceberg = pyiceberg_rows(table, columns)
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
    _readers_outside_the_job_see(identifier, pipeline, final, "aws_default" if s3 else None)


def _readers_outside_the_job_see(identifier: str, pipeline: str, commit: BatchCommit, aws_conn_id) -> None:
    """The lag sensor's reader, the status page and the Asset events' trigger find ``commit`` through the catalog's
    connection."""
    from exactly_once_provider.kafka.lag import sink_offsets
    from exactly_once_provider.plugins.discovery import SinkSpec
    from exactly_once_provider.plugins.status import Connections, sink_commit
    from exactly_once_provider.triggers.consumer_lag import sink_connections
    from exactly_once_provider.triggers.sink_commits import SinkCommitTrigger

    connect, s3 = asyncio.run(sink_connections("iceberg", [identifier], "postgres_default", aws_conn_id))
    assert sink_offsets("iceberg", identifier, pipeline, connect, s3) == commit.offsets
    row = sink_commit(SinkSpec("iceberg", identifier, "postgres_default", aws_conn_id), pipeline, Connections())
    assert (row["checkpoint"], row["batch id"], row["next offsets"]) == (
        commit.checkpoint_id,
        commit.batch_id,
        commit.offsets,
    )
    trigger = SinkCommitTrigger("iceberg", identifier, pipeline, "postgres_default", aws_conn_id, poll_interval=0.01)

    async def first_event():
        events = trigger.run()
        try:
            return (await asyncio.wait_for(events.__anext__(), 60)).payload
        finally:
            await events.aclose()

    event = asyncio.run(first_event())
    assert (event["checkpoint"], event["batch_id"], event["rows_total"]) == (
        commit.checkpoint_id,
        commit.batch_id,
        commit.rows_total,
    )


def test_a_table_at_another_location_is_refused(iceberg_table, tmp_path):
    identifier, location, s3 = iceberg_table
    settings = catalog_settings("postgres_default")
    IcebergSink(identifier, "p", settings, location, s3).prepare()
    elsewhere = IcebergSink(identifier, "p", settings, str(tmp_path / "elsewhere"), s3)
    with pytest.raises(ValueError, match="lives at"):
        elsewhere.prepare()


def _window(spark, window: str, version: int, start: int, count: int, tag: str = "a"):
    """``count`` records of a window version, window-mode columns (offsets from ``start``)."""
    return spark.range(start, start + count, numPartitions=2).selectExpr(
        f"'{window}' AS window_id",
        f"CAST({version} AS BIGINT) AS window_version",
        "'settle' AS kafka_topic",
        "CAST(id % 2 AS INT) AS kafka_partition",
        "id AS kafka_offset",
        "concat('k', id) AS record_key",
        f'concat(\'{{"n":\', id, \',"v":{version},"tag":"{tag}"}}\') AS record_value',
    )


@pytest.mark.parametrize("iceberg_table", ["local"], indirect=True)
def test_a_window_version_replaces_its_window_whole_and_an_older_one_never_wins(spark, iceberg_table):
    identifier, location, s3 = iceberg_table
    pipeline = f"win-{uuid.uuid4().hex[:8]}"
    sink = open_sink(
        "iceberg",
        identifier,
        pipeline,
        mode="window",
        iceberg_catalog=catalog_settings("postgres_default"),
        iceberg_location=location,
        s3=s3,
    )
    sink.prepare()
    d1, d2 = "settle/orders/2026-11-01", "settle/orders/2026-11-02"  # longer than a truncated string bound

    first = _window(spark, d1, 1, 0, 6).unionByName(_window(spark, d2, 1, 6, 4))
    assert sink.commit_windows(first, {d1: 1, d2: 1}, {d1: 6, d2: 4}, BatchCommit(pipeline, "c1", 0, {"s": {0: 10}}))
    held = sink.committed()
    # d1 re-extracted: v2 replaces v1 whole
    again = _window(spark, d1, 2, 10, 6, tag="b")
    assert sink.commit_windows(again, {d1: 2}, {d1: 6}, BatchCommit(pipeline, "c1", 1, {"s": {0: 16}}), held)
    second = sink.committed()
    assert not sink.commit_windows(again, {d1: 2}, {d1: 6}, BatchCommit(pipeline, "c1", 1, {"s": {0: 16}}), held)
    # an older version of d2 never wins: nothing of it is committed
    with pytest.raises(ValueError, match="not newer than the table's v1"):
        stale = _window(spark, d2, 1, 16, 4)
        sink.commit_windows(stale, {d2: 1}, {d2: 4}, BatchCommit(pipeline, "c1", 2, {"s": {0: 20}}), second)
    # nothing to publish: the offsets move on alone
    empty = _window(spark, d2, 1, 0, 0)
    assert sink.commit_windows(empty, {}, {}, BatchCommit(pipeline, "c1", 2, {"s": {0: 20}}), second)

    state = sink.committed()
    assert (state.batch_id, state.offsets, state.rows_total) == (2, {"s": {0: 20}}, 10)
    assert state.extra["windows"] == {d1: {"version": 2, "rows": 6}, d2: {"version": 1, "rows": 4}}
    assert sink.published_windows() == {d1: 2, d2: 1}
    table = sink.catalog().load_table(identifier)
    from_duckdb = duckdb_rows(table.metadata_location, s3)  # (partition, offset, key, value)
    assert Counter(from_duckdb) == Counter(pyiceberg_rows(table)), "DuckDB and pyiceberg read different rows"
    windows = table.scan(selected_fields=("window_id", "window_version", "kafka_offset")).to_arrow().to_pylist()
    assert sorted((r["window_id"], r["window_version"], r["kafka_offset"]) for r in windows) == sorted(
        [(d1, 2, n) for n in range(10, 16)] + [(d2, 1, n) for n in range(6, 10)]
    ), "a window is missing, doubled or at an older version"
    # v1 of d1 was deleted as whole files (its window's own), not rewritten: one file per published window
    assert len(list(table.scan().plan_files())) == 2


CDC_READ = ("pk", "source_version", "deleted", "record_value")


def _changes(spark, topic: str, changes: list[tuple[str, int, bool]], first_offset: int):
    """CDC mode's columns for ``(key, version, deleted)`` changes, newest per key as the job's cdc step gives them."""
    rows = [
        (pk, version, deleted, f'{{"pk":"{pk}","v":{version}}}', topic, 0, first_offset + n)
        for n, (pk, version, deleted) in enumerate(changes)
    ]
    schema = (
        "pk string, source_version bigint, deleted boolean, record_value string, kafka_topic string, "
        "kafka_partition int, kafka_offset bigint"
    )
    return spark.createDataFrame(rows, schema).repartition(2)


def test_cdc_changes_out_of_order_keep_the_newest_version_per_key_in_one_snapshot_each(spark, iceberg_table):
    """Inserts, updates and deletes of keys across batches, older versions arriving after newer ones: each batch is
    ONE overwrite snapshot (the rewritten files out, the new ones in, the fence on it); the table holds the newest
    version of each key (deletes as tombstones), read row by row by DuckDB and pyiceberg. A replay, a zombie and a
    driver that loses the race to its own batch commit nothing; one that loses it to another writer merges again."""
    identifier, location, s3 = iceberg_table
    pipeline, topic = f"cdc-{uuid.uuid4().hex[:8]}", "changes"
    sink = open_sink(
        "iceberg",
        identifier,
        pipeline,
        mode="cdc",
        iceberg_catalog=catalog_settings("postgres_default"),
        iceberg_location=location,
        s3=s3,
    )
    sink.prepare()
    batches = [
        [("k1", 5, False), ("k2", 3, False), ("k3", 4, False), ("k4", 2, True)],  # a delete of a key never seen
        [("k1", 2, False), ("k2", 6, False), ("k3", 7, True), ("k5", 1, False), ("k4", 1, False)],  # older k1, k4
        [("k3", 6, False), ("k6", 8, False), ("k1", 9, False), ("k5", 3, True)],  # k3 older than its tombstone
    ]
    expected: dict[str, tuple[int, bool]] = {}
    previous, offset, held = None, 0, []
    for batch_id, changes in enumerate(batches):
        commit = BatchCommit(pipeline, "c1", batch_id, {topic: {0: offset + len(changes)}})
        assert sink.commit(_changes(spark, topic, changes, offset), commit, expected=previous)
        previous, offset = sink.committed(), offset + len(changes)
        held.append(previous)
        for pk, version, deleted in changes:
            if pk not in expected or expected[pk][0] < version:
                expected[pk] = (version, deleted)

    def assert_table() -> None:
        rows = read_both(sink, s3, CDC_READ)
        assert len({r[0] for r in rows}) == len(rows), "a key is in the table twice"
        assert sorted(rows) == sorted((pk, v, d, f'{{"pk":"{pk}","v":{v}}}') for pk, (v, d) in expected.items()), (
            "a change lost, doubled, or an older version won"
        )

    assert_table()
    assert expected["k1"] == (9, False) and expected["k3"] == (7, True) and expected["k4"] == (2, True)
    table = sink.catalog().load_table(identifier)
    fenced = [s for s in table.snapshots() if PIPELINE in s.summary.additional_properties]
    # one snapshot per batch: the first only adds files (Iceberg calls it an append), the others rewrite files
    assert [s.summary.operation.value for s in fenced] == ["append", "overwrite", "overwrite"], "not one per batch"
    assert previous.rows_total == len(expected) == int(table.current_snapshot().summary["total-records"])
    snapshot = sink.commit_location()

    # A replay of batch 2 (crash after the sink commit, before the checkpoint): skipped, no new snapshot.
    replay = BatchCommit(pipeline, "c1", 2, previous.offsets)
    assert not sink.commit(_changes(spark, topic, batches[2], 9), replay, expected=previous)
    # A zombie of an older checkpoint planned on an older commit: refused before it writes anything.
    with pytest.raises(StaleBatchError, match="another driver commits this pipeline"):
        zombie = BatchCommit(pipeline, "c0", 5, {topic: {0: 14}})
        sink.commit(_changes(spark, topic, [("k1", 1, True)], 13), zombie, expected=held[0])
    assert sink.commit_location() == snapshot

    # Two drivers of one checkpoint replay batch 3 at once: the one whose snapshot moved while it wrote is planned
    # again on the other's snapshot, finds its batch there and commits nothing.
    batch3 = [("k2", 10, True), ("k7", 11, False)]
    commit3 = BatchCommit(pipeline, "c1", 3, {topic: {0: 15}})
    other = open_sink(
        "iceberg",
        identifier,
        pipeline,
        mode="cdc",
        iceberg_catalog=catalog_settings("postgres_default"),
        iceberg_location=location,
        s3=s3,
    )
    write = sink._write

    def write_then_lose_the_race(df, folder, **kwargs):
        written = write(df, folder, **kwargs)
        assert other.commit(_changes(spark, topic, batch3, 13), commit3, expected=previous)
        return written

    sink._write = write_then_lose_the_race
    assert not sink.commit(_changes(spark, topic, batch3, 13), commit3, expected=previous)
    sink._write = write
    expected.update(k2=(10, True), k7=(11, False))
    third = sink.committed()
    assert (third.batch_id, third.offsets) == (3, {topic: {0: 15}})
    assert_table()

    # Another writer's snapshot (no fence: a user's empty append) lands while batch 4 is written: merged again on it.
    def write_then_other_writer(df, folder, **kwargs):
        written = write(df, folder, **kwargs)
        sink._write = write  # once: the second plan commits
        sink.catalog().load_table(identifier).add_files([], check_duplicate_files=False)
        return written

    sink._write = write_then_other_writer
    commit4 = BatchCommit(pipeline, "c1", 4, {topic: {0: 16}})
    assert sink.commit(_changes(spark, topic, [("k6", 12, True)], 15), commit4, expected=third)
    expected["k6"] = (12, True)
    assert sink.committed().batch_id == 4
    assert_table()
    # A batch of no changes (only aborted records, say) still moves the offsets, in its own snapshot.
    fourth = sink.committed()
    assert sink.commit(_changes(spark, topic, [], 16), BatchCommit(pipeline, "c1", 5, {topic: {0: 18}}), fourth)
    assert (sink.committed().batch_id, sink.committed().offsets) == (5, {topic: {0: 18}})
    assert_table()
    # the small files are rewritten with each batch: the table does not keep a file per micro-batch
    live = [task.file.file_path for task in sink.catalog().load_table(identifier).scan().plan_files()]
    assert len(live) <= 2
    # the files of a commit the catalog refused are deleted at once: one folder per committed batch 3 and 4
    folders = {key.split("/")[1] for key in sink.storage().list("data/")}
    assert sorted(f.rsplit("-", 1)[0] for f in folders if f.startswith(("c1-3-", "c1-4-"))) == [
        "c1-3",
        "c1-4",
    ], folders


@pytest.mark.parametrize("iceberg_table", ["local"], indirect=True)
def test_a_keyed_batch_rewrites_only_the_files_holding_its_keys(spark, iceberg_table, monkeypatch):
    """The rewritten files hold sorted key ranges (here two rows each, no small-file compaction): a batch of one
    existing key rewrites that key's file only, and its snapshot says so; the rows stay exact. The keys are longer
    than the 16 characters Iceberg keeps of a string bound, so the bounds plan every file and the key scan
    finds the one."""

    def k(n: int) -> str:
        return f"order-2026-11-29-customer-{n:04d}"

    from exactly_once_provider.sinks import iceberg_merge

    monkeypatch.setattr(iceberg_merge, "FILE_ROWS", 2)
    monkeypatch.setattr(iceberg_merge, "SMALL_FILE_BYTES", 0)
    identifier, location, s3 = iceberg_table
    pipeline, topic = f"prune-{uuid.uuid4().hex[:8]}", "changes"
    sink = IcebergSink(identifier, pipeline, catalog_settings("postgres_default"), location, s3, mode="cdc")
    sink.prepare()
    first = [(k(n), 1, False) for n in (5, 1, 4, 0, 3, 2)]
    assert sink.commit(_changes(spark, topic, first, 0), BatchCommit(pipeline, "c1", 0, {topic: {0: 6}}), None)
    table = sink.catalog().load_table(identifier)
    ranges = sorted(
        sorted(r["pk"] for r in table.scan(row_filter=f"pk in ('{k(a)}', '{k(b)}')").to_arrow().to_pylist())
        for a, b in ((0, 1), (2, 3), (4, 5))
    )
    files = {task.file.file_path: task.file.record_count for task in table.scan().plan_files()}
    assert sorted(files.values()) == [2, 2, 2], "files of two rows each"
    assert ranges == [[k(0), k(1)], [k(2), k(3)], [k(4), k(5)]]
    held = sink.committed()
    assert sink.commit(
        _changes(spark, topic, [(k(3), 2, True)], 6), BatchCommit(pipeline, "c1", 1, {topic: {0: 7}}), held
    )
    summary = sink.catalog().load_table(identifier).current_snapshot().summary
    assert (summary["deleted-data-files"], summary["added-data-files"]) == ("1", "1"), "only k3's file rewritten"
    rows = read_both(sink, s3, CDC_READ)
    assert sorted((pk, v, d) for pk, v, d, _ in rows) == [(k(n), 2 if n == 3 else 1, n == 3) for n in range(6)]
