"""The current table's own MERGE commit on a real Delta table: newer versions win, only the files holding a
batch's keys are rewritten, Spark and delta-rs read the result, replays and lost races commit nothing twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exactly_once_provider.sinks import delta_commit, delta_log, delta_merge, delta_rs
from tests.integration.provider.sinks.test_delta_commit import small_delta_jobs  # noqa: F401 (a fixture)

NAME = "we`ird.col-umn"  # a hostile column name (backtick, dot) Delta allows without column mapping
COLUMNS = ["id", NAME, "_eo_version", "_eo_deleted"]


def make_table(spark, path: str, rows: list[tuple], files: int) -> None:
    df = spark.createDataFrame(
        rows, f"id BIGINT, `{NAME.replace('`', '``')}` STRING, _eo_version BIGINT, _eo_deleted BOOLEAN"
    )
    df.repartitionByRange(files, "id").write.format("delta").save(path)


def changes(spark, rows: list[tuple]):
    return spark.createDataFrame(
        rows, f"id BIGINT, `{NAME.replace('`', '``')}` STRING, _eo_version BIGINT, _eo_deleted BOOLEAN"
    )


def spark_rows(spark, path: str) -> list[tuple]:
    return sorted(
        tuple(r)
        for r in spark.read.format("delta").load(path).select(*[f"`{c.replace('`', '``')}`" for c in COLUMNS]).collect()
    )


def delta_rs_rows(path: str) -> list[tuple]:
    from deltalake import DeltaTable

    table = DeltaTable(path).to_pyarrow_table()
    return sorted(zip(*[table.column(c).to_pylist() for c in COLUMNS]))


def last_commit(path: str) -> list[dict]:
    version = delta_commit.newest_version(path)
    return delta_log.read_log_file(path, f"{version:020d}.json")


def test_newer_versions_win_new_keys_are_inserted_and_only_the_touched_file_is_rewritten(spark, tmp_path, monkeypatch):
    monkeypatch.setattr(delta_merge, "SMALL_FILE_BYTES", 0)  # no small file rewritten along
    path = str(tmp_path / "t")
    make_table(spark, path, [(i, f"v{i}", 10, False) for i in range(1, 31)], files=3)
    before = delta_log.active_files(delta_log.table_state(path))
    assert len(before) == 3

    batch = changes(
        spark,
        [
            (5, "new5", 20, False),  # newer: replaces
            (7, "old7", 5, False),  # older: ignored
            (8, None, 10, True),  # same version: ignored
            (100, "ins", 30, False),
        ],
    )  # a new key: inserted
    version = delta_merge.merge_newer(batch, path, ("id",), {"m": 1}, "app", 0)

    expected = sorted(
        [(i, f"v{i}", 10, False) for i in range(1, 31) if i != 5] + [(5, "new5", 20, False), (100, "ins", 30, False)]
    )
    assert spark_rows(spark, path) == expected
    assert delta_rs_rows(path) == expected
    actions = last_commit(path)
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    removed = [a["remove"]["path"] for a in actions if "remove" in a]
    assert (json.loads(info["userMetadata"]), info["operationMetrics"]["numSourceRows"], info["isBlindAppend"]) == (
        {"m": 1},
        "4",
        False,
    )
    assert [a["txn"] for a in actions if "txn" in a][0]["version"] == 0
    # ids 5, 7 and 8 live in the first file of three: only it is rewritten, the other two stay as they were
    assert len(removed) == 1 and removed[0] in before
    after = delta_log.active_files(delta_log.table_state(path))
    assert set(before) - set(after) == set(removed) and len(after) == 3
    assert delta_commit.find_commit(path, "app", 0) == version

    # a replay of the batch is recognised by its txn: nothing is written
    assert delta_merge.merge_newer(batch, path, ("id",), {"m": 1}, "app", 0) == version
    assert delta_commit.newest_version(path) == version


def test_a_stream_of_inserts_keeps_one_small_file_instead_of_one_per_batch(spark, tmp_path, monkeypatch):
    path = str(tmp_path / "t")
    make_table(spark, path, [(i, f"v{i}", 10, False) for i in range(1, 31)], files=3)
    for batch in range(4):  # inserts only: no file holds these keys
        delta_merge.merge_newer(
            changes(spark, [(1000 + 10 * batch + i, "ins", 20, False) for i in range(10)]),
            path,
            ("id",),
            {},
            "app",
            batch,
        )
    assert len(delta_log.active_files(delta_log.table_state(path))) == 1
    assert spark_rows(spark, path) == sorted(
        [(i, f"v{i}", 10, False) for i in range(1, 31)] + [(1000 + i, "ins", 20, False) for i in range(40)]
    )

    monkeypatch.setattr(delta_merge, "SMALL_FILE_BYTES", 0)  # without: a file per batch
    for batch in range(4, 7):
        delta_merge.merge_newer(
            changes(spark, [(2000 + 10 * batch + i, "ins", 20, False) for i in range(10)]),
            path,
            ("id",),
            {},
            "app",
            batch,
        )
    assert len(delta_log.active_files(delta_log.table_state(path))) >= 4


def _key_scans(monkeypatch) -> list[list[str]]:
    """Record the files each key scan (the semi-join job) reads."""
    scans: list[list[str]] = []
    real = delta_merge._files_holding

    def recording(changes, storage, files, key, table_schema):
        scans.append(sorted(files))
        return real(changes, storage, files, key, table_schema)

    monkeypatch.setattr(delta_merge, "_files_holding", recording)
    return scans


def test_the_key_scan_reads_only_files_whose_key_bounds_overlap_the_batch(spark, tmp_path, monkeypatch):
    monkeypatch.setattr(delta_merge, "SMALL_FILE_BYTES", 0)  # no small file rewritten along
    scans = _key_scans(monkeypatch)
    path = str(tmp_path / "t")
    make_table(spark, path, [(i, f"v{i}", 10, False) for i in range(1, 31)], files=3)  # ids 1-10, 11-20, 21-30
    files = delta_log.active_files(delta_log.table_state(path))
    by_low = sorted(files, key=lambda p: json.loads(files[p]["stats"])["minValues"]["id"])

    delta_merge.merge_newer(
        changes(spark, [(15, "new", 20, False), (100, "ins", 20, False)]), path, ("id",), {}, "a", 0
    )
    assert scans == [sorted(by_low[1:])]  # keys 15..100: not the file of ids 1-10
    assert [a["remove"]["path"] for a in last_commit(path) if "remove" in a] == [by_low[1]]

    delta_merge.merge_newer(changes(spark, [(200 + i, "ins", 20, False) for i in range(5)]), path, ("id",), {}, "a", 1)
    assert len(scans) == 1  # new keys above every file: no scan, nothing rewritten
    assert not [a for a in last_commit(path) if "remove" in a]
    assert spark_rows(spark, path) == sorted(
        [(i, f"v{i}", 10, False) for i in range(1, 31) if i != 15]
        + [(15, "new", 20, False), (100, "ins", 20, False)]
        + [(200 + i, "ins", 20, False) for i in range(5)]
    )


def test_a_table_of_small_files_is_rewritten_whole_without_a_key_scan(spark, tmp_path, monkeypatch):
    scans = _key_scans(monkeypatch)
    path = str(tmp_path / "t")
    make_table(spark, path, [(i, f"v{i}", 10, False) for i in range(1, 31)], files=3)
    before = delta_log.active_files(delta_log.table_state(path))
    summaries = []
    monkeypatch.setattr(delta_merge, "_summary", lambda *a: summaries.append(a))
    delta_merge.merge_newer(changes(spark, [(5, "new", 20, False), (40, "ins", 20, False)]), path, ("id",), {}, "a", 0)
    assert scans == [] and summaries == []  # one Spark job: the changes are counted as they are written
    actions = last_commit(path)
    assert sorted(a["remove"]["path"] for a in actions if "remove" in a) == sorted(before)
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    assert info["operationMetrics"]["numSourceRows"] == "2"
    assert delta_rs_rows(path) == sorted(
        [(i, f"v{i}", 10, False) for i in range(1, 31) if i != 5] + [(5, "new", 20, False), (40, "ins", 20, False)]
    )


def test_replace_equal_takes_a_change_of_the_same_version_and_tombstones_stay(spark, tmp_path):
    path = str(tmp_path / "t")
    make_table(spark, path, [(i, f"v{i}", 10, False) for i in range(1, 6)], files=1)
    delta_merge.merge_newer(changes(spark, [(2, None, 11, True)]), path, ("id",), {}, "app", 0)
    delta_merge.merge_newer(
        changes(spark, [(3, "filled", 10, False), (2, "back", 10, False)]),
        path,
        ("id",),
        {},
        "app",
        1,
        replace_equal=True,
    )
    assert spark_rows(spark, path) == [
        (1, "v1", 10, False),
        (2, None, 11, True),
        (3, "filled", 10, False),
        (4, "v4", 10, False),
        (5, "v5", 10, False),
    ]


def test_an_empty_batch_commits_its_marker_only(spark, tmp_path):
    path = str(tmp_path / "t")
    make_table(spark, path, [(1, "a", 10, False)], files=1)
    delta_merge.merge_newer(changes(spark, []), path, ("id",), {"m": 0}, "app", 0)
    actions = last_commit(path)
    assert [k for a in actions for k in a] == ["commitInfo", "txn"]
    assert spark_rows(spark, path) == [(1, "a", 10, False)]


def test_two_changes_of_one_key_are_refused_before_anything_is_written(spark, tmp_path, monkeypatch):
    # A table of larger files: the batch is summarised before the key scan, and the summary checks the keys.
    # (A table of small files is rewritten in one job without a summary: the current mode's changes are
    # grouped by key.)
    monkeypatch.setattr(delta_merge, "SMALL_FILE_BYTES", 0)
    path = str(tmp_path / "t")
    make_table(spark, path, [(1, "a", 10, False)], files=1)
    with pytest.raises(ValueError, match="2 changes of 1 keys"):
        delta_merge.merge_newer(changes(spark, [(1, "x", 20, False), (1, "y", 21, False)]), path, ("id",), {}, "app", 0)
    assert delta_commit.newest_version(path) == 0


def test_a_composite_text_key_merges_on_every_key_column(spark, tmp_path):
    path = str(tmp_path / "t")
    rows = [("a", 1, "x", 10), ("a", 2, "y", 10), ("b", 1, "z", 10)]
    spark.createDataFrame(rows, "k STRING, n INT, v STRING, _eo_version BIGINT").write.format("delta").save(path)
    batch = spark.createDataFrame(
        [("a", 2, "Y", 20), ("b", 2, "new", 20)], "k STRING, n INT, v STRING, _eo_version BIGINT"
    )
    delta_merge.merge_newer(batch, path, ("k", "n"), {}, "app", 0)
    assert sorted(tuple(r) for r in spark.read.format("delta").load(path).collect()) == [
        ("a", 1, "x", 10),
        ("a", 2, "Y", 20),
        ("b", 1, "z", 10),
        ("b", 2, "new", 20),
    ]


def test_a_writer_that_loses_the_commit_plans_again_on_the_newer_state(spark, tmp_path, monkeypatch):
    path = str(tmp_path / "t")
    make_table(spark, path, [(i, f"v{i}", 10, False) for i in range(1, 11)], files=1)
    real_commit = delta_rs.commit
    calls = []

    def another_writer_first(storage, read_version, *args):
        if not calls:  # before our first commit, another writer rewrites the same file
            calls.append(read_version + 1)
            monkeypatch.setattr(delta_rs, "commit", real_commit)
            delta_merge.merge_newer(changes(spark, [(1, "other", 50, False)]), path, ("id",), {}, "other", 0)
            monkeypatch.setattr(delta_rs, "commit", another_writer_first)
        return real_commit(storage, read_version, *args)

    monkeypatch.setattr(delta_rs, "commit", another_writer_first)
    version = delta_merge.merge_newer(changes(spark, [(2, "ours", 20, False)]), path, ("id",), {}, "app", 0)
    assert calls == [1] and version == 2  # lost version 1, planned again on it and committed version 2
    assert spark_rows(spark, path) == sorted(
        [(1, "other", 50, False), (2, "ours", 20, False)] + [(i, f"v{i}", 10, False) for i in range(3, 11)]
    )
    # the lost attempt's files were deleted: every data directory of the table is one a commit added
    folders = {p.name for p in Path(path).iterdir() if p.name.startswith(delta_commit.DATA_PREFIX)}
    added = {
        a["add"]["path"].split("/")[0]
        for v in range(version + 1)
        for a in delta_log.read_log_file(path, f"{v:020d}.json")
        if "add" in a
    }
    assert len(folders) == 2 and folders <= added


def test_a_zombie_that_commits_the_same_batch_first_leaves_it_in_once(spark, tmp_path, monkeypatch):
    path = str(tmp_path / "t")
    make_table(spark, path, [(i, f"v{i}", 10, False) for i in range(1, 6)], files=1)
    real_commit = delta_rs.commit
    batch = changes(spark, [(1, "new", 20, False), (9, "ins", 20, False)])

    def zombie_first(storage, read_version, *args):
        monkeypatch.setattr(delta_rs, "commit", real_commit)
        delta_merge.merge_newer(batch, path, ("id",), {}, "app", 0)  # the zombie: same app id, same batch
        return real_commit(storage, read_version, *args)

    monkeypatch.setattr(delta_rs, "commit", zombie_first)
    assert delta_merge.merge_newer(batch, path, ("id",), {}, "app", 0) == 1
    assert delta_commit.newest_version(path) == 1
    assert spark_rows(spark, path) == sorted(
        [(1, "new", 20, False), (9, "ins", 20, False)] + [(i, f"v{i}", 10, False) for i in range(2, 6)]
    )


WIDE_COLUMNS = ["id", "f", "d", "_eo_version", "_eo_deleted"]


def _widened_rows(spark, path: str) -> list[tuple]:
    return sorted(tuple(r) for r in spark.read.format("delta").load(path).select(*WIDE_COLUMNS).collect())


def test_a_widening_rewrites_the_table_in_the_wider_types_with_the_batch_in_one_commit(small_delta_jobs, tmp_path):
    """INT -> BIGINT (the key), FLOAT -> DOUBLE, DECIMAL(8,2) -> DECIMAL(12,2): every file rewritten with the batch,
    no table feature added (delta-rs reads it), a replay commits nothing, later own MERGEs find keys past INT."""
    spark = small_delta_jobs
    from decimal import Decimal

    path = str(tmp_path / "t")
    narrow = "id INT, f FLOAT, d DECIMAL(8,2), _eo_version BIGINT, _eo_deleted BOOLEAN"
    rows = [(i, i + 0.5, Decimal(f"{i}.25"), 10, False) for i in range(1, 7)]
    spark.createDataFrame(rows, narrow).repartition(2).write.format("delta").save(path)
    before = delta_log.table_state(path)
    wide = "id BIGINT, f DOUBLE, d DECIMAL(12,2), _eo_version BIGINT, _eo_deleted BOOLEAN"
    batch = spark.createDataFrame(
        [
            (2, 1e300, Decimal("1234567890.12"), 11, False),  # newer: values past every old range
            (3, 0.0, Decimal("0.00"), 10, False),  # the same version: the table's row stays
            (4, None, None, 12, True),  # a delete: a tombstone
            (5_000_000_000, 2.5, Decimal("9999999999.99"), 12, False),  # a new key past INT
        ],
        wide,
    )
    version = delta_merge.merge_widening(batch, path, ("id",), {"m": 1}, "app", 7)
    assert version == before.version + 1
    after = delta_log.table_state(path)
    assert after.protocol == before.protocol and after.configuration == before.configuration
    types = {f["name"]: f["type"] for f in json.loads(after.metadata["schemaString"])["fields"]}
    assert (types["id"], types["f"], types["d"]) == ("long", "double", "decimal(12,2)")
    assert set(delta_log.active_files(after)).isdisjoint(delta_log.active_files(before)), "every file rewritten"
    expected = sorted(
        [
            (1, 1.5, Decimal("1.25"), 10, False),
            (2, 1e300, Decimal("1234567890.12"), 11, False),
            (3, 3.5, Decimal("3.25"), 10, False),
            (4, None, None, 12, True),
            (5, 5.5, Decimal("5.25"), 10, False),
            (6, 6.5, Decimal("6.25"), 10, False),
            (5_000_000_000, 2.5, Decimal("9999999999.99"), 12, False),
        ]
    )
    assert _widened_rows(spark, path) == expected
    from deltalake import DeltaTable

    table = DeltaTable(path).to_pyarrow_table()
    assert sorted(zip(*[table.column(c).to_pylist() for c in WIDE_COLUMNS])) == expected
    assert delta_merge.merge_widening(batch, path, ("id",), {"m": 1}, "app", 7) == version  # a replay
    assert delta_commit.newest_version(path) == version
    later = spark.createDataFrame([(5_000_000_000, 3.5, Decimal("1.00"), 13, False)], wide)
    delta_merge.merge_newer(later, path, ("id",), {}, "app", 8)  # the own MERGE again, on the wider types
    assert (5_000_000_000, 3.5, Decimal("1.00"), 13, False) in _widened_rows(spark, path)


def test_a_table_with_type_widening_enabled_widens_in_delta_merge_which_delta_rs_cannot_read(
    small_delta_jobs, tmp_path
):
    """The owner's opt-in: Delta's MERGE widens in place (metadata only: ``typeWidening`` in the protocol,
    ``delta.typeChanges`` on the field); Spark reads it, delta-rs 1.6.6 refuses the reader feature (so the
    default is the rewrite, docs/schema-changes.md)."""
    spark = small_delta_jobs
    path = str(tmp_path / "t")
    spark.createDataFrame([(1, 10, False)], "id INT, _eo_version BIGINT, _eo_deleted BOOLEAN").write.format(
        "delta"
    ).option("delta.enableTypeWidening", "true").save(path)
    batch = spark.createDataFrame([(5_000_000_000, 11, False)], "id BIGINT, _eo_version BIGINT, _eo_deleted BOOLEAN")
    state = delta_log.table_state(path)
    widened = delta_merge.widened_columns(json.loads(state.metadata["schemaString"]), batch.schema)
    assert widened == {"id": ("integer", "long")} and delta_merge.widens_in_place(state, widened)
    delta_commit.merge_with_marker(
        batch, path, "t.id = s.id", {"m": 1}, "app", 0, update_when="s._eo_version > t._eo_version", evolve_schema=True
    )
    after = delta_log.table_state(path)
    assert "typeWidening" in after.protocol["readerFeatures"]
    (field,) = [f for f in json.loads(after.metadata["schemaString"])["fields"] if f["name"] == "id"]
    assert field["type"] == "long" and field["metadata"]["delta.typeChanges"] == [
        {"fromType": "integer", "toType": "long"}
    ]
    assert sorted(r.id for r in spark.read.format("delta").load(path).collect()) == [1, 5_000_000_000]
    from deltalake import DeltaTable

    with pytest.raises(Exception, match="typeWidening|TypeWidening"):
        DeltaTable(path).to_pyarrow_table()
