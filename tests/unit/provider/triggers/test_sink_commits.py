"""The commit trigger announces each new sink commit once, resumes after the last announced one, and the Asset
helper builds a watched Asset the DAG processor can serialise."""

from __future__ import annotations

import asyncio

import pytest

from exactly_once_provider.assets import sink_commits
from exactly_once_provider.sinks.base import BatchCommit
from exactly_once_provider.triggers.sink_commits import STATE_KEY, SinkCommitTrigger


class FakeSink:
    """A sink whose commit marker moves through ``commits`` (one per read; the last one stays)."""

    def __init__(self, commits):
        self.commits, self.reads = list(commits), 0

    def committed(self):
        self.reads += 1
        return self.commits[min(self.reads, len(self.commits)) - 1]


class FakeStore:
    def __init__(self, value=None):
        self.values = {} if value is None else {STATE_KEY: value}

    async def aget(self, key, default=None):
        return self.values.get(key, default)

    async def aset(self, key, value):
        self.values[key] = value


def commit(batch, rows, offset, checkpoint="c1"):
    return BatchCommit("p", checkpoint, batch, {"t": {0: offset, 1: offset // 2}}, rows_total=rows)


def events(monkeypatch, commits, store, count, reads=None):
    sink = FakeSink(commits)
    monkeypatch.setattr("exactly_once_provider.sinks.base.open_sink", lambda *a, **k: sink)
    trigger = SinkCommitTrigger("delta", "/lake/t", "p", poll_interval=0.001)
    trigger.asset_state_store = store

    async def collect():
        out = []
        gen = trigger.run()
        while len(out) < count and sink.reads < (reads or 50):
            try:
                out.append((await asyncio.wait_for(gen.__anext__(), 0.2)).payload)
            except TimeoutError:
                break
        try:  # the triggerer resumes the generator after taking an event: the trigger then stores it
            await asyncio.wait_for(gen.__anext__(), 0.05)
        except (TimeoutError, StopAsyncIteration):
            pass
        await gen.aclose()
        return out

    return asyncio.run(collect()), sink


def test_each_new_commit_is_announced_once_with_what_it_added(monkeypatch):
    store = FakeStore()
    got, _ = events(monkeypatch, [None, commit(0, 10, 10), commit(0, 10, 10), commit(1, 25, 30)], store, 3, reads=8)
    assert [(e["batch_id"], e["rows_added"], e["records"], e["first_batch_id"]) for e in got] == [
        (0, 10, 15, None),
        (1, 15, 30, 1),
    ]
    assert got[1]["offsets"] == {"t": {"0": 30, "1": 15}} and got[1]["rows_total"] == 25
    assert store.values[STATE_KEY]["identity"] == ["c1", 1, 25]


def test_a_restart_resumes_after_the_last_announced_commit(monkeypatch):
    store = FakeStore()
    events(monkeypatch, [commit(3, 40, 40)], store, 1)
    again, sink = events(monkeypatch, [commit(3, 40, 40), commit(5, 70, 90)], store, 2, reads=6)
    assert [(e["batch_id"], e["first_batch_id"], e["rows_added"]) for e in again] == [(5, 4, 30)]
    assert sink.reads >= 2


def test_a_new_checkpoint_is_announced_even_at_the_same_batch_id(monkeypatch):
    store = FakeStore()
    events(monkeypatch, [commit(0, 10, 10)], store, 1)
    again, _ = events(monkeypatch, [commit(0, 12, 12, checkpoint="c2")], store, 1)
    assert [(e["checkpoint"], e["first_batch_id"]) for e in again] == [("c2", None)]


def test_sink_commits_builds_a_watched_asset_and_refuses_bad_arguments():
    asset = sink_commits("delta", "s3a://lake/orders", "shop-apply", name="shop.orders", poll_interval=2)
    assert (asset.name, asset.uri) == ("shop.orders", "s3://lake/orders")
    (watcher,) = asset.watchers
    classpath, kwargs = watcher.trigger.serialize()
    assert classpath == "exactly_once_provider.triggers.sink_commits.SinkCommitTrigger"
    assert kwargs["sink_location"] == "s3a://lake/orders" and kwargs["poll_interval"] == 2
    assert sink_commits("postgres", "public.orders", "p").name == "p.public.orders"
    with pytest.raises(ValueError, match="sink='kafka'"):
        sink_commits("kafka", "/x", "p")
    with pytest.raises(ValueError, match="positive"):
        sink_commits("delta", "/x", "p", poll_interval=0)


def test_an_iceberg_tables_asset_is_named_after_the_pipeline_and_table():
    asset = sink_commits("iceberg", "lake.orders", "shop-apply", postgres_conn_id="lake_catalog")
    assert asset.name == "shop-apply.lake.orders"
    _, kwargs = asset.watchers[0].trigger.serialize()
    assert (kwargs["sink"], kwargs["sink_location"], kwargs["postgres_conn_id"]) == (
        "iceberg",
        "lake.orders",
        "lake_catalog",
    )


def test_with_the_kafka_connection_an_event_says_where_the_source_is_and_a_kafka_error_does_not_hide_it(monkeypatch):
    monkeypatch.setattr("exactly_once_provider.hooks.kafka_client.kafka_client_config", lambda conn_id: {"c": conn_id})
    answers = [{"source": {"file": "binlog.000002", "pos": 77}, "freshness_s": 1.5}, RuntimeError("no broker")]

    def source_state(config, offsets):
        assert config == {"c": "kafka_eo"} and offsets == {"t": {0: offsets["t"][0], 1: offsets["t"][1]}}
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr("exactly_once_provider.kafka.change_times.source_state", source_state)
    sink = FakeSink([commit(0, 10, 10), commit(1, 20, 20)])
    monkeypatch.setattr("exactly_once_provider.sinks.base.open_sink", lambda *a, **k: sink)
    trigger = SinkCommitTrigger("delta", "/lake/t", "p", poll_interval=0.001, kafka_config_id="kafka_eo")
    trigger.asset_state_store = FakeStore()
    assert trigger.serialize()[1]["kafka_config_id"] == "kafka_eo"

    async def two():
        gen = trigger.run()
        got = [(await gen.__anext__()).payload, (await gen.__anext__()).payload]
        await gen.aclose()
        return got

    first, second = asyncio.run(two())
    assert (first["source"], first["freshness_s"]) == ({"file": "binlog.000002", "pos": 77}, 1.5)
    assert second["source"] is None and second["source_error"] == "RuntimeError: no broker"
    assert second["batch_id"] == 1 and second["rows_added"] == 10
