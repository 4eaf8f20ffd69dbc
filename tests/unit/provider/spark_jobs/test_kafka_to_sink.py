"""Start-position reconciliation between a checkpoint and the sink, on checkpoint directories written by hand."""

from __future__ import annotations

import json

import pytest

from exactly_once_provider.spark_jobs import kafka_to_sink
from exactly_once_provider.spark_jobs.batch import BatchCommit, checkpoint_id, checkpoint_positions, wal_offsets

PARTS = {"t": [0, 1]}


def _checkpoint(root, planned: dict[int, dict], committed: list[int]):
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    (root / "metadata").write_text(json.dumps({"id": "query-1"}) + "\n")
    for batch, offsets in planned.items():
        (root / "offsets" / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{json.dumps(offsets)}\n')
    for batch in committed:
        (root / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    return root


def test_wal_and_positions(tmp_path):
    cp = _checkpoint(tmp_path / "cp", {0: {"t": {"0": 5, "1": 7}}, 1: {"t": {"0": 9, "1": 7}}}, [0])
    assert checkpoint_id(str(cp)) == "query-1"
    assert wal_offsets(f"file://{cp}", 1) == {"t": {0: 9, 1: 7}}
    assert checkpoint_positions(str(cp)) == ({"t": {0: 5, 1: 7}}, {"t": {0: 9, 1: 7}})
    assert checkpoint_positions(str(tmp_path / "missing")) == (None, None)


def test_checkpoint_matching_the_sink_is_kept(tmp_path):
    cp = _checkpoint(tmp_path / "cp", {0: {"t": {"0": 5, "1": 7}}, 1: {"t": {"0": 9, "1": 7}}}, [0])
    # normal restart: the sink holds the end of the last committed batch
    assert kafka_to_sink.reconcile_start(str(cp), {"t": {0: 5, 1: 7}}, PARTS) == "earliest"
    # crash after the sink commit of batch 1, before its checkpoint commit: keep, Spark replays batch 1
    assert kafka_to_sink.reconcile_start(str(cp), {"t": {0: 9, 1: 7}}, PARTS) == "earliest"
    assert cp.exists()


@pytest.mark.parametrize("sink", [{"t": {0: 2, 1: 7}}, {"t": {0: 12, 1: 7}}, None])
def test_checkpoint_behind_ahead_or_without_sink_is_set_aside(tmp_path, sink):
    cp = _checkpoint(tmp_path / "cp", {0: {"t": {"0": 5, "1": 7}}, 1: {"t": {"0": 9, "1": 7}}}, [0])
    start = kafka_to_sink.reconcile_start(str(cp), sink, PARTS)
    assert not cp.exists()
    assert len(list(tmp_path.glob("cp.stale-*"))) == 1
    if sink is None:
        assert start == "earliest"
    else:
        assert json.loads(start) == {"t": {str(p): o for p, o in sink["t"].items()}}


def test_missing_checkpoint_starts_from_the_sink_and_new_partitions_from_earliest(tmp_path):
    start = kafka_to_sink.reconcile_start(str(tmp_path / "none"), {"t": {0: 4}}, {"t": [0, 1], "u": [0]})
    assert json.loads(start) == {"t": {"0": 4, "1": -2}, "u": {"0": -2}}
    assert kafka_to_sink.reconcile_start(str(tmp_path / "none"), None, PARTS) == "earliest"


def test_fresh_checkpoint_with_an_uncommitted_first_batch_is_kept(tmp_path):
    cp = _checkpoint(tmp_path / "cp", {0: {"t": {"0": 5, "1": 7}}}, [])
    assert kafka_to_sink.reconcile_start(str(cp), None, PARTS) == "earliest"
    assert cp.exists()


def test_batch_commit_round_trip_and_covered():
    commit = BatchCommit("p", "c", 3, {"t": {1: 10, 0: 4}}, 12)
    assert BatchCommit.from_json(json.loads(json.dumps(commit.to_json()))) == commit
    assert kafka_to_sink._covered({"t": {0: 4}}, {"t": {0: 4, 1: 1}})
    assert not kafka_to_sink._covered({"t": {0: 5}}, {"t": {0: 4}})


def test_arguments_name_what_is_missing():
    base = ["--pipeline", "p", "--bootstrap-servers", "b:1", "--topics", "t", "--checkpoint", "/c"]
    with pytest.raises(SystemExit):
        kafka_to_sink.parse_args(base + ["--sink", "delta"])
    with pytest.raises(SystemExit):
        kafka_to_sink.parse_args(base + ["--sink", "postgres"])
    assert kafka_to_sink.parse_args(base + ["--sink", "files", "--path", "/x"]).trigger == "available-now"
