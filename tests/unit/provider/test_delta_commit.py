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
