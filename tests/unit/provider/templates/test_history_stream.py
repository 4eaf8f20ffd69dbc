"""The history -> stream template: both modes' tasks and schedules, and the reconciliation's scope per run."""

from __future__ import annotations

import json
from datetime import timedelta
from types import SimpleNamespace

import jinja2
import pendulum
import pytest

from exactly_once_provider.templates.history_stream import CONTINUOUS_COMMIT_INTERVAL_MS, history_stream_dag


def _dag(**overrides):
    kwargs = dict(
        dag_id="t_hs",
        schema="shop",
        table="orders",
        key_column="id",
        pipeline="p",
        table_path="/data/t",
        checkpoint_location="/data/c",
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    )
    return history_stream_dag(**{**kwargs, **overrides})


def test_scheduled_mode_merges_into_the_table_and_reconciles_it():
    dag = _dag()
    assert [t.task_id for t in dag.topological_sort()][-4:] == ["lag_gate", "capture", "apply", "reconcile"]
    apply, reconcile = dag.get_task("apply"), dag.get_task("reconcile")
    assert (apply.mode, apply.sink_path, apply.trigger) == ("current", "/data/t", "available-now")
    assert (reconcile.sink_path, reconcile.sink_deleted_column) == ("/data/t", "_eo_deleted")
    assert {o.uri for t in dag.tasks for o in t.outlets} == {"file:///data/t"}
    assert set(dag.params) == {"full_reload", "resnapshot", "full_reconcile"}


def test_continuous_mode_runs_capture_and_stream_side_by_side_for_run_for():
    dag = _dag(mode="continuous", run_for=timedelta(minutes=30), stream_interval="2 seconds")
    assert type(dag.timetable).__name__ == "ContinuousTimetable" and dag.max_active_runs == 1
    capture, apply = dag.get_task("capture"), dag.get_task("apply")
    assert (capture.mode, capture.max_runtime) == ("continuous", 1800)
    assert (apply.trigger, apply.interval, apply.max_runtime, apply.mode) == (
        "processing-time",
        "2 seconds",
        1800,
        "current",
    )
    assert capture.upstream_task_ids == apply.upstream_task_ids == {"full_load", "retention_guard"}
    assert "reconcile" not in dag.task_ids
    # Freshness: the continuous capture commits its Kafka transaction several times per trigger interval.
    assert capture.commit_interval_ms == CONTINUOUS_COMMIT_INTERVAL_MS < 1000
    assert _dag(mode="continuous", capture_commit_interval_ms=500).get_task("capture").commit_interval_ms == 500
    assert _dag().get_task("capture").commit_interval_ms == 1000  # scheduled: the capture's own default
    with pytest.raises(ValueError, match="mode="):
        _dag(mode="streaming")


def _scope(task, run_after: str, loaded: tuple[str, ...] = (), tables: tuple[str, ...] | None = None, **params) -> str:
    """Render the reconcile's scope; ``loaded``: the full-load tasks that ran in this run (only they have an XCom);
    ``tables``: the tables a full load of several tables loaded in this run (its XCom names them)."""
    xcom = {"chunks": 1} if tables is None else {"tables": {t: {"chunks": 1} for t in tables}, "skipped": []}
    context = {
        "task": task,
        "params": {"full_reload": False, "full_reconcile": False, **params},
        "ti": SimpleNamespace(xcom_pull=lambda task_ids: xcom if task_ids in loaded else None),
        "dag_run": SimpleNamespace(run_after=pendulum.parse(run_after), data_interval_start=None),
    }
    return jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(task.scope).render(**context)


def _loaded(task, tables: tuple[str, ...]) -> list[str]:
    """Render the tables a several-table reconciliation compares in full: those the full load loaded in this run."""
    xcom = {"tables": {t: {"chunks": 1} for t in tables}, "skipped": []} if tables else None
    ti = SimpleNamespace(xcom_pull=lambda task_ids: xcom if task_ids == "full_load" else None)
    return json.loads(jinja2.Environment().from_string(task.full_scope_tables).render(ti=ti))


