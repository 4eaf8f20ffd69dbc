"""Start-position reconciliation between a checkpoint and the sink, on checkpoint directories written by hand."""

from __future__ import annotations

import json

import pytest

from exactly_once_provider.sinks.base import UNCHECKED, BatchCommit, StaleBatchError, require_predecessor
from exactly_once_provider.spark_jobs import kafka_to_sink
from exactly_once_provider.spark_jobs.batch import checkpoint_id, checkpoint_positions, wal_offsets

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


def test_checkpoint_planned_for_other_topics_is_set_aside_even_before_the_first_sink_commit(tmp_path):
    # e.g. two tables' streams swapped, then corrected with the same checkpoint directories
    cp = _checkpoint(tmp_path / "cp", {0: {"u": {"0": 5}}}, [])
    assert kafka_to_sink.reconcile_start(str(cp), None, PARTS) == "earliest"
    assert not cp.exists() and len(list(tmp_path.glob("cp.stale-*"))) == 1


def test_batch_commit_round_trip_and_covered():
    commit = BatchCommit("p", "c", 3, {"t": {1: 10, 0: 4}}, 12)
    assert BatchCommit.from_json(json.loads(json.dumps(commit.to_json()))) == commit
    assert kafka_to_sink._covered({"t": {0: 4}}, {"t": {0: 4, 1: 1}})
    assert not kafka_to_sink._covered({"t": {0: 5}}, {"t": {0: 4}})


def test_arguments_name_what_is_missing():
    base = ["--pipeline", "p", "--secrets-file", "/s.json", "--topics", "t", "--checkpoint", "/c"]
    with pytest.raises(SystemExit):
        kafka_to_sink.parse_args(base + ["--sink", "delta"])
    with pytest.raises(SystemExit):
        kafka_to_sink.parse_args(base + ["--sink", "postgres"])
    assert kafka_to_sink.parse_args(base + ["--sink", "files", "--path", "/x"]).trigger == "available-now"


class _RecordingSink:
    kind = "fake"

    def __init__(self):
        self.calls = []

    def committed(self):
        return None

    def commit(self, df, commit, expected, schema=None):
        self.calls.append((commit, expected))
        return True


class _Frame:
    sparkSession = None


def test_process_batch_commits_only_on_top_of_the_state_it_planned_the_batch_on(tmp_path):
    cp = _checkpoint(tmp_path / "cp", {0: {"t": {"0": 5, "1": 7}}}, [])
    sink = _RecordingSink()
    kafka_to_sink.process_batch(sink, "p", str(cp), _Frame(), 0, exactly_once=True)
    [(commit, expected)] = sink.calls
    assert (commit.checkpoint_id, commit.batch_id, commit.offsets) == ("query-1", 0, {"t": {0: 5, 1: 7}})
    assert expected is None  # planned on an empty sink: a sink that holds anything by then refuses it


def test_require_predecessor_compares_the_batch_identity_not_the_row_count():
    planned = BatchCommit("p", "c1", 3, {"t": {0: 9}}, rows_total=10)
    same = BatchCommit("p", "c1", 3, {"t": {0: 9}}, rows_total=999)
    require_predecessor(same, planned, BatchCommit("p", "c1", 4, {"t": {0: 12}}), "fake")
    require_predecessor(BatchCommit("p", "c9", 0, {"t": {0: 1}}), UNCHECKED, BatchCommit("p", "c1", 4, {}), "fake")
    for moved in (
        None,
        BatchCommit("p", "c2", 3, {"t": {0: 9}}),
        BatchCommit("p", "c1", 4, {"t": {0: 9}}),
        BatchCommit("p", "c1", 3, {"t": {0: 10}}),
    ):
        with pytest.raises(StaleBatchError, match="another driver commits this pipeline"):
            require_predecessor(moved, planned, BatchCommit("p", "c1", 4, {"t": {0: 12}}), "fake")


def test_a_checkpoint_on_s3_is_set_aside_by_copy_and_delete(tmp_path, monkeypatch):
    """No rename on object stores: the objects are copied to the .stale-<time> sibling, then deleted (the same
    storage calls as on S3, run on a local storage here)."""
    from exactly_once_provider import storage as storage_module
    from exactly_once_provider.storage.local import LocalStorage

    cp = _checkpoint(tmp_path / "cp", {0: {"t": {"0": 5, "1": 7}}}, [0])
    monkeypatch.setattr(storage_module, "is_s3", lambda location: True)
    monkeypatch.setattr(kafka_to_sink, "checkpoint_storage", LocalStorage)
    kafka_to_sink._set_aside(str(cp), f"{cp}.stale-1")
    aside = LocalStorage(f"{cp}.stale-1")
    assert aside.list() == ["commits/0", "metadata", "offsets/0"] and aside.read("metadata") == b'{"id": "query-1"}\n'
    assert LocalStorage(cp).list() == []


