"""Status sections from ledger records, Delta commit logs and files manifests (written as the sinks write them)."""

from __future__ import annotations

import json
from pathlib import Path

from exactly_once_provider.full_load import handoff
from exactly_once_provider.kafka.offsets import new_committed_offset
from exactly_once_provider.plugins.discovery import PipelineSpec, SinkSpec
from exactly_once_provider.plugins.status import (
    BEHIND,
    EMPTY,
    ERROR,
    MISMATCH,
    OK,
    Connections,
    PipelineStatus,
    Section,
    full_loads_section,
    lag_section,
    ledger_section,
    sink_commit,
    sink_windows_section,
    windows_section,
)


def _delta_commit(path: Path, version: int, marker: dict, rows: int, timestamp: int = 1_795_000_000_000) -> None:
    """Write one Delta JSON commit the way Delta does: commitInfo (with userMetadata) and txn actions."""
    log = path / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    info = {
        "commitInfo": {
            "timestamp": timestamp,
            "operation": "WRITE",
            "userMetadata": json.dumps(marker),
            "operationMetrics": {"numOutputRows": str(rows)},
        }
    }
    (log / f"{version:020d}.json").write_text(
        json.dumps(info) + "\n" + json.dumps({"txn": {"appId": "a", "version": version}}) + "\n"
    )


def _window(batch_id, version, rows):
    return {
        "batch_id": batch_id,
        "batch_version": version,
        "lower": None,
        "upper": "2026-11-20 00:00:00.000000",
        "upper_reason": "interval_end",
        "rows": rows,
        "checksum": "sha256:" + "ab" * 32,
        "interval_end": None,
        "published_at": "2026-11-20T02:00:00+08:00",
    }


def test_ledger_and_window_sections_show_every_partition_and_window_newest_first():
    history = {"2026-11-19": _window("2026-11-19", 1, 10), "2026-11-20": _window("2026-11-20", 3, 12)}
    offset = {
        "kind": "watermark",
        "watermark_version": 1,
        "cursor_kind": "timestamp",
        "next_lower": "2026-11-20 00:00:00.000000",
        "window": history["2026-11-20"],
        "history": history,
    }
    ledger = {
        "settle/orders": new_committed_offset("settle", "orders", offset, 4, "2026-11-20", 3, 12, "tx", "exactly_once"),
        "other/0": new_committed_offset("other", "0", 99, 1, "1", 1, 5, None, "at_least_once"),
        "settle/broken": ValueError("schema_version 2"),
    }
    spec = PipelineSpec("settle")

    rows = ledger_section(spec, ledger)
    assert [r["source partition"] for r in rows.rows] == ["orders"]
    assert rows.rows[0]["offset"] == "watermark next lower = 2026-11-20 00:00:00.000000"
    assert rows.error == "settle/broken: schema_version 2"  # an unreadable record is shown, not skipped
    windows = windows_section(spec, ledger)
    assert [(w["batch"], w["version"], w["rows"]) for w in windows.rows] == [
        ("2026-11-20", 3, 12),
        ("2026-11-19", 1, 10),
    ]


def test_delta_and_files_sink_commits_are_read_from_their_logs(tmp_path):
    delta = tmp_path / "delta"
    marker = {"pipeline": "p", "checkpoint_id": "ck", "batch_id": 0, "offsets": {"t": {"0": 40}}, "rows_total": 0}
    _delta_commit(delta, 0, {"eo_stream:p": marker}, rows=40)
    _delta_commit(delta, 1, {"eo_stream:p": {**marker, "batch_id": 1, "offsets": {"t": {"0": 70}}}}, rows=30)
    row = sink_commit(SinkSpec("delta", str(delta)), "p", connections=None)
    assert (row["commit"], row["batch id"], row["rows in sink"], row["next offsets"]) == (
        "Delta version 1",
        1,
        70,
        {"t": {0: 70}},
    )

    files = tmp_path / "files"
    (files / "_manifests").mkdir(parents=True)
    manifest = {
        "format": 1,
        "sequence": 3,
        **marker,
        "batch_id": 7,
        "rows_total": 120,
        "files": [{"path": "data/a/part-0.parquet", "rows": 60}, {"path": "data/b/part-0.parquet", "rows": 60}],
    }
    (files / "_manifests" / f"{3:020d}.json").write_text(json.dumps(manifest))
    row = sink_commit(SinkSpec("files", str(files)), "p", connections=None)
    assert (row["commit"], row["batch id"], row["rows in sink"]) == ("manifest 3, 2 files", 7, 120)
    assert sink_commit(SinkSpec("delta", str(tmp_path / "none")), "p", connections=None) is None


def test_full_loads_list_the_load_and_every_reload_newest_first(tmp_path):
    path = tmp_path / "orders"
    chunks = [{"index": 0, "lower": None, "upper": None, "file": "binlog.000003", "pos": 4711, "rows": 40}]
    _delta_commit(path, 0, handoff.marker("load-1", "eo", "orders", ("id",), chunks), rows=40)
    _delta_commit(path, 1, {"eo_stream:x": {}}, rows=3)  # a stream commit in the same table is not a load
    reload_chunks = [{**chunks[0], "pos": 9000, "rows": 41}]
    _delta_commit(path, 2, handoff.marker("load-2", "eo", "orders", ("id",), reload_chunks), rows=41)

    section = full_loads_section(PipelineSpec("p", full_loads={SinkSpec("delta", str(path))}), Connections())
    assert [(r["Delta version"], r["load id"], r["rows"], r["snapshot from"]) for r in section.rows] == [
        (2, "load-2", 41, "binlog.000003:9000"),
        (0, "load-1", 40, "binlog.000003:4711"),
    ]
    assert section.error is None