def test_increments_reconcile_the_changed_keys_and_the_whole_table_on_reloads_params_and_the_nightly_hour():
    task = _dag(every_minutes=5, full_reconcile_hour=0).get_task("reconcile")
    assert _scope(task, "2026-11-25T10:00:00Z") == "changed"
    assert _scope(task, "2026-11-25T00:03:00Z") == "full"  # the increment in the full-reconciliation hour
    assert _scope(task, "2026-11-25T00:05:00Z") == "changed"
    assert _scope(task, "2026-11-25T10:00:00Z", loaded=("full_load",)) == "full"
    assert _scope(task, "2026-11-25T10:00:00Z", full_reconcile=True) == "full"
    assert _scope(task, "2026-11-25T10:00:00Z", full_reload=True) == "full"
    never = _dag(full_reconcile_hour=None).get_task("reconcile")
    assert _scope(never, "2026-11-25T00:01:00Z") == "changed"


def test_a_table_and_checkpoint_on_s3_reach_every_task_with_the_aws_connection():
    dag = _dag(
        table_path="s3a://lake/orders",
        checkpoint_location="s3://lake/_checkpoints/orders",
        staging_path="/stage/orders",
        aws_conn_id="aws_lake",
    )
    full_load, apply = dag.get_task("full_load"), dag.get_task("apply")
    assert (full_load.sink_path, full_load.staging_path) == ("s3a://lake/orders", "/stage/orders")
    assert (apply.sink_path, apply.checkpoint_location) == ("s3a://lake/orders", "s3://lake/_checkpoints/orders")
    assert dag.get_task("capture").full_load_paths == {"shop.orders": "s3a://lake/orders"}
    readers = ("full_load", "capture", "apply", "lag_gate", "reconcile")
    assert {t: dag.get_task(t).aws_conn_id for t in readers} == dict.fromkeys(readers, "aws_lake")
    # the Asset names the object as OpenLineage and the Amazon provider do: s3://, whatever Spark calls it
    assert {o.uri for t in dag.tasks for o in t.outlets} == {"s3://lake/orders"}


def test_a_table_on_s3_stages_its_full_load_next_to_it_on_the_same_store():
    dag = _dag(table_path="s3://lake/orders", aws_conn_id="aws_lake")
    full_load = dag.get_task("full_load")
    assert full_load.staging_path is None and full_load.aws_conn_id == "aws_lake"
    assert full_load._staging_location("orders") == "s3://lake/orders._eo_full_load"
    assert (
        _dag(table_path="/data/t", staging_path="s3://lake/stage").get_task("full_load").staging_path
        == "s3://lake/stage"
    )


def _tables_dag(**overrides):
    return _dag(
        **{
            "table": None,
            "tables": ["orders", "lines", "accounts"],
            "key_column": {"lines": ["a", "b"]},
            "table_path": "/data/{table}",
            "checkpoint_location": "/data/cp/{table}",
            **overrides,
        }
    )


def test_several_tables_load_each_capture_once_apply_in_one_application_and_reconcile_each():
    dag = _tables_dag()
    names = ("orders", "lines", "accounts")
    capture, apply = dag.get_task("capture"), dag.get_task("apply")
    assert capture.tables == [f"shop.{n}" for n in names]
    assert capture.full_load_paths == {f"shop.{n}": f"/data/{n}" for n in names}
    assert apply.topics is None and apply.sink_path is None and apply.mode == "current"
    assert apply.streams == [{"topics": [f"p.shop.{n}"], "sink_path": f"/data/{n}"} for n in names]
    assert apply.checkpoint_location == "/data/cp/_eo_all_tables"  # ONE query of all the tables
    gate, reconcile = dag.get_task("lag_gate"), dag.get_task("reconcile")  # ONE of each for all the tables
    assert (gate.topics, gate.sink_location) == ([f"p.shop.{n}" for n in names], [f"/data/{n}" for n in names])
    assert gate.downstream_task_ids == {"capture"} and reconcile.upstream_task_ids == {"apply"}
    assert [(t["table"], t["sink_path"], t["name"]) for t in reconcile.tables] == [
        (f"shop.{n}", f"/data/{n}", f"p.{n}") for n in names
    ]
    assert [t["key_column"] for t in reconcile.tables] == [None, ["a", "b"], None]  # None: the primary key
    assert [v.table for v in reconcile.table_views()] == [f"shop.{n}" for n in names]
    assert {o.uri for t in dag.tasks for o in t.outlets} == {f"file:///data/{n}" for n in names}
    full_load = dag.get_task("full_load")  # ONE Spark application loads the tables
    assert (full_load.tables, full_load.table, full_load.sink_path) == (list(names), None, "/data/{table}")
    assert not any(t.startswith(("full_load_", "reconcile_", "lag_gate_")) for t in dag.task_ids)
    assert _scope(reconcile, "2026-11-25T10:00:00Z") == "changed"
    assert _scope(reconcile, "2026-11-25T00:03:00Z") == "full"  # the nightly hour: every table
    # The tables the full load loaded in this run are compared in full, the others by scope.
    assert _loaded(reconcile, ()) == [] and _loaded(reconcile, ("lines",)) == ["lines"]
    continuous = _tables_dag(mode="continuous")
    assert continuous.get_task("apply").upstream_task_ids == {"full_load", "retention_guard"}