def test_routes_travel_as_json_and_on_the_command_line():
    from exactly_once_provider.spark_jobs.stream_spec import Route, StreamSpec

    spec = StreamSpec(
        pipeline="p",
        topics=(),
        checkpoint="",
        sink="delta",
        mode="current",
        routes=(Route(("a",), "/cp/a", "/t/a"), Route(("b", "c"), "/cp/b", "/t/b")),
    ).validate()
    assert StreamSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    assert [(q.topics, q.checkpoint, q.path, q.routes) for q in spec.queries()] == [
        (("a",), "/cp/a", "/t/a", ()),
        (("b", "c"), "/cp/b", "/t/b", ()),
    ]
    routes = json.dumps(
        [
            {"topics": ["a"], "checkpoint": "/cp/a", "path": "/t/a"},
            {"topics": "b,c", "checkpoint": "/cp/b", "path": "/t/b"},
        ]
    )
    parsed = kafka_to_sink.parse_args(
        ["--pipeline", "p", "--secrets-file", "s", "--sink", "delta", "--mode", "current", "--routes", routes]
    )
    assert parsed.routes == spec.routes
    one = StreamSpec(pipeline="p", topics=("a",), checkpoint="/cp", sink="delta", path="/t")
    assert "routes" not in one.to_json() and one.queries() == [one]  # a one-table request is as it was


def test_the_key_of_a_cdc_record_may_name_several_fields():
    assert kafka_to_sink.key_paths("pk") == ("pk",)
    assert kafka_to_sink.key_paths("source.schema, source.table,pk") == ("source.schema", "source.table", "pk")


SHARED_PARTS = {"a": [0], "b": [0], "c": [0]}
SHARED_LOG = {0: {"a": {"0": 5}, "b": {"0": 3}, "c": {"0": 0}}, 1: {"a": {"0": 9}, "b": {"0": 3}, "c": {"0": 0}}}


@pytest.mark.parametrize(
    "a, b",
    [
        ({"a": {0: 5}}, {"b": {0: 3}}),  # normal restart
        ({"a": {0: 9}}, {"b": {0: 3}}),  # a committed batch 1 before the crash; b was untouched by it
    ],
)
def test_a_shared_checkpoint_is_kept_when_every_sink_holds_its_part_of_it(tmp_path, a, b):
    """c never committed (its topic is empty: offset 0 everywhere) and agrees as well."""
    cp = _checkpoint(tmp_path / "cp", SHARED_LOG, [0])
    sinks = [(("a",), a), (("b",), b), (("c",), None)]
    assert kafka_to_sink.reconcile_shared_start(str(cp), sinks, SHARED_PARTS) == "earliest"
    assert cp.exists()


@pytest.mark.parametrize(
    "b, parts",
    [
        ({"b": {0: 2}}, SHARED_PARTS),  # b's sink is behind the checkpoint
        (None, SHARED_PARTS),  # b's sink lost its commits (a new table at that path)
        ({"b": {0: 3}}, {"a": [0], "b": [0]}),  # the checkpoint holds a topic no table reads any more
    ],
)
def test_a_shared_checkpoint_any_sink_disagrees_with_is_set_aside_and_each_sink_starts_from_its_own(tmp_path, b, parts):
    cp = _checkpoint(tmp_path / "cp", SHARED_LOG, [0])
    sinks = [(("a",), {"a": {0: 9}}), (("b",), b)] + ([(("c",), None)] if "c" in parts else [])
    start = json.loads(kafka_to_sink.reconcile_shared_start(str(cp), sinks, parts))
    assert not cp.exists() and len(list(tmp_path.glob("cp.stale-*"))) == 1
    assert start["a"] == {"0": 9} and start["b"] == {"0": b["b"][0] if b else -2}
    assert start.get("c", {"0": -2}) == {"0": -2}


class _Part:
    def __init__(self, topics=None):
        self.topics = topics
        self.sparkSession = None

    def filter(self, condition):
        return _Part(condition)

    def persist(self):
        return self

    def unpersist(self):
        return self


def test_a_shared_batch_commits_only_the_tables_it_touched_each_with_its_own_offsets(tmp_path, monkeypatch):
    from exactly_once_provider.spark_jobs.stream_spec import StreamSpec

    cp = _checkpoint(tmp_path / "cp", SHARED_LOG, [0])
    routes = []
    for topic in "abc":
        spec = StreamSpec(pipeline="p", topics=(topic,), checkpoint=str(cp), sink="delta", path=f"/t/{topic}")
        routes.append((spec, _RecordingSink(), None))
    monkeypatch.setattr("pyspark.sql.functions.col", lambda name: _Column(name))
    kafka_to_sink.process_routes(routes, "p", str(cp), _Part(), 1, exactly_once=True)
    [(commit, _)] = routes[0][1].calls
    assert (commit.batch_id, commit.offsets) == (1, {"a": {0: 9}})
    assert routes[1][1].calls == [] and routes[2][1].calls == []  # untouched by batch 1: no read, no commit
    kafka_to_sink.process_routes(routes, "p", str(cp), _Part(), 0, exactly_once=True)  # batch 0: no known start
    assert [c.offsets for c, _ in routes[1][1].calls] == [{"b": {0: 3}}]
    assert routes[2][1].calls == []  # its topic is empty: nothing to commit


class _Column:
    def __init__(self, name):
        self.name = name

    def isin(self, *values):
        return (self.name, values)