def test_the_current_full_load_is_found_through_the_stream_commits_pointer_not_by_reading_the_whole_log(tmp_path):
    from exactly_once_provider.sinks.current_table import full_load_pointer

    path = tmp_path / "orders"
    chunks = [{"index": 0, "lower": None, "upper": None, "file": "binlog.000003", "pos": 4711, "rows": 40}]
    loaded = handoff.marker("load-1", "eo", "orders", ("id",), chunks)
    _delta_commit(path, 0, loaded, rows=40)
    for version in range(1, 501):
        _delta_commit(path, version, {"eo_stream:x": {"full_load": full_load_pointer(0, loaded)}}, rows=3)
    section = full_loads_section(PipelineSpec("p", full_loads={SinkSpec("delta", str(path))}), Connections())
    assert [(r["Delta version"], r["load id"]) for r in section.rows] == [(0, "load-1")]
    assert section.rows[0]["published at"]


def test_state_is_error_then_behind_then_empty_or_ok():
    spec = PipelineSpec("p")
    row = Section("lag", "lag", ("lag",), rows=[{"lag": 3}])
    assert PipelineStatus(spec, [row, Section("sink", "sink", (), error="boom")], lag=3).state == ERROR
    assert PipelineStatus(spec, [row], lag=3).state == BEHIND
    assert PipelineStatus(spec, [row], lag=0).state == OK
    assert PipelineStatus(spec, [Section("sink", "sink", ())], lag=0).state == EMPTY
    mismatch = Section("reconciliation", "Last reconciliation", ("result",), rows=[{"result": "mismatch"}])
    assert PipelineStatus(spec, [row, mismatch], lag=0).state == MISMATCH
    clean = Section("reconciliation", "Last reconciliation", ("result",), rows=[{"result": "clean"}])
    assert PipelineStatus(spec, [row, clean], lag=3).state == BEHIND


def test_window_mode_sink_commits_show_the_version_each_window_settled_at(tmp_path):
    delta = tmp_path / "settled"
    windows = {
        "settle/orders/2026-11-19": {"version": 1, "rows": 10},
        "settle/orders/2026-11-20": {"version": 2, "rows": 12},
    }
    marker = {
        "pipeline": "p",
        "checkpoint_id": "ck",
        "batch_id": 4,
        "offsets": {"t": {"0": 90}},
        "rows_total": 22,
        "windows": windows,
    }
    _delta_commit(delta, 0, {"eo_stream:p": marker}, rows=22)

    row = sink_commit(SinkSpec("delta", str(delta)), "p", connections=None)
    section = sink_windows_section([row])
    assert [(r["window"], r["version"], r["rows"]) for r in section.rows] == [
        ("settle/orders/2026-11-20", 2, 12),
        ("settle/orders/2026-11-19", 1, 10),
    ]


def test_an_empty_partition_lags_by_nothing_even_before_the_sink_committed_from_it():
    class Ends(Connections):
        def end_offsets(self, conn_id, topic):
            return {"t.idle": {0: 0, 1: 0}, "t.busy": {0: 9, 1: 4}}[topic]

    spec = PipelineSpec("p", topics={"t.idle", "t.busy"}, sinks={SinkSpec("delta", "/lake/t")})
    section, total = lag_section(spec, [{"next offsets": {"t.busy": {"0": 7}}}], Ends())
    lags = {(r["topic"], r["partition"]): r["lag"] for r in section.rows}
    assert lags == {("t.busy", 0): 2, ("t.busy", 1): "—", ("t.idle", 0): 0, ("t.idle", 1): 0} and total == 2


def test_an_iceberg_sink_commit_is_read_from_its_snapshot_summary_in_the_tasks_catalog(tmp_path, monkeypatch):
    """The page reads the fence as the sink does (newest snapshot carrying the pipeline), through the catalog the
    task names in its connection's database; here a SQLite SqlCatalog stands in for the PostgreSQL one."""
    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog

    from exactly_once_provider.sinks import iceberg
    from exactly_once_provider.sinks.base import BatchCommit

    catalog = SqlCatalog("lake", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}")
    opened = []

    def open_catalog(settings, s3=None):
        opened.append(settings)
        return catalog

    monkeypatch.setattr(iceberg, "open_catalog", open_catalog)
    catalog.create_namespace("lake")
    rows = pa.table({"n": pa.array([1, 2, 3], pa.int64())})
    table = catalog.create_table("lake.orders", schema=rows.schema)
    table.append(rows, snapshot_properties=iceberg.summary_properties(BatchCommit("p", "ck", 4, {"t": {0: 70}}, 3)))
    table.append(rows, snapshot_properties={"written-by": "compaction"})  # another writer's snapshot: stepped over

    class Database(Connections):
        @staticmethod
        def postgres(conn_id):
            return {"host": "pg.example", "dbname": conn_id}

    row = sink_commit(SinkSpec("iceberg", "lake.orders", "lake_pg", iceberg_catalog="lake"), "p", Database())
    assert (row["checkpoint"], row["batch id"], row["rows in sink"], row["next offsets"]) == (
        "ck",
        4,
        3,
        {"t": {0: 70}},
    )
    assert row["commit"] == f"snapshot {table.refresh().current_snapshot().snapshot_id} of lake.orders"
    assert opened[0]["name"] == "lake" and opened[0]["postgres"]["dbname"] == "lake_pg"
    assert sink_commit(SinkSpec("iceberg", "lake.not_yet", "lake_pg"), "p", Database()) is None  # no table yet