def test_a_postgres_current_table_is_applied_after_the_delta_one_and_reconciled_on_its_own():
    dag = _dag(postgres_table="analytics.orders_current")
    apply = dag.get_task("apply_postgres")
    assert (apply.sink, apply.mode, apply.sink_table, apply.sink_path) == (
        "postgres",
        "current",
        "analytics.orders_current",
        "/data/t",
    )  # built from the Delta full load
    assert (apply.checkpoint_location, apply.pipeline) == ("/data/c_postgres", "p-apply-postgres")
    assert apply.upstream_task_ids == {"apply"}
    assert apply._stream_spec().path == "/data/t"
    reconcile = dag.get_task("reconcile_postgres")
    assert (
        reconcile.sink,
        reconcile.sink_table,
        reconcile.sink_deleted_column,
        reconcile.sink_pipeline,
        reconcile.name,
    ) == ("postgres", "analytics.orders_current", "_eo_deleted", "p-apply-postgres", "p.postgres")
    assert reconcile.upstream_task_ids == {"apply_postgres"}
    continuous = _dag(postgres_table="orders_current", mode="continuous").get_task("apply_postgres")
    assert continuous.upstream_task_ids == {"full_load", "retention_guard"} and continuous.trigger == "processing-time"
    several = _tables_dag(postgres_table="pg_{table}").get_task("apply_postgres")
    assert several.streams[1] == {
        "topics": ["p.shop.lines"],
        "sink_path": "/data/lines",
        "sink_table": "pg_lines",
    }
    assert several.checkpoint_location == "/data/cp/_eo_all_tables_postgres"
    assert [r.path for r in several._stream_spec().routes] == ["/data/orders", "/data/lines", "/data/accounts"]
    assert "apply_postgres" not in _dag().task_ids


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"postgres_table": "pg_orders"}, "postgres_table must name each table"),
        ({"table_path": "/data/t"}, "placeholder"),
        ({"tables": ["orders", "_eo_all_tables"]}, "names the apply's checkpoint of all tables"),
        ({"table": "orders"}, "not both"),
        ({"tables": []}, "not both"),
        ({"tables": "orders"}, "not both"),
        ({"tables": ["orders", "orders"]}, "names a table twice"),
    ],
)
def test_several_tables_need_a_location_each(overrides, message):
    with pytest.raises(ValueError, match=message):
        _tables_dag(**overrides)


def test_a_continuous_run_restarts_a_dead_task_in_seconds_and_backs_off_while_it_keeps_failing():
    from datetime import timedelta

    for task in ("capture", "apply"):
        continuous = _dag(mode="continuous").get_task(task)
        assert (continuous.retries, continuous.retry_delay, continuous.retry_exponential_backoff) == (
            20,
            timedelta(seconds=2),
            True,
        )
        assert continuous.max_retry_delay == timedelta(minutes=2)
        scheduled = _dag().get_task(task)
        assert (scheduled.retries, scheduled.retry_delay, scheduled.retry_exponential_backoff) == (
            2,
            timedelta(minutes=1),
            False,
        )
    mine = _dag(mode="continuous", retries=3, retry_delay=timedelta(minutes=5)).get_task("apply")
    assert (mine.retries, mine.retry_delay, mine.max_retry_delay) == (3, timedelta(minutes=5), timedelta(minutes=5))


