"""The table state read from a Delta log written by hand: checkpoint + JSON tail (real Delta logs: integration)."""

from __future__ import annotations

import json

import pytest

from exactly_once_provider.sinks import delta_log

SCHEMA = json.dumps({"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]})


def write_commit(log, version, *actions):
    log.mkdir(exist_ok=True)
    (log / f"{version:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))


def metadata(**configuration):
    return {
        "metaData": {
            "id": "t",
            "format": {"provider": "parquet", "options": {}},
            "schemaString": SCHEMA,
            "partitionColumns": [],
            "configuration": configuration,
        }
    }


def write_checkpoint(log, version, protocol, meta, txns, name=None):
    import pyarrow as pa
    import pyarrow.parquet as pq

    txn_type = pa.struct([("appId", pa.string()), ("version", pa.int64()), ("lastUpdated", pa.int64())])
    meta_type = pa.struct(
        [
            ("id", pa.string()),
            ("schemaString", pa.string()),
            ("partitionColumns", pa.list_(pa.string())),
            ("format", pa.struct([("provider", pa.string()), ("options", pa.map_(pa.string(), pa.string()))])),
            ("configuration", pa.map_(pa.string(), pa.string())),
        ]
    )
    protocol_type = pa.struct([("minReaderVersion", pa.int32()), ("minWriterVersion", pa.int32())])
    rows = 2 + len(txns)
    table = pa.table(
        {
            "protocol": pa.array([protocol] + [None] * (rows - 1), protocol_type),
            "metaData": pa.array(
                [
                    None,
                    {
                        **meta,
                        "configuration": list(meta["configuration"].items()),
                        "format": {"provider": "parquet", "options": []},
                    },
                ]
                + [None] * len(txns),
                meta_type,
            ),
            "txn": pa.array([None, None] + [{"appId": a, "version": v, "lastUpdated": 0} for a, v in txns], txn_type),
        }
    )
    pq.write_table(table, log / (name or f"{version:020d}.checkpoint.parquet"))


def test_state_replays_the_json_commits_from_the_first(tmp_path):
    log = tmp_path / "_delta_log"
    assert delta_log.table_state(str(tmp_path)) is None
    write_commit(
        log,
        0,
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        metadata(),
        {"txn": {"appId": "a", "version": 3}},
    )
    write_commit(log, 1, {"txn": {"appId": "a", "version": 4}}, {"txn": {"appId": "b", "version": 1}})
    write_commit(log, 2, metadata(**{"delta.appendOnly": "true"}))
    state = delta_log.table_state(f"file://{tmp_path}")
    assert (state.version, state.checkpoint, state.txns) == (2, None, {"a": 4, "b": 1})
    assert state.protocol == {"minReaderVersion": 1, "minWriterVersion": 2}
    assert state.configuration == {"delta.appendOnly": "true"}


def test_state_starts_from_the_newest_complete_checkpoint(tmp_path):
    log = tmp_path / "_delta_log"
    write_commit(log, 0, {"protocol": {"minReaderVersion": 1, "minWriterVersion": 1}}, metadata())
    for version in range(1, 7):
        write_commit(log, version, {"txn": {"appId": "a", "version": version}})
    meta = metadata(**{"delta.checkpointInterval": "3"})["metaData"]
    write_checkpoint(log, 3, {"minReaderVersion": 1, "minWriterVersion": 2}, meta, [("a", 3), ("old", 9)])
    # only one part of two of a newer multi-part checkpoint: not complete, not used
    write_checkpoint(
        log,
        6,
        {"minReaderVersion": 3, "minWriterVersion": 7},
        meta,
        [],
        name=f"{6:020d}.checkpoint.0000000001.0000000002.parquet",
    )
    for version in range(3):  # log cleanup removed the commits the checkpoint covers
        (log / f"{version:020d}.json").unlink()
    state = delta_log.table_state(str(tmp_path))
    assert (state.version, state.checkpoint) == (6, 3)
    assert state.txns == {"a": 6, "old": 9}
    assert state.protocol == {"minReaderVersion": 1, "minWriterVersion": 2}
    assert state.configuration == {"delta.checkpointInterval": "3"}  # the Parquet map read as a dict
    assert (
        delta_log.newest_checkpoint(
            [f"{6:020d}.checkpoint.0000000001.0000000002.parquet", f"{6:020d}.checkpoint.0000000002.0000000002.parquet"]
        )[0]
        == 6
    )


def test_a_log_without_protocol_is_refused_with_its_cause(tmp_path):
    log = tmp_path / "_delta_log"
    write_commit(log, 5, {"txn": {"appId": "a", "version": 1}})
    with pytest.raises(ValueError, match="no protocol or metaData up to version 5"):
        delta_log.table_state(str(tmp_path))


@pytest.mark.parametrize(
    "hint, first_listed, checkpoint",
    [
        ('{"version": 6, "size": 3}', 6, 6),  # the newest checkpoint: the log is read from there
        ('{"version": 3, "size": 3}', 3, 3),  # a stale hint: from the older checkpoint (still the right state)
        ('{"version": 9, "size": 3, "parts": 2}', 0, 6),  # names a checkpoint that is not complete: the whole log
        ('{"version": 12, "size": 3}', 0, 6),  # names a checkpoint that is not there
        ('{"vers', 0, 6),  # torn: the whole log
    ],
)
def test_the_log_is_read_from_the_checkpoint_last_checkpoint_names(tmp_path, hint, first_listed, checkpoint):
    log = tmp_path / "_delta_log"
    write_commit(log, 0, {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}, metadata())
    for version in range(1, 11):
        write_commit(log, version, {"txn": {"appId": "a", "version": version}})
    meta = metadata()["metaData"]
    for version in (3, 6):
        write_checkpoint(log, version, {"minReaderVersion": 1, "minWriterVersion": 2}, meta, [("a", version)])
    write_checkpoint(
        log,
        9,
        {"minReaderVersion": 1, "minWriterVersion": 2},
        meta,
        [],
        name=f"{9:020d}.checkpoint.0000000001.0000000002.parquet",
    )
    (log / "_last_checkpoint").write_text(hint)
    names = delta_log.log_names(str(tmp_path), recent=True)
    assert delta_log.commit_versions(names) == list(range(first_listed, 11))
    assert names == sorted(names)
    state = delta_log.table_state(str(tmp_path))
    assert (state.version, state.checkpoint, state.txns) == (10, checkpoint, {"a": 10})


def test_active_files_are_the_checkpoint_s_adds_with_the_later_commits_replayed(tmp_path):
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    for start in (0, 10):  # two files, then a checkpoint of them (delta-rs: a real checkpoint's layout)
        write_deltalake(str(tmp_path), pa.table({"id": pa.array(range(start, start + 10), pa.int64())}), mode="append")
    DeltaTable(str(tmp_path)).create_checkpoint()
    write_deltalake(str(tmp_path), pa.table({"id": pa.array(range(20, 25), pa.int64())}), mode="append")
    state = delta_log.table_state(str(tmp_path))
    assert (state.version, state.checkpoint) == (2, 1)
    first, second, third = [
        [uri.rsplit("/", 1)[-1] for uri in DeltaTable(str(tmp_path), version=v).file_uris()] for v in (0, 1, 2)
    ]  # delta-rs writes the files at the table's top level
    assert set(delta_log.active_files(state)) == set(third) and len(third) == 3

    removed = sorted(set(second) - set(first))[0]
    write_commit(
        tmp_path / "_delta_log",
        3,
        {"remove": {"path": removed, "deletionTimestamp": 0, "dataChange": True}},
        {
            "add": {
                "path": "eo-x/new.parquet",
                "size": 7,
                "partitionValues": {},
                "modificationTime": 0,
                "dataChange": True,
            }
        },
    )
    files = delta_log.active_files(delta_log.table_state(str(tmp_path)))
    assert set(files) == (set(third) - {removed}) | {"eo-x/new.parquet"}
    assert files["eo-x/new.parquet"] == {"path": "eo-x/new.parquet", "size": 7, "partitionValues": {}, "stats": None}
