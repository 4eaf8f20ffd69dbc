"""Full load on the real MariaDB + Spark + Delta, writers stopped: sink == source row by row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exactly_once_provider.full_load import job
from exactly_once_provider.full_load.handoff import read_handoff
from exactly_once_provider.full_load.job import FullLoadRequest, run_full_load
from exactly_once_provider.full_load.staging import Staging
from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
from exactly_once_provider.sinks import delta_commit
from tests.mysql_support import (
    ALL_TYPES,
    ALL_TYPES_COLUMNS,
    all_types_rows,
    assert_same_rows,
    connect,
    sink_rows,
    source_rows,
    unique_name,
)


def _load(spark, tmp_path, table, sink=None, **kwargs):
    sink = sink or str(tmp_path / "sink")
    request = FullLoadRequest(schema="eo", table=table, sink_path=sink, **{"chunks_per_job": 4, **kwargs})
    return sink, run_full_load(spark, MySqlSourceHook(), request)


@pytest.fixture
def db(stack, airflow_connections):
    conn = connect(stack)
    created: list[str] = []

    def create(prefix: str, ddl: str, insert: str | None = None, rows: list[tuple] = ()) -> str:
        name = unique_name(prefix)
        cur = conn.cursor()
        cur.execute(f"CREATE TABLE `{name.replace('`', '``')}` {ddl}")
        created.append(name)
        if rows:
            cur.executemany(insert.format(t=f"`{name.replace('`', '``')}`"), rows)
        return name

    yield create
    for name in created:
        conn.cursor().execute(f"DROP TABLE IF EXISTS `{name.replace('`', '``')}`")
    conn.close()


COLUMNS = ALL_TYPES_COLUMNS


def _readers(sink: str) -> set[str]:
    """The readers that staged the load's chunks (the staging manifest records each chunk's)."""
    return {entry["reader"] for entry in Staging(sink + "._eo_full_load").load()["done"].values()}


@pytest.mark.parametrize("reader", ["native", "rows"])
def test_all_column_types_integer_key(stack, spark, db, tmp_path, reader):
    table = db("fl_types", ALL_TYPES, "INSERT INTO {t} VALUES (" + ", ".join(["%s"] * 20) + ")", all_types_rows(2999))
    sink, result = _load(spark, tmp_path, table, chunk_rows=700, reader=reader)
    assert _readers(sink) == {reader}  # no chunk fell back to the row reader
    expected = source_rows(stack, table, COLUMNS)
    assert sum(expected.values()) == 3000
    assert_same_rows(sink_rows(spark, sink, COLUMNS), expected, COLUMNS)
    h = result.handoff
    assert [c.rows for c in h.chunks] == [700, 700, 700, 700, 200] and h.rows == 3000
    assert read_handoff(sink) == h  # the capture reads exactly what the load published


def test_composite_key_chunks_split_inside_a_leading_value(stack, spark, db, tmp_path):
    rows = [(a, f"k{b:04d}", a * b) for a in range(3) for b in range(400)]  # 1200 rows, 3 leading values
    table = db(
        "fl_comp",
        "(a INT NOT NULL, b VARCHAR(10) NOT NULL, v INT, PRIMARY KEY (a, b))",
        "INSERT INTO {t} VALUES (%s, %s, %s)",
        rows,
    )
    sink, result = _load(spark, tmp_path, table, chunk_rows=250)
    assert sink_rows(spark, sink, ["a", "b", "v"]) == source_rows(stack, table, ["a", "b", "v"])
    assert _readers(sink) == {"native"}
    assert [c.rows for c in result.handoff.chunks] == [250, 250, 250, 250, 200]
    assert result.handoff.chunks[0].chunk.upper == (0, "k0249")  # a boundary in the middle of a=0


def test_string_key_with_utf8mb4_and_case_insensitive_collation(stack, spark, db, tmp_path):
    rows = [(f"{p}{i:05d}ü😀", i) for i in range(300) for p in ("A", "b", "Ç", "😀", "z'`;")]
    table = db(
        "fl_str",
        "(k VARCHAR(40) CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci NOT NULL PRIMARY KEY, v INT)",
        "INSERT INTO {t} VALUES (%s, %s)",
        rows,
    )
    sink, result = _load(spark, tmp_path, table, chunk_rows=333)
    assert sink_rows(spark, sink, ["k", "v"]) == source_rows(stack, table, ["k", "v"]) and _readers(sink) == {"native"}
    assert sum(c.rows for c in result.handoff.chunks) == 1500 and len(result.handoff.chunks) == 5


def test_skewed_key_gives_chunks_even_by_rows(stack, spark, db, tmp_path):
    ids = list(range(1, 1001)) + [10**12 + i for i in range(300)] + [2**62 + i for i in range(5)]
    table = db(
        "fl_skew",
        "(id BIGINT NOT NULL PRIMARY KEY, v VARCHAR(8))",
        "INSERT INTO {t} VALUES (%s, %s)",
        [(i, str(i % 97)) for i in ids],
    )
    # The table's parent folders do not exist yet and its staging area is elsewhere: the publish creates them.
    staging = str(tmp_path / "staging" / "fl_skew")
    sink, result = _load(
        spark, tmp_path, table, sink=str(tmp_path / "lake" / "eo" / "fl_skew"), staging_path=staging, chunk_rows=400
    )
    assert result.stats["phases"]["publish_mode"].startswith("adopt")
    assert sink_rows(spark, sink, ["id", "v"]) == source_rows(stack, table, ["id", "v"])
    assert [c.rows for c in result.handoff.chunks] == [400, 400, 400, 105]


def test_hostile_table_name_and_explicit_unique_chunk_key(stack, spark, db, tmp_path):
    table = db(
        "fl_x`; DROP TABLE eo.nothing; -- '\"",
        "(code CHAR(6) NOT NULL, v INT, UNIQUE KEY uk (code))",
        "INSERT INTO {t} VALUES (%s, %s)",
        [(f"c{i:05d}", i) for i in range(500)],
    )
    sink, result = _load(spark, tmp_path, table, chunk_rows=200, chunk_key=("code",))
    assert sink_rows(spark, sink, ["code", "v"]) == source_rows(stack, table, ["code", "v"])
    assert _readers(sink) == {"native"}
    assert result.handoff.key == ("code",) and result.handoff.table == table


def test_empty_table_publishes_an_empty_table_with_a_position(stack, spark, db, tmp_path):
    table = db("fl_empty", "(id INT PRIMARY KEY)")
    sink, result = _load(spark, tmp_path, table, chunk_rows=10)
    assert spark.read.format("delta").load(sink).count() == 0 and _readers(sink) == {"rows"}  # no rows: no position
    assert len(result.handoff.chunks) == 1 and result.handoff.min_position.file.startswith("binlog.")


def test_rerun_is_a_no_op_and_a_crash_after_the_commit_does_not_commit_twice(stack, spark, db, tmp_path):
    table = db(
        "fl_rerun", "(id INT PRIMARY KEY, v INT)", "INSERT INTO {t} VALUES (%s, %s)", [(i, i) for i in range(100)]
    )
    sink, first = _load(spark, tmp_path, table, chunk_rows=40)
    # A new table adopts the staged files as they are (nothing rewritten) in its one first commit.
    assert first.stats["phases"]["publish_mode"].startswith("adopt")
    log = [json.loads(line) for line in (Path(sink) / "_delta_log" / f"{0:020d}.json").read_text().splitlines()]
    staged = {
        d["data"] for d in FullLoadRequest(schema="eo", table=table, sink_path=sink).staging().load()["done"].values()
    }
    assert {a["add"]["path"] for a in log if "add" in a} == staged == {p.name for p in Path(sink).glob("*.parquet")}
    assert [a["txn"]["appId"] for a in log if "txn" in a] == [f"eo-full-load-{first.handoff.load_id}"]
    assert {f.rsplit("/", 1)[1] for f in spark.read.format("delta").load(sink).inputFiles()} == staged
    _, again = _load(spark, tmp_path, table, chunk_rows=40)
    assert again.already_published and again.handoff == first.handoff
    # Simulate a crash between the Delta commit and the manifest update: the retry must not commit again.
    staging = FullLoadRequest(schema="eo", table=table, sink_path=sink).staging()
    manifest = staging.load()
    manifest["published"] = None
    staging.save(manifest)
    _, retried = _load(spark, tmp_path, table, chunk_rows=40)
    assert retried.handoff.table_version == first.handoff.table_version == 0
    assert [v for v, _ in delta_commit.commits(sink)] == [0]
    assert spark.read.format("delta").load(sink).count() == 100
    # A deliberate full reload: a new snapshot replaces the table in one new commit.
    conn = connect(stack)
    conn.cursor().execute(f"DELETE FROM `{table}` WHERE id >= 50")
    conn.close()
    _, reloaded = _load(spark, tmp_path, table, chunk_rows=40, full_reload=True)
    assert reloaded.handoff.table_version == 1 and reloaded.handoff.load_id != first.handoff.load_id
    assert reloaded.stats["phases"]["publish_mode"].startswith("rewrite")  # an existing table: replaced, one commit
    assert sink_rows(spark, sink, ["id", "v"]) == source_rows(stack, table, ["id", "v"])
    assert read_handoff(sink).load_id == reloaded.handoff.load_id


def test_damaged_staging_is_refused_at_publish(stack, spark, db, tmp_path, monkeypatch):
    table = db("fl_damage", "(id INT PRIMARY KEY)", "INSERT INTO {t} VALUES (%s)", [(i,) for i in range(90)])
    sink = str(tmp_path / "sink")
    request = FullLoadRequest(schema="eo", table=table, sink_path=sink, chunk_rows=30, chunks_per_job=4)

    def stop_before_publish(name):
        if name == "full_load_before_publish":
            raise RuntimeError("stopped before the publish")

    monkeypatch.setattr(job, "fault_point", stop_before_publish)
    with pytest.raises(RuntimeError, match="stopped before the publish"):
        run_full_load(spark, MySqlSourceHook(), request)
    monkeypatch.undo()
    staging = request.staging()
    # 90 rows in chunks of 30: 3 chunks (the planner takes no boundary at the last key, so no empty 4th chunk).
    assert len(staging.load()["done"]) == 3 and not (tmp_path / "sink").exists()
    part = max(staging.data_dir.glob("*.parquet"), key=lambda p: p.stat().st_size)
    part.unlink()  # staged rows lost after their chunk was recorded as done
    with pytest.raises(delta_commit.CommitMarkerError, match="staging area .* is damaged"):
        run_full_load(spark, MySqlSourceHook(), request)
    assert not (tmp_path / "sink" / "_delta_log").exists()