def test_resnapshot_loads_only_the_named_tables_and_a_name_the_dag_does_not_follow_fails(monkeypatch):
    from exactly_once_provider.full_load import handoff

    monkeypatch.setattr(handoff, "has_full_load", lambda path: True)  # every table holds a full load
    dag = _tables_dag()
    choose = dag.get_task("choose_load").python_callable
    assert choose(params={"full_reload": False, "resnapshot": []}) == "retention_guard"
    assert choose(params={"full_reload": False, "resnapshot": ["lines"]}) == ["full_load", "retention_guard"]
    assert choose(params={"full_reload": True, "resnapshot": []}) == ["full_load"]
    with pytest.raises(ValueError, match=r"resnapshot names \['shop'\]"):
        choose(params={"full_reload": False, "resnapshot": ["shop"]})
    assert dag.get_task("full_load").reload_tables == "{{ params.resnapshot | tojson }}"
    assert dag.params["resnapshot"] == []
    assert _loaded(dag.get_task("reconcile"), ("lines",)) == ["lines"]


def _fake_preflight(monkeypatch, existing: list[str] | dict[str, list[str]]) -> list[str]:
    """Stand in for the server, storage, Kafka and PostgreSQL checks of the preflight; return the checked tables."""
    from exactly_once_provider import connections
    from exactly_once_provider.hooks import kafka_client
    from exactly_once_provider.kafka import topics
    from exactly_once_provider.storage import preflight as storage_preflight
    from exactly_once_provider.templates import history_stream

    checked = []

    class Hook:
        def __init__(self, conn_id):
            pass

        def base_tables(self, schema):
            return existing[schema] if isinstance(existing, dict) else existing

        def preflight(self, schema, table):
            checked.append(table if schema == "shop" else f"{schema}.{table}")
            server = SimpleNamespace(version_string="11.8.3-MariaDB")
            return SimpleNamespace(server=server, key=SimpleNamespace(columns=("id",)), estimated_rows=10)

    monkeypatch.setattr(history_stream, "MySqlSourceHook", Hook)
    monkeypatch.setattr(storage_preflight, "preflight_locations", lambda locations, s3: [])
    monkeypatch.setattr(kafka_client, "kafka_client_config", lambda conn_id: {})
    monkeypatch.setattr(connections, "check_kafka_access", lambda config, conn_id: None)
    monkeypatch.setattr(topics, "partitions_of", lambda admin, names: {})
    monkeypatch.setattr(connections, "postgres_connection", lambda conn_id: SimpleNamespace(close=lambda: None))
    return checked


def test_tables_by_pattern_are_resolved_at_every_run_and_each_task_takes_them_from_the_preflight(monkeypatch):
    from airflow.sdk.definitions.xcom_arg import XComArg

    from exactly_once_provider.full_load import handoff

    dag = _tables_dag(tables=["orders*", "lines"], exclude_tables=["orders_tmp"], postgres_table="pg_{table}")
    checked = _fake_preflight(monkeypatch, ["lines", "orders", "orders_2026", "orders_tmp", "users"])
    out = {}
    found = dag.get_task("preflight").python_callable(
        ti=SimpleNamespace(xcom_push=lambda key, value: out.update({key: value}))
    )
    assert out["tables"] == checked == list(found) == ["lines", "orders", "orders_2026"]
    assert out["full_load_paths"] == {f"shop.{n}": f"/data/{n}" for n in out["tables"]}
    assert out["capture_tables"] == ["shop.lines", "shop.orders", "shop.orders_2026"]
    assert out["streams"][2] == {"topics": ["p.shop.orders_2026"], "sink_path": "/data/orders_2026"}
    assert out["pg_streams"][0] == {"topics": ["p.shop.lines"], "sink_path": "/data/lines", "sink_table": "pg_lines"}
    assert (out["topics"][1], out["paths"][1]) == ("p.shop.orders", "/data/orders")
    assert out["reconciles"][0] == {
        "name": "p.lines",
        "table": "shop.lines",
        "key_column": ["a", "b"],  # the mapping by table applies to matched tables too
        "columns": None,
        "topics": ["p.shop.lines"],
        "full_load_path": "/data/lines",
        "sink_path": "/data/lines",
    }
    assert out["reconciles_postgres"][2]["sink_table"] == "pg_orders_2026"
    assert out["reconciles_postgres"][2]["name"] == "p.orders_2026.postgres"
    # The tasks take their tables from the preflight's XCom (the keys it pushes).
    keys = {
        ("full_load", "tables"): "tables",
        ("capture", "tables"): "capture_tables",
        ("capture", "full_load_paths"): "full_load_paths",
        ("apply", "streams"): "streams",
        ("apply_postgres", "streams"): "pg_streams",
        ("lag_gate", "topics"): "topics",
        ("lag_gate", "sink_location"): "paths",
        ("reconcile", "tables"): "reconciles",
        ("reconcile_postgres", "tables"): "reconciles_postgres",
    }
    for (task_id, field), key in keys.items():
        value = getattr(dag.get_task(task_id), field)
        assert isinstance(value, XComArg) and value.key == key, (task_id, field)
    assert dag.get_task("lag_gate").downstream_task_ids == {"capture"}
    assert dag.get_task("capture").on_drop == "stop" and _tables_dag().get_task("capture").on_drop == "fail"
    assert not any(o for t in dag.tasks for o in getattr(t, "outlets", ()))  # matched tables: lineage per task run
    # choose_load: the tables the preflight matched, e.g. a table created since the last run has no full load.
    monkeypatch.setattr(handoff, "has_full_load", lambda path: path != "/data/orders_2026")
    ti = SimpleNamespace(xcom_pull=lambda task_ids, key: out[key])  # noqa: ARG005
    choose = dag.get_task("choose_load").python_callable
    assert choose(params={"full_reload": False, "resnapshot": []}, ti=ti) == ["full_load", "retention_guard"]
    with pytest.raises(ValueError, match=r"resnapshot names \['users'\]"):
        choose(params={"full_reload": False, "resnapshot": ["users"]}, ti=ti)


