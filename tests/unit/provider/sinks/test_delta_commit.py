"""Reading commit markers from a Delta log written by hand (the real Delta writer is in integration)."""

from __future__ import annotations

import json
import re

import pytest

from exactly_once_provider.sinks import delta_commit


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
    txn = pa.array(
        [{"appId": "stream", "version": 10, "lastUpdated": 0}, None],
        pa.struct([("appId", pa.string()), ("version", pa.int64()), ("lastUpdated", pa.int64())]),
    )
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
    schema = json.dumps(
        {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
    )
    marker = {"eo_full_load": {"load_id": "L"}}
    assert delta_commit.create_with_files(str(tmp_path), schema, names, marker, "eo-full-load-L", 1) == 0
    log = _kinds(_actions(tmp_path, 0))
    assert {k: len(v) for k, v in log.items()} == {"commitInfo": 1, "metaData": 1, "protocol": 1, "txn": 1, "add": 2}
    assert log["protocol"][0] == {"minReaderVersion": 1, "minWriterVersion": 2}
    assert (log["txn"][0]["appId"], log["txn"][0]["version"]) == ("eo-full-load-L", 1)
    assert log["commitInfo"][0]["operationMetrics"]["numOutputRows"] == "3"
    assert [(a["path"], json.loads(a["stats"])["numRecords"]) for a in log["add"]] == [
        ("chunk%200.parquet", 3),
        ("chunk%201.parquet", 0),
    ]
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
    schema = json.dumps(
        {"type": "struct", "fields": [{"name": "d", "type": "timestamp_ntz", "nullable": True, "metadata": {}}]}
    )
    with pytest.raises(delta_commit.CommitMarkerError, match="has 10 bytes, not 11"):
        delta_commit.create_with_files(
            str(tmp_path), schema, [{"name": "a.parquet", "bytes": 11, "rows": 1}], {}, "app", 1
        )
    assert not any((tmp_path / "_delta_log").glob("*.json"))
    delta_commit.create_with_files(str(tmp_path), schema, [{"name": "a.parquet", "bytes": 10, "rows": 1}], {}, "app", 1)
    assert _kinds(_actions(tmp_path, 0))["protocol"][0]["readerFeatures"] == ["timestampNtz"]


# ------------------------------------------------------------------------------- own append commits
ID_SCHEMA = json.dumps({"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]})


def _parquet(directory, name, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": pa.array(range(rows), pa.int64())}), directory / name)
    return {"name": name, "bytes": (directory / name).stat().st_size, "rows": rows}


def _actions(tmp_path, version):
    return [json.loads(line) for line in (tmp_path / "_delta_log" / f"{version:020d}.json").read_text().splitlines()]


def _kinds(actions):
    """Return action kind -> the actions of that kind, in the commit's order (delta-rs orders kinds its own way)."""
    kinds = {}
    for action in actions:
        (kind, body), *_ = action.items()
        kinds.setdefault(kind, []).append(body)
    return kinds


def _another_writer(tmp_path, version, actions):
    """Write another writer's commit ``version`` into the log (put-if-absent, as every Delta writer commits)."""
    with open(tmp_path / "_delta_log" / f"{version:020d}.json", "x") as commit:
        commit.write("".join(json.dumps(a) + "\n" for a in actions))


def _first(monkeypatch, tmp_path, winners):
    """Let another writer commit each of ``winners`` just before the next delta-rs commits of the test's writer."""
    from exactly_once_provider.sinks import delta_rs

    real_commit = delta_rs.commit
    winners = iter(winners)

    def another_writer_first(storage, read_version, *args, **kwargs):
        winner = next(winners, None)
        if winner is not None:
            _another_writer(tmp_path, read_version + 1, winner)
        return real_commit(storage, read_version, *args, **kwargs)

    monkeypatch.setattr(delta_rs, "commit", another_writer_first)


def test_append_with_files_writes_the_next_commit_and_skips_a_replayed_txn(tmp_path):
    delta_commit.create_with_files(str(tmp_path), ID_SCHEMA, [_parquet(tmp_path, "a.parquet", 2)], {"m": 0}, "app", 0)
    files = [_parquet(tmp_path, "b.parquet", 3), _parquet(tmp_path, "c.parquet", 1)]
    assert delta_commit.append_with_files(str(tmp_path), ID_SCHEMA, files, {"m": 1}, "app", 1) == (1, True)
    actions = _kinds(_actions(tmp_path, 1))
    assert {k: len(v) for k, v in actions.items()} == {"commitInfo": 1, "txn": 1, "add": 2}
    info = actions["commitInfo"][0]
    assert (info["operation"], info["operationParameters"]["mode"], info["readVersion"], info["isBlindAppend"]) == (
        "WRITE",
        "Append",
        0,
        True,
    )
    assert info["operationMetrics"]["numOutputRows"] == "4" and json.loads(info["userMetadata"]) == {"m": 1}
    assert actions["txn"][0]["appId"] == "app" and actions["txn"][0]["version"] == 1
    assert [json.loads(a["stats"])["numRecords"] for a in actions["add"]] == [3, 1]
    # the same (app id, version) again, or a lower version (Delta: already executed): nothing is written
    assert delta_commit.append_with_files(str(tmp_path), ID_SCHEMA, files, {"m": 1}, "app", 1) == (1, False)
    assert delta_commit.append_with_files(str(tmp_path), ID_SCHEMA, files, {"m": 0}, "app", 0) == (0, False)
    assert sorted(p.name for p in (tmp_path / "_delta_log").glob("*.json")) == [f"{v:020d}.json" for v in (0, 1)]


def test_append_with_files_after_losing_the_race_checks_the_winner_and_retries(tmp_path, monkeypatch):
    delta_commit.create_with_files(str(tmp_path), ID_SCHEMA, [], {}, "app", 0)
    files = [_parquet(tmp_path, "b.parquet", 3)]
    winners = [{"txn": {"appId": "other", "version": 7}}, {"txn": {"appId": "app", "version": 1}}]
    _first(monkeypatch, tmp_path, [[{"commitInfo": {"operation": "WRITE"}}, winner] for winner in winners])
    # version 1 taken by another app id: retried at 2; version 2 taken by a zombie of the same (app, 1): skipped
    assert delta_commit.append_with_files(str(tmp_path), ID_SCHEMA, files, {}, "app", 1) == (2, False)
    assert not any("add" in a for v in (1, 2) for a in _actions(tmp_path, v))


def test_append_with_files_fails_when_the_same_app_id_commits_another_version_meanwhile(tmp_path, monkeypatch):
    delta_commit.create_with_files(str(tmp_path), ID_SCHEMA, [], {}, "app", 0)
    _first(monkeypatch, tmp_path, [[{"txn": {"appId": "app", "version": 1}}]])
    with pytest.raises(delta_commit.CommitMarkerError, match=r"committed txn \(app, 1\).*two writers share one app id"):
        delta_commit.append_with_files(str(tmp_path), ID_SCHEMA, [], {}, "app", 2)


def _state(protocol=None, configuration=None, partitions=(), schema=ID_SCHEMA):
    from exactly_once_provider.sinks.delta_log import TableState

    return TableState(
        "/t",
        3,
        protocol or {"minReaderVersion": 1, "minWriterVersion": 2},
        {
            "schemaString": schema,
            "partitionColumns": list(partitions),
            "configuration": configuration or {},
            "format": {"provider": "parquet"},
        },
        None,
    )


@pytest.mark.parametrize(
    "state,reason",
    [
        (_state({"minReaderVersion": 2, "minWriterVersion": 5}), "reader version 2 (column mapping)"),
        (
            _state(
                {
                    "minReaderVersion": 3,
                    "minWriterVersion": 7,
                    "readerFeatures": ["deletionVectors"],
                    "writerFeatures": ["deletionVectors", "rowTracking", "appendOnly"],
                }
            ),
            "table feature deletionVectors",
        ),
        (
            _state({"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": ["inCommitTimestamp"]}),
            "table feature inCommitTimestamp",
        ),
        (_state({"minReaderVersion": 1, "minWriterVersion": 4}), "writer version 4 (change data feed"),
        (
            _state(configuration={"delta.enableChangeDataFeed": "true"}),
            "table property delta.enableChangeDataFeed=true",
        ),
        (_state(configuration={"delta.constraints.positive": "id > 0"}), "CHECK constraint positive"),
        (_state(partitions=["id"]), "partition columns ['id']"),
        (_state(schema=ID_SCHEMA.replace('"nullable": true', '"nullable": false')), "NOT NULL column id"),
        (
            _state(schema=ID_SCHEMA.replace('"metadata": {}', '"metadata": {"delta.generationExpression": "1"}')),
            "column id with delta.generationExpression",
        ),
        (_state(schema=ID_SCHEMA.replace('"long"', '"integer"')), "columns id integer while the batch has id long"),
    ],
)
def test_check_appendable_names_what_the_own_commit_does_not_write(state, reason):
    with pytest.raises(delta_commit.UnsupportedTableError, match=re.escape(reason)):
        delta_commit.check_appendable(state, ID_SCHEMA)


def test_check_appendable_accepts_plain_and_timestamp_ntz_tables_and_neutral_properties():
    delta_commit.check_appendable(
        _state(configuration={"delta.appendOnly": "true", "owner": "x", "delta.enableDeletionVectors": "false"}),
        ID_SCHEMA,
    )
    ntz = {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["timestampNtz"],
        "writerFeatures": ["timestampNtz", "invariants", "appendOnly"],
    }
    delta_commit.check_appendable(_state(ntz), ID_SCHEMA)
    relaxed = json.loads(delta_commit.nullable_schema(ID_SCHEMA.replace('"nullable": true', '"nullable": false')))
    assert relaxed["fields"][0]["nullable"] is True


def test_column_stats_are_exact_parquet_bounds_of_integer_columns_only(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "p": pa.array([1, None, 3], pa.int32()),
            "o": pa.array([10, 7, 12], pa.int64()),
            "nothing": pa.array([None, None, None], pa.int64()),
            "s": ["b", "a", None],
        }
    )
    pq.write_table(table, tmp_path / "f.parquet", row_group_size=2)  # two row groups: bounds are combined
    schema = {
        "fields": [
            {"name": "p", "type": "integer"},
            {"name": "o", "type": "long"},
            {"name": "nothing", "type": "long"},
            {"name": "s", "type": "string"},
        ]
    }
    stats = delta_commit._column_stats(pq.read_metadata(tmp_path / "f.parquet"), schema)
    assert stats == {
        "minValues": {"p": 1, "o": 7},
        "maxValues": {"p": 3, "o": 12},
        "nullCount": {"p": 1, "o": 0, "nothing": 3},
    }


def test_append_with_files_fenced_on_a_marker_fails_if_the_marker_moved_after_the_read(tmp_path, monkeypatch):
    delta_commit.create_with_files(str(tmp_path), ID_SCHEMA, [], {"eo_stream:p": {"batch_id": 0}}, "p:c1", 0)
    read_version = delta_commit.newest_version(str(tmp_path))
    files = [_parquet(tmp_path, "b.parquet", 3)]
    # another pipeline's commit in between does not matter: a commit with another marker key
    delta_commit.append_with_files(str(tmp_path), ID_SCHEMA, [], {"eo_stream:q": {}}, "q:c9", 0)
    assert delta_commit.append_with_files(
        str(tmp_path),
        ID_SCHEMA,
        files,
        {"eo_stream:p": {"batch_id": 1}},
        "p:c1",
        1,
        fence=("eo_stream:p", read_version),
    ) == (2, True)
    # a driver of an older checkpoint (app id p:c0) planned on version 0; the newer driver moved the marker on
    zombie = [_parquet(tmp_path, "z.parquet", 3)]
    with pytest.raises(delta_commit.ForeignProgressError, match="Version 2 .*'eo_stream:p' marker"):
        delta_commit.append_with_files(
            str(tmp_path),
            ID_SCHEMA,
            zombie,
            {"eo_stream:p": {"batch_id": 5}},
            "p:c0",
            5,
            fence=("eo_stream:p", read_version),
        )
    # and when the newer driver's commit wins the put-if-absent race itself, the loser re-checks and fails too
    newer = [
        {"commitInfo": {"userMetadata": json.dumps({"eo_stream:p": {"batch_id": 2}})}},
        {"txn": {"appId": "p:c1", "version": 2}},
    ]
    _first(monkeypatch, tmp_path, [newer])
    with pytest.raises(delta_commit.ForeignProgressError, match="Version 3 "):
        delta_commit.append_with_files(
            str(tmp_path),
            ID_SCHEMA,
            zombie,
            {"eo_stream:p": {"batch_id": 5}},
            "p:c0",
            5,
            fence=("eo_stream:p", delta_commit.newest_version(str(tmp_path))),
        )
    assert delta_commit.newest_version(str(tmp_path)) == 3
    assert not any("add" in a for a in _actions(tmp_path, 3))


def test_a_delta_sink_on_s3_reads_and_commits_through_its_storage_spark_through_s3a(monkeypatch):
    from exactly_once_provider.sinks.delta import DeltaSink
    from exactly_once_provider.storage import s3
    from exactly_once_provider.storage.s3 import S3Settings, S3Storage

    monkeypatch.setattr(s3, "_registered", None)  # an earlier test in this process may have registered settings

    sink = DeltaSink("s3://lake/orders", "p", s3=S3Settings("AK", "SK", endpoint_url="http://127.0.0.1:9"))
    assert isinstance(sink.table, S3Storage) and sink.table.uri() == "s3://lake/orders"
    assert delta_commit.spark_path(sink.table) == "s3a://lake/orders"
    with pytest.raises(ValueError, match="no S3 settings were given"):  # a driver without registered settings
        delta_commit.newest_version("s3a://lake/other")


def test_own_commits_go_through_a_storage_object_as_through_a_path(tmp_path):
    from exactly_once_provider.storage import open_storage

    storage = open_storage(str(tmp_path))
    schema = json.dumps(
        {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
    )
    assert delta_commit.create_with_files(storage, schema, [], {"m": 0}, "app", 0) == 0
    assert delta_commit.append_with_files(storage, schema, [], {"m": 1}, "app", 1) == (1, True)
    assert delta_commit.append_with_files(str(tmp_path), schema, [], {"m": 1}, "app", 1) == (1, False)  # replay
    assert delta_commit.newest_version(storage) == 1 and delta_commit.find_commit(storage, "app", 1) == 1
    assert [v for v, _ in delta_commit.commits(storage)] == [1, 0]
