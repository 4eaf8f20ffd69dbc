"""Operator extra links, their registration, and the plugin's registration through the entry point."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import time

from airflow.plugins_manager import AirflowPlugin

from exactly_once_provider.operators.binlog_capture import BinlogCaptureOperator
from exactly_once_provider.operators.full_load import MySqlFullLoadOperator
from exactly_once_provider.operators.kafka_produce import TransactionalProduceOperator
from exactly_once_provider.operators.reconcile import ReconcileOperator
from exactly_once_provider.operators.settlement_report import SettlementReportOperator
from exactly_once_provider.operators.spark_stream import SparkKafkaToSinkOperator
from exactly_once_provider.operators.spark_submit import _StartedWatcher
from exactly_once_provider.operators.watermark_extract import WatermarkExtractOperator
from exactly_once_provider.plugins.links import PipelineStatusLink, SparkUILink, push_link
from exactly_once_provider.provider_info import get_provider_info
from exactly_once_provider.spark_jobs.spec import JobSpec, report_started


def _stream(**kwargs):
    return SparkKafkaToSinkOperator(
        task_id="t", pipeline="orders cdc", topics="t", sink="delta", sink_path="/x", checkpoint_location="/c", **kwargs
    )


def test_pipeline_link_points_at_the_status_page_of_the_rendered_pipeline(monkeypatch):
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example/")
    assert (
        PipelineStatusLink().get_link(_stream(), ti_key=None)
        == "https://airflow.example/exactly-once/?pipeline=orders%20cdc"
    )
    monkeypatch.delenv("AIRFLOW__API__BASE_URL")
    assert PipelineStatusLink().get_link(_stream(), ti_key=None).startswith("/exactly-once/?pipeline=")
    assert PipelineStatusLink().get_link(object(), ti_key=None) == ""


def test_every_pipeline_operator_has_the_status_link_and_the_stream_has_the_spark_ui():
    for operator in (
        TransactionalProduceOperator,
        WatermarkExtractOperator,
        SparkKafkaToSinkOperator,
        BinlogCaptureOperator,
    ):
        assert "Pipeline status" in [link.name for link in operator.operator_extra_links], operator
    assert [link.name for link in SparkKafkaToSinkOperator.operator_extra_links] == ["Pipeline status", "Spark UI"]
    assert not MySqlFullLoadOperator.operator_extra_links  # no pipeline name to link to
    # the reconciliation and the report link to the flow of the pipeline they check / settle
    reconcile = ReconcileOperator(task_id="r", name="shop-orders", table="orders", sink="delta", sink_path="/t")
    report = SettlementReportOperator(
        task_id="s",
        window_id="settle-pay/pay/2026-11-20",
        sink_path="/w",
        report_table="r",
        source_table="pay",
        group_by=["c"],
        sum_columns=["a"],
    )
    assert PipelineStatusLink().get_link(reconcile, ti_key=None).endswith("/exactly-once/?pipeline=shop-orders")
    assert PipelineStatusLink().get_link(report, ti_key=None).endswith("/exactly-once/?pipeline=settle-pay")
    for path in get_provider_info()["extra-links"]:
        module, name = path.rsplit(".", 1)
        assert getattr(importlib.import_module(module), name)().name


class _TI:
    def __init__(self):
        self.pushed = {}

    def xcom_push(self, key, value):
        self.pushed[key] = value


def test_spark_ui_address_from_the_drivers_started_file_is_pushed_at_once(tmp_path):
    operator, ti = _stream(), _TI()
    job = JobSpec(
        job="kafka_to_sink",
        params={},
        secrets_file="",
        result_file=str(tmp_path / "result.json"),
        started_file=str(tmp_path / "started.json"),
    )
    watcher = _StartedWatcher(job.started_file, lambda started: operator._driver_started({"ti": ti}, started))
    watcher.start()
    report_started(job, "http://h1:4041")  # what the driver writes once its SparkSession runs
    deadline = time.monotonic() + 10
    while not ti.pushed and time.monotonic() < deadline:
        time.sleep(0.1)
    watcher.stop()
    assert ti.pushed == {SparkUILink().xcom_key: "http://h1:4041"}
    assert operator.driver_started["cwd"] == os.getcwd()
    assert SparkUILink().get_link(operator, ti_key=None) == "http://h1:4041"
    assert SparkUILink().get_link(_stream(), ti_key=None) == ""
    assert push_link({}, SparkUILink(), "http://x") is False


def test_plugin_is_registered_through_the_airflow_plugins_entry_point():
    (entry,) = [e for e in importlib.metadata.entry_points(group="airflow.plugins") if e.name == "exactly_once"]
    plugin = entry.load()
    assert issubclass(plugin, AirflowPlugin) and plugin.name == "exactly_once"
    (app,) = plugin.fastapi_apps
    assert app["url_prefix"] == "/exactly-once"
    assert {r.path for r in app["app"].routes} >= {"/", "/api/pipelines"}
    (view,) = plugin.external_views
    assert view["href"] == "exactly-once/" and view["destination"] == "nav"
    # provider_info names the same class (tests/unit/provider/test_provider_info_complete.py: loaded once)
    assert [p["plugin-class"] for p in get_provider_info()["plugins"]] == [entry.value.replace(":", ".")]
