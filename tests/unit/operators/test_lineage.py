"""Each operator's OpenLineage datasets before a run (no services: names from the connections alone; a schema
that cannot be read is left out with a warning, never the datasets), and a failed run reports no statistics."""

from __future__ import annotations

import json

import pytest

from exactly_once_provider.operators.binlog_capture import BinlogCaptureOperator
from exactly_once_provider.operators.full_load import MySqlFullLoadOperator
from exactly_once_provider.operators.kafka_produce import TransactionalProduceOperator
from exactly_once_provider.operators.reconcile import ReconcileOperator
from exactly_once_provider.operators.settlement_report import SettlementReportOperator
from exactly_once_provider.operators.spark_stream import SparkKafkaToSinkOperator
from exactly_once_provider.operators.watermark_extract import WatermarkExtractOperator

pytestmark = pytest.mark.unit
MYSQL, KAFKA, PG = "mysql://db.example:3307", "kafka://k1:9092", "postgres://pg.example:5433"


@pytest.fixture(autouse=True)
def connections(monkeypatch):
    # port 1 on the loopback: the schema reads fail at once (nothing listens), the names need no server
    monkeypatch.setenv(
        "AIRFLOW_CONN_MYSQL_DEFAULT",
        json.dumps(
            {
                "conn_type": "mysql",
                "host": "db.example",
                "port": 3307,
                "schema": "shop",
                "login": "u",
                "password": "p",
                "extra": {"connect_timeout": 1},
            }
        ),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_KAFKA_DEFAULT",
        json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": "k1:9092,k2:9092"}}),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_POSTGRES_DEFAULT",
        json.dumps({"conn_type": "postgres", "host": "pg.example", "port": 5433, "schema": "dw"}),
    )


def _names(datasets) -> list[tuple[str, str]]:
    return [(d.namespace, d.name) for d in datasets]


def _no_schema_reads(monkeypatch):
    """Make the MySQL schema read fail as an unreachable server does, without waiting for a network timeout."""
    from exactly_once_provider.hooks.mysql_source import MySqlSourceHook

    def refuse(self):
        raise ConnectionRefusedError("nothing listens")

    monkeypatch.setattr(MySqlSourceHook, "cursor", refuse)


@pytest.mark.parametrize(
    ("operator", "inputs", "outputs"),
    [
        (
            lambda: MySqlFullLoadOperator(task_id="t", table="orders", sink_path="/lake/orders"),
            [(MYSQL, "shop.orders")],
            [("file", "/lake/orders")],
        ),
        (
            lambda: BinlogCaptureOperator(task_id="t", tables=["shop.orders", "shop.items"], pipeline="p"),
            [(MYSQL, "shop.orders"), (MYSQL, "shop.items")],
            [(KAFKA, "p.shop.orders"), (KAFKA, "p.shop.items")],
        ),
        (
            lambda: WatermarkExtractOperator(
                task_id="t", table="pay", cursor_column="u", cursor_kind="timestamp", topic="eo-pay", pipeline="p"
            ),
            [(MYSQL, "shop.pay")],
            [(KAFKA, "eo-pay")],
        ),
        (
            lambda: TransactionalProduceOperator(
                task_id="t", topic="t1", pipeline="p", delivery_mode="exactly_once", producer_function="builtins.iter"
            ),
            [],
            [(KAFKA, "t1")],
        ),
        (
            lambda: SparkKafkaToSinkOperator(
                task_id="t", pipeline="p", topics="a,b", sink="delta", sink_path="/lake/x", checkpoint_location="/c"
            ),
            [(KAFKA, "a"), (KAFKA, "b")],
            [("file", "/lake/x")],
        ),
        (
            lambda: SparkKafkaToSinkOperator(
                task_id="t",
                pipeline="p",
                topics=["a"],
                sink="postgres",
                sink_table="fin.orders",
                checkpoint_location="/c",
            ),
            [(KAFKA, "a")],
            [(PG, "dw.fin.orders")],
        ),
        (
            lambda: SparkKafkaToSinkOperator(
                task_id="t",
                pipeline="p",
                topics="a",
                sink="iceberg",
                sink_table="lake.orders",
                sink_path="s3a://lake/warehouse/orders",
                checkpoint_location="/c",
            ),
            [(KAFKA, "a")],
            [("s3://lake", "warehouse/orders")],
        ),
        (
            lambda: SparkKafkaToSinkOperator(
                task_id="t",
                pipeline="p",
                topics="p.shop.orders",
                sink="iceberg",
                mode="current",
                sink_table="lake.orders",
                sink_path="/lake/orders",
                checkpoint_location="/c",
            ),
            [(KAFKA, "p.shop.orders")],
            [("file", "/lake/orders_iceberg")],  # the Iceberg table beside its Delta full load, not the load
        ),
        (
            lambda: ReconcileOperator(
                task_id="t", name="p", table="orders", sink="delta", sink_path="/lake/c", base_path="/lake/o"
            ),
            [(MYSQL, "shop.orders"), ("file", "/lake/c"), ("file", "/lake/o")],
            [(PG, "dw.public.eo_reconciliation")],
        ),
        (
            lambda: ReconcileOperator(
                task_id="t",
                name="p",
                table="orders",
                sink="iceberg",
                sink_table="lake.orders",
                sink_path="s3://lake/loads/orders_iceberg",
            ),
            [(MYSQL, "shop.orders"), ("s3://lake", "loads/orders_iceberg")],
            [(PG, "dw.public.eo_reconciliation")],
        ),
        (
            lambda: SettlementReportOperator(
                task_id="t",
                window_id="p/pay/1",
                sink_path="/lake/w",
                report_table="r",
                source_table="pay",
                group_by=["currency"],
                sum_columns=["amount"],
            ),
            [("file", "/lake/w")],
            [(PG, "dw.public.r")],
        ),
    ],
)
def test_datasets_before_and_after_a_failed_run(operator, inputs, outputs, monkeypatch):
    _no_schema_reads(monkeypatch)
    op = operator()
    for lineage in (op.get_openlineage_facets_on_start(), op.get_openlineage_facets_on_failure(None)):
        assert (_names(lineage.inputs), _names(lineage.outputs)) == (inputs, outputs)
        assert all("outputStatistics" not in (d.outputFacets or {}) for d in lineage.outputs)


def test_a_run_reports_rows_and_its_committed_position(monkeypatch):
    _no_schema_reads(monkeypatch)
    op = BinlogCaptureOperator(task_id="t", tables="shop.orders", pipeline="p")
    op.openlineage_result = {
        "committed_position": "binlog.000001:18146205",
        "gtid": "0-1-77",
        "rows": 42,
        "topics": {"shop.orders": "p.shop.orders"},
    }
    [out] = op.get_openlineage_facets_on_complete(None).outputs
    assert out.outputFacets["outputStatistics"].rowCount == 42
    commit = out.outputFacets["exactlyOnce_commit"]
    assert (commit.pipeline, commit.position, commit.gtid) == ("p", "binlog.000001:18146205", "0-1-77")
    assert op.get_openlineage_facets_on_failure(None).outputs[0].outputFacets == {}
