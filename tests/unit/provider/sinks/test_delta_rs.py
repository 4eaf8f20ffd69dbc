"""The delta-rs commit step on local disk: what the library does on its own, and what the provider adds to it."""

from __future__ import annotations

import json

import pytest

from exactly_once_provider.sinks import delta_commit, delta_log, delta_rs
from exactly_once_provider.storage import open_storage

SCHEMA = json.dumps({"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]})


def _parquet(directory, name, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": pa.array(range(rows), pa.int64())}), directory / name)
    return {"name": name, "bytes": (directory / name).stat().st_size, "rows": rows}


def _live(path) -> list[str]:
    from deltalake import DeltaTable

    return sorted(uri.rsplit("/", 1)[-1] for uri in DeltaTable(str(path)).file_uris())


def test_delta_rs_commits_a_replay_from_a_fresh_snapshot_so_the_txn_is_checked_first(tmp_path):
    """Why append_with_files checks the txn itself: the library takes a replayed (app id, version) as new."""
    from deltalake import DeltaTable
    from deltalake.transaction import CommitProperties, Transaction

    delta_commit.create_with_files(str(tmp_path), SCHEMA, [_parquet(tmp_path, "a.parquet", 2)], {}, "app", 0)
    add = delta_commit.add_actions(open_storage(str(tmp_path)), [_parquet(tmp_path, "b.parquet", 3)], 0)
    table = DeltaTable(str(tmp_path))
    table.create_write_transaction(
        add, "append", table.schema(), commit_properties=CommitProperties(app_transactions=[Transaction("app", 0)])
    )
    assert _live(tmp_path) == ["a.parquet", "b.parquet"], "delta-rs refused the replay: the pre-check may go"
    # the provider's own commit of the same replay writes nothing (it names the newest commit holding the txn)
    assert delta_commit.append_with_files(
        str(tmp_path), SCHEMA, [_parquet(tmp_path, "c.parquet", 1)], {}, "app", 0
    ) == (1, False)
    assert _live(tmp_path) == ["a.parquet", "b.parquet"]


def test_a_remove_names_the_decoded_path_delta_rs_encodes_and_an_unknown_one_is_taken_silently(tmp_path):
    storage = open_storage(str(tmp_path))
    delta_commit.create_with_files(storage, SCHEMA, [_parquet(tmp_path, "a b.parquet", 2)], {}, "app", 0)
    state = delta_log.table_state(storage)
    files = list(delta_log.active_files(state).values())
    assert [f["path"] for f in files] == ["a%20b.parquet"]  # the log holds the URL-encoded path
    # The library: a remove of the log's (encoded) path is encoded again and removes nothing, without an error.
    assert delta_rs.commit(
        storage, 0, [*_raw_removes(files), *delta_commit.add_actions(storage, [], 0)], {}, "raw", 1, 0, {}
    )
    assert _live(tmp_path) == ["a b.parquet"], "delta-rs now takes encoded paths: remove_actions must change"
    # remove_actions passes the decoded path: the file is removed
    added = _parquet(tmp_path, "c.parquet", 1)
    actions = [*delta_rs.remove_actions(files, 0), *delta_commit.add_actions(storage, [added], 0)]
    assert delta_rs.commit(storage, 1, actions, {"m": 2}, "app", 1, 0, {"isBlindAppend": False})
    assert _live(tmp_path) == ["c.parquet"]
    info = delta_commit.read_commit(storage, 2)["commitInfo"]
    assert (info["readVersion"], json.loads(info["userMetadata"]), info["isBlindAppend"]) == (1, {"m": 2}, False)


def _raw_removes(files):
    from deltalake.transaction import RemoveAction

    return [RemoveAction(f["path"], True, 0, int(f["size"]), {}) for f in files]


def test_a_commit_on_an_older_snapshot_is_not_rebased_and_a_landed_commit_counts_despite_an_error(
    tmp_path, monkeypatch
):
    from deltalake import DeltaTable

    storage = open_storage(str(tmp_path))
    delta_commit.create_with_files(storage, SCHEMA, [], {}, "setup", 0)
    delta_commit.append_with_files(storage, SCHEMA, [_parquet(tmp_path, "a.parquet", 1)], {}, "other", 0)
    # Another writer committed version 1: a commit on the snapshot of version 0 fails instead of landing as 2.
    late = delta_commit.add_actions(storage, [_parquet(tmp_path, "b.parquet", 1)], 0)
    assert delta_rs.commit(storage, 0, late, {}, "app", 1, 0, {}) is False
    assert delta_commit.newest_version(storage) == 1
    # A commit that landed although the call failed (its response lost) is this writer's: its files stay.
    real = DeltaTable.create_write_transaction

    def lands_then_fails(self, *args, **kwargs):
        real(self, *args, **kwargs)
        raise OSError("connection reset")

    monkeypatch.setattr(DeltaTable, "create_write_transaction", lands_then_fails)
    assert delta_rs.commit(storage, 1, late, {}, "app", 1, 0, {}) is True
    assert _live(tmp_path) == ["a.parquet", "b.parquet"]
    # and one that failed before landing raises
    monkeypatch.setattr(DeltaTable, "create_write_transaction", lambda *a, **k: (_ for _ in ()).throw(OSError("down")))
    with pytest.raises(OSError, match="down"):
        delta_rs.commit(storage, 2, [], {}, "app", 2, 0, {})