def test_tables_of_another_schema_are_followed_by_their_qualified_name(monkeypatch):
    dag = _tables_dag(
        tables=["orders", "billing.inv*"], exclude_tables=["billing.inv_tmp"], postgres_table="pg_{table}"
    )
    checked = _fake_preflight(monkeypatch, {"shop": ["orders", "users"], "billing": ["invoices", "inv_tmp"]})
    out = {}
    dag.get_task("preflight").python_callable(ti=SimpleNamespace(xcom_push=lambda key, value: out.update({key: value})))
    assert out["tables"] == checked == ["orders", "billing.invoices"]
    assert out["capture_tables"] == ["shop.orders", "billing.invoices"]
    assert out["full_load_paths"] == {"shop.orders": "/data/orders", "billing.invoices": "/data/billing.invoices"}
    assert out["streams"][1] == {"topics": ["p.billing.invoices"], "sink_path": "/data/billing.invoices"}
    assert out["pg_streams"][1]["sink_table"] == "pg_billing_invoices"  # not a PostgreSQL schema
    assert (out["reconciles"][1]["table"], out["reconciles"][1]["name"]) == ("billing.invoices", "p.billing.invoices")
    named = _tables_dag(tables=["orders", "billing.invoices"])  # named, not matched: known when the DAG is parsed
    assert named.get_task("capture").tables == ["shop.orders", "billing.invoices"]
    with pytest.raises(ValueError, match="would both write 'pg_a_b_c'"):
        _tables_dag(tables=["a.b_c", "a_b.c"], postgres_table="pg_{table}")


def test_tables_by_pattern_fail_the_preflight_when_nothing_matches(monkeypatch):
    dag = _tables_dag(tables=["sales_*"])
    _fake_preflight(monkeypatch, ["orders"])
    with pytest.raises(ValueError, match=r"pattern\(s\) \['sales_\*'\] match no base table of schema 'shop'"):
        dag.get_task("preflight").python_callable()
    with pytest.raises(ValueError, match="exclude_tables"):
        _dag(exclude_tables=["x"])  # beside one table


def test_the_dead_letter_policy_reaches_both_applies_and_the_reconciliations_read_their_letters():
    dag = _dag(postgres_table="analytics.orders_current", on_bad_record="dead_letter", max_dead_letters=3)
    for task_id, store in (
        ("apply", "/data/t_dead_letters"),
        ("apply_postgres", "analytics.orders_current_dead_letters"),
    ):
        spec = dag.get_task(task_id)._stream_spec()
        assert (spec.on_bad_record, spec.max_dead_letters, spec.dead_letter_policy().store) == ("dead_letter", 3, store)
    assert (dag.get_task("reconcile").sink_pipeline, dag.get_task("reconcile_postgres").sink_pipeline) == (
        "p-apply",
        "p-apply-postgres",
    )
    assert _dag().get_task("apply").on_bad_record == "fail"
    with pytest.raises(ValueError, match="on_bad_record='dead_letter' only"):
        _dag(max_dead_letters=3)
    with pytest.raises(ValueError, match="on_bad_record must be one of"):
        _dag(on_bad_record="skip")
