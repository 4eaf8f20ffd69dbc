"""Reading commit markers from a Delta log written by hand (the real Delta writer is in integration)."""

from __future__ import annotations

import json

from exactly_once_provider import delta_commit


def _commit(log, version, user_metadata=None, txn=None):
    actions = [{"commitInfo": {"operation": "WRITE", **({"userMetadata": user_metadata} if user_metadata else {})}}]
    if txn:
        actions.append({"txn": {"appId": txn[0], "version": txn[1]}})
    (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")


def test_newest_matching_marker_and_transaction(tmp_path):
    log = tmp_path / "_delta_log"
    log.mkdir()
    _commit(log, 0, json.dumps({"eo_full_load": {"n": 1}}), ("app", 1))
    _commit(log, 1, json.dumps({"other": 1}), ("app2", 7))
    _commit(log, 2, None)
    assert delta_commit.latest_marker(str(tmp_path), "eo_full_load") == (0, {"eo_full_load": {"n": 1}})
    assert delta_commit.latest_marker(f"file://{tmp_path}", "other") == (1, {"other": 1})
    assert delta_commit.find_commit(str(tmp_path), "app2", 7) == 1
    assert delta_commit.find_commit(str(tmp_path), "app2", 8) is None
    assert delta_commit.latest_marker(str(tmp_path / "missing"), "x") is None


def test_find_commit_reads_the_checkpoint_txn_state_instead_of_the_whole_log(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    log = tmp_path / "_delta_log"
    log.mkdir()
    for version in range(12):
        _commit(log, version, None, ("stream", version))
    txn = pa.array([{"appId": "stream", "version": 10, "lastUpdated": 0}, None],
                   pa.struct([("appId", pa.string()), ("version", pa.int64()), ("lastUpdated", pa.int64())]))
    pq.write_table(pa.table({"txn": txn}), log / f"{10:020d}.checkpoint.parquet")
    assert delta_commit.find_commit(str(tmp_path), "stream", 11) == 11  # newest JSON, after the checkpoint
    assert delta_commit.find_commit(str(tmp_path), "stream", 12) is None
    assert delta_commit.find_commit(str(tmp_path), "other", 1) is None  # not in the checkpoint: no log scan
    assert delta_commit.find_commit(str(tmp_path), "stream", 3) == 3  # a replay: the older commit is found
    for version in range(10):  # log retention removed the old JSON commits
        (log / f"{version:020d}.json").unlink()
    assert delta_commit.find_commit(str(tmp_path), "stream", 3) == 10


def test_create_with_files_writes_one_first_commit_with_marker_txn_and_file_stats(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import pytest

    names = []
    for i, rows in enumerate((3, 0)):
        name = f"chunk {i}.parquet"  # a space: the add path is URL-encoded as the protocol asks
        pq.write_table(pa.table({"id": pa.array(range(rows), pa.int64())}), tmp_path / name)
        names.append({"name": name, "bytes": (tmp_path / name).stat().st_size, "rows": rows})
    schema = json.dumps({"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True,
                                                       "metadata": {}}]})
    marker = {"eo_full_load": {"load_id": "L"}}
    assert delta_commit.create_with_files(str(tmp_path), schema, names, marker, "eo-full-load-L", 1) == 0
    log = [json.loads(line) for line in (tmp_path / "_delta_log" / f"{0:020d}.json").read_text().splitlines()]
    assert [next(iter(a)) for a in log] == ["commitInfo", "metaData", "protocol", "txn", "add", "add"]
    assert log[2]["protocol"] == {"minReaderVersion": 1, "minWriterVersion": 2}
    assert [(a["add"]["path"], json.loads(a["add"]["stats"])["numRecords"]) for a in log[4:]] == [
        ("chunk%200.parquet", 3), ("chunk%201.parquet", 0)]
    assert delta_commit.latest_marker(str(tmp_path), "eo_full_load") == (0, marker)
    assert delta_commit.find_commit(str(tmp_path), "eo-full-load-L", 1) == 0
    # A retry of the same (app id, version) is a no-op; another writer cannot create the table again.
    assert delta_commit.create_with_files(str(tmp_path), schema, names, marker, "eo-full-load-L", 1) == 0
    with pytest.raises(delta_commit.CommitMarkerError, match="already is a Delta table"):
        delta_commit.create_with_files(str(tmp_path), schema, names, marker, "eo-full-load-M", 1)
    assert sorted(p.name for p in (tmp_path / "_delta_log").iterdir()) == [f"{0:020d}.json"]


def test_create_with_files_takes_table_features_for_timestamp_ntz_and_checks_file_sizes(tmp_path):
    import pytest

    (tmp_path / "a.parquet").write_bytes(b"x" * 10)
    schema = json.dumps({"type": "struct", "fields": [{"name": "d", "type": "timestamp_ntz", "nullable": True,
                                                       "metadata": {}}]})
    with pytest.raises(delta_commit.CommitMarkerError, match="has 10 bytes, not 11"):
        delta_commit.create_with_files(str(tmp_path), schema, [{"name": "a.parquet", "bytes": 11, "rows": 1}],
                                       {}, "app", 1)
    assert not any((tmp_path / "_delta_log").glob("*.json"))
    delta_commit.create_with_files(str(tmp_path), schema, [{"name": "a.parquet", "bytes": 10, "rows": 1}], {}, "app", 1)
    log = [json.loads(line) for line in (tmp_path / "_delta_log" / f"{0:020d}.json").read_text().splitlines()]
    assert log[2]["protocol"]["readerFeatures"] == ["timestampNtz"]
