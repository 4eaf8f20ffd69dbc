"""The settlement template builds a DAG with a data-interval timetable in an explicit zone, Params and Assets."""

from __future__ import annotations

import sys
from pathlib import Path

import pendulum

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "dags"))

from exactly_once_provider.templates.settlement import settlement_dag  # noqa: E402


def _dag(**overrides):
    kwargs = dict(
        dag_id="t_settle",
        table="payments",
        cursor_column="updated_at",
        group_by=["currency"],
        sum_columns=["amount"],
        pipeline="p",
        topic="t",
        sink_path="/data/w",
        checkpoint_location="/data/c",
        report_table="r",
        start_date=pendulum.datetime(2026, 1, 1, tz="Asia/Shanghai"),
        timezone="Asia/Shanghai",
    )
    return settlement_dag(**{**kwargs, **overrides})


def test_tasks_timetable_params_and_assets():
    dag = _dag()
    assert [t.task_id for t in dag.topological_sort()] == [
        "ensure_topic",
        "extract_window",
        "load_window",
        "reconcile_window",
        "settlement_report",
    ]
    timetable = dag.timetable
    assert type(timetable).__name__ == "CronDataIntervalTimetable"
    assert (timetable.expression, str(timetable.timezone)) == ("0 2 * * *", "Asia/Shanghai")
    assert set(dag.params) == {"reextract", "window_end"}
    assert dag.params["reextract"] is False
    outlets = {getattr(o, "uri", None) or f"alias:{o.name}" for t in dag.tasks for o in t.outlets}
    # the URI OpenLineage names the sink by; the report's (it names the server) is added to the alias at run time
    assert outlets == {"file:///data/w", "alias:t_settle.report"}
    assert all(t.retries == 2 for t in dag.tasks) and dag.max_active_runs == 1
    assert dag.get_task("extract_window").upstream_task_ids == {"ensure_topic"}
    load = dag.get_task("load_window")
    assert (load.mode, load.trigger) == ("window", "available-now")


def test_reconcile_compares_the_recorded_window_bounds():
    task = _dag().get_task("reconcile_window")
    assert "xcom_pull(task_ids='extract_window')" in task.source_filter
    assert "`updated_at` < '{{ w['upper'] }}'" in task.source_filter
    assert task.sink_filter.startswith("window_id = '") and task.sink_json_path == "row"


def test_a_sink_and_checkpoint_on_s3_reach_the_load_reconcile_and_report_with_the_aws_connection():
    dag = _dag(sink_path="s3://lake/windows", checkpoint_location="s3://lake/_checkpoints/w", aws_conn_id="aws_lake")
    load = dag.get_task("load_window")
    assert (load.sink_path, load.checkpoint_location) == ("s3://lake/windows", "s3://lake/_checkpoints/w")
    users = ("load_window", "reconcile_window", "settlement_report")
    assert {t: dag.get_task(t).aws_conn_id for t in users} == dict.fromkeys(users, "aws_lake")
    assert dag.get_task("settlement_report").sink_path == "s3://lake/windows"
    assert {o.uri for t in dag.tasks for o in t.outlets if hasattr(o, "uri")} == {"s3://lake/windows"}


def test_the_dead_letter_policy_reaches_the_load_and_the_reconciliation_and_report_read_the_letters():
    dag = _dag(on_bad_record="dead_letter", max_dead_letter_ratio=0.01)
    load = dag.get_task("load_window")
    assert (load.on_bad_record, load.max_dead_letter_ratio, load.pipeline) == ("dead_letter", 0.01, "p-load")
    assert dag.get_task("reconcile_window").sink_pipeline == "p-load"
    assert dag.get_task("settlement_report").sink_pipeline == "p-load"
    plain = _dag()
    assert plain.get_task("load_window").on_bad_record == "fail"
    assert plain.get_task("reconcile_window").sink_pipeline is None
    assert plain.get_task("settlement_report").sink_pipeline is None
