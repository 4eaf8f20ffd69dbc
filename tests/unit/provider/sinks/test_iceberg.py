"""The Iceberg sink's fence in the snapshot summary, without a catalog (the commits themselves are in integration)."""

from __future__ import annotations

import pytest

from exactly_once_provider.sinks import iceberg
from exactly_once_provider.sinks.base import UNCHECKED, BatchCommit, StaleBatchError, open_sink
from exactly_once_provider.sinks.iceberg import (
    commit_from_summary,
    newest_commit,
    plan_commit,
    summary_properties,
)
from exactly_once_provider.spark_jobs.stream_spec import Route, StreamSpec

OFFSETS = {"orders": {0: 12, 1: 7}, "refunds": {0: 3}}


def _commit(checkpoint: str = "c1", batch: int = 4, offsets=None, rows: int = 22) -> BatchCommit:
    return BatchCommit("p1", checkpoint, batch, offsets or OFFSETS, rows)


def test_the_summary_carries_the_whole_commit_as_strings_and_reads_back():
    summary = summary_properties(_commit())
    assert summary == {
        "eo.pipeline": "p1",
        "eo.checkpoint-id": "c1",
        "eo.batch-id": "4",
        "eo.offsets": '{"orders":{"0":12,"1":7},"refunds":{"0":3}}',
        "eo.rows-total": "22",
    }
    assert all(isinstance(v, str) for v in summary.values())  # Iceberg summary values are strings
    # a real summary holds Iceberg's own figures beside the fence
    assert commit_from_summary({**summary, "added-records": "5", "operation": "append"}) == _commit()


def test_a_snapshot_of_another_writer_carries_no_commit():
    assert commit_from_summary({"operation": "replace", "added-data-files": "1"}) is None


def test_the_newest_commit_steps_over_other_writers_snapshots_back_to_the_pipelines():
    ours = summary_properties(_commit(batch=4))
    older = summary_properties(_commit(batch=3))
    compaction = {"operation": "replace"}
    assert newest_commit(iter([compaction, compaction, ours, older]), "p1", "ns.t") == _commit(batch=4)
    assert newest_commit(iter([compaction]), "p1", "ns.t") is None
    assert newest_commit(iter([]), "p1", "ns.t") is None


def test_the_newest_commit_reads_no_further_than_the_pipelines_newest_snapshot():
    def summaries():
        yield summary_properties(_commit(batch=9))
        raise AssertionError("read past the newest commit")

    assert newest_commit(summaries(), "p1", "ns.t").batch_id == 9


def test_a_table_of_another_pipeline_is_refused():
    other = summary_properties(BatchCommit("p2", "c", 0, {}, 0))
    with pytest.raises(ValueError, match="holds pipeline 'p2', not 'p1'"):
        newest_commit(iter([other]), "p1", "ns.t")


@pytest.mark.parametrize(
    "found, commit, expected, planned",
    [
        (None, _commit(batch=0), None, True),  # the first batch
        (_commit(batch=3), _commit(batch=4), _commit(batch=3), True),  # the next batch on the one it read
        (_commit(batch=4), _commit(batch=4), _commit(batch=3), False),  # a replay: already in the table
        (_commit(batch=6), _commit(batch=4), _commit(batch=3), False),  # an older batch of the same checkpoint
        (_commit(batch=3), _commit("c2", 0), UNCHECKED, True),  # unplanned (tools): no predecessor check
    ],
)
def test_a_batch_is_committed_or_skipped(found, commit, expected, planned):
    assert plan_commit(found, commit, expected) is planned


@pytest.mark.parametrize(
    "found, expected",
    [
        (_commit("c9", 5), _commit("c1", 2)),  # another driver committed since the batch was planned
        (_commit("c2", 0), _commit("c1", 2)),  # a zombie of checkpoint c1 after a new checkpoint took over
        (_commit("c1", 2), None),  # planned on an empty table that is no longer empty
        (None, _commit("c1", 2)),  # planned on a commit the table does not hold
    ],
)
def test_a_batch_planned_on_another_commit_is_refused(found, expected):
    with pytest.raises(StaleBatchError, match="another driver commits this pipeline"):
        plan_commit(found, _commit("c1", 3), expected)


def test_the_catalog_uri_keeps_the_connections_tls_settings_and_quotes_the_password():
    uri = iceberg._sqlalchemy_uri(
        {
            "host": "db",
            "port": 5433,
            "dbname": "lake",
            "user": "eo",
            "password": "p@ss/w:rd",
            "sslmode": "verify-full",
            "sslrootcert": "/ca.pem",
            "connect_timeout": None,
        }
    )
    from sqlalchemy.engine import make_url

    url = make_url(uri)
    assert (url.drivername, url.host, url.port, url.database, url.username) == (
        "postgresql+psycopg2",
        "db",
        5433,
        "lake",
        "eo",
    )
    assert url.password == "p@ss/w:rd"
    assert dict(url.query) == {"sslmode": "verify-full", "sslrootcert": "/ca.pem"}


def test_open_sink_maps_iceberg_and_reads_nothing_when_opened():
    sink = open_sink("iceberg", "lake.orders", "p1", iceberg_catalog=lambda: pytest.fail("read at open"))
    assert (sink.kind, sink.identifier, sink.pipeline) == ("iceberg", "lake.orders", "p1")
    with pytest.raises(ValueError, match="'namespace.table'"):
        open_sink("iceberg", "orders", "p1")


def test_a_reader_opened_with_postgres_arguments_reads_the_sql_catalog_in_that_database():
    asked = []
    sink = open_sink("iceberg", "lake.orders", "p1", postgres_connect=lambda: asked.append(1) or {"host": "db"})
    assert asked == []  # resolved when the catalog is first used
    assert sink._catalog_settings() == {"type": "sql", "name": "eo", "postgres": {"host": "db"}} and asked == [1]


def test_a_sink_without_a_catalog_says_which_setting_is_missing(monkeypatch):
    monkeypatch.setattr(iceberg, "_registered", None)
    with pytest.raises(ValueError, match="has no catalog: name its connection"):
        iceberg.IcebergSink("lake.orders", "p1").committed()


def test_only_a_sql_catalog_is_supported_so_far():
    with pytest.raises(ValueError, match="'rest' is not supported yet"):
        iceberg.open_catalog({"type": "rest", "uri": "http://catalog"})


def _spec(**kwargs) -> StreamSpec:
    base = dict(pipeline="p1", topics=("t",), checkpoint="/cp", sink="iceberg", path="/lake/o", table="lake.o")
    return StreamSpec(**{**base, **kwargs})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"table": None}, "needs sink_table"),
        ({"table": "orders"}, "'namespace.table'"),
        ({"path": None}, "and sink_path"),
        ({"mode": "current", "delivery": "at-least-once"}, "mode='current' merges by source version"),
        ({"on_bad_record": "dead_letter"}, "no dead-letter store yet"),
        (
            {"topics": (), "path": None, "table": None, "routes": (Route(("t",), "/cp1", "/lake/o"),)},
            "takes no streams",
        ),
    ],
)
def test_the_stream_spec_refuses_what_the_iceberg_sink_does_not_do_yet(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _spec(**kwargs).validate()


def test_the_stream_spec_takes_every_iceberg_mode():
    assert _spec().validate().table == "lake.o"
    assert _spec(mode="window").validate().mode == "window"
    assert _spec(mode="cdc").validate().mode == "cdc"
    assert _spec(mode="current").validate().path == "/lake/o"  # the Delta full load the table is built from


def test_window_mode_carries_every_window_in_the_summary():
    windows = {"settle/t/d1": {"version": 2, "rows": 6}, "settle/t/d2": {"version": 1, "rows": 4}}
    commit = BatchCommit("p1", "c1", 3, OFFSETS, 10, {"windows": windows})
    summary = summary_properties(commit)
    assert summary["eo.windows"] == '{"settle/t/d1":{"rows":6,"version":2},"settle/t/d2":{"rows":4,"version":1}}'
    assert commit_from_summary(summary) == commit
    assert "eo.windows" not in summary_properties(_commit())  # append mode: no windows


def test_a_mode_the_sink_does_not_write_is_refused():
    with pytest.raises(ValueError, match="append, window, cdc, current, not 'upsert'"):
        iceberg.IcebergSink("lake.o", "p1", mode="upsert")
    with pytest.raises(ValueError, match="needs the source table's key columns"):
        iceberg.IcebergSink("lake.o", "p1", mode="current")


def test_the_summary_carries_the_current_tables_schema_state():
    state = {"load_id": "L1", "columns": [{"name": "id"}], "fills": [], "applied": 41}
    commit = BatchCommit("p1", "c1", 2, OFFSETS, 9, {"schema": state})
    summary = summary_properties(commit)
    assert summary["eo.schema"] == '{"applied":41,"columns":[{"name":"id"}],"fills":[],"load_id":"L1"}'
    assert commit_from_summary(summary) == commit
