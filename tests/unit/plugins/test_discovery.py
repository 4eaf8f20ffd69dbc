"""Pipeline discovery from serialized DAGs, ledger keys and the PostgreSQL offsets table."""

from __future__ import annotations

import pendulum
import pytest
from airflow.sdk import DAG, Param
from airflow.serialization.serialized_objects import DagSerialization

from exactly_once_provider.operators.binlog_capture import BinlogCaptureOperator
from exactly_once_provider.operators.full_load import MySqlFullLoadOperator
from exactly_once_provider.operators.kafka_produce import TransactionalProduceOperator
from exactly_once_provider.operators.reconcile import ReconcileOperator
from exactly_once_provider.operators.spark_stream import SparkKafkaToSinkOperator
from exactly_once_provider.operators.watermark_extract import WatermarkExtractOperator
from exactly_once_provider.plugins.discovery import (
    Discovery,
    SinkSpec,
    add_dags,
    add_ledger_keys,
    add_postgres_pipelines,
    render,
)

START = pendulum.datetime(2026, 1, 1)


def _serialized(dag):
    """Round-trip through Airflow's serialization: what the API server reads from the metadata DB."""
    return DagSerialization.from_dict(DagSerialization.to_dict(dag))


def _dags():
    with DAG("stream", schedule=None, start_date=START, params={"pipeline": Param("orders"), "ledger": "eo-l"}) as one:
        TransactionalProduceOperator(
            task_id="produce",
            topic="orders-t",
            pipeline="{{ params.pipeline }}",
            delivery_mode="exactly_once",
            producer_function="builtins.iter",
            offsets_topic="{{ params.ledger }}",
        )
        SparkKafkaToSinkOperator(
            task_id="to_delta",
            pipeline="{{ params.pipeline }}",
            topics="orders-t, more",
            sink="delta",
            sink_path="/lake/orders",
            checkpoint_location="/ck",
        )
        MySqlFullLoadOperator(task_id="load", table="orders", sink_path="/lake/orders_full")
        ReconcileOperator(
            task_id="check",
            name="{{ params.pipeline }}",
            table="eo.orders",
            sink="delta",
            sink_path="/lake/orders",
            postgres_conn_id="results_pg",
        )
    with DAG("settle", schedule=None, start_date=START, params={"region": "eu"}) as two:
        WatermarkExtractOperator(
            task_id="extract", table="t", cursor_column="c", cursor_kind="id", topic="s-t", pipeline="settle-{{ ds }}"
        )
        SparkKafkaToSinkOperator(
            task_id="to_pg",
            pipeline="settle_pg",
            topics="s-t",
            sink="postgres",
            sink_table="public.settled",
            checkpoint_location="/ck2",
            on_bad_record="dead_letter",
            dead_letter_store="public.settled_{{ params.region }}_letters",
        )
        WatermarkExtractOperator(
            task_id="extract_named",
            table="eo.fills",
            cursor_column="c",
            cursor_kind="id",
            topic="f-t",
            pipeline="fills",
        )
        WatermarkExtractOperator(
            task_id="extract_part",
            table="eo.fees",
            cursor_column="c",
            cursor_kind="id",
            topic="f-t",
            pipeline="fills",
            source_partition="fees-{{ params.region }}",
        )
    with DAG("history_only", schedule=None, start_date=START) as three:
        MySqlFullLoadOperator(task_id="load", table="customers", sink_path="/lake/customers")
    with DAG("cdc", schedule=None, start_date=START, params={"second": Param("items")}) as four:
        BinlogCaptureOperator(
            task_id="capture",
            tables=["eo.orders", "eo.items"],
            pipeline="shop_cdc",
            full_load_paths={"eo.orders": "/lake/orders_full"},
            offsets_topic="eo-cdc",
        )
        BinlogCaptureOperator(task_id="capture_bare", tables="users", pipeline="users_cdc")
        SparkKafkaToSinkOperator(  # several tables in one application: one query per table
            task_id="apply_postgres",
            pipeline="shop_pg",
            sink="postgres",
            mode="current",
            streams=[
                {
                    "topics": ["shop_cdc.eo.orders"],
                    "sink_path": "/lake/orders_full",
                    "sink_table": "a.orders",
                    "checkpoint_location": "/ck/o",
                },
                {
                    "topics": "shop_cdc.eo.{{ params.second }}",
                    "sink_path": "/lake/items",
                    "sink_table": "a.items",
                    "checkpoint_location": "/ck/i",
                },
            ],
        )
    return [_serialized(d) for d in (one, two, three, four)]


def test_dag_tasks_declare_pipelines_with_params_rendered_and_runtime_templates_listed():
    found = add_dags(Discovery(), _dags())

    assert set(found.pipelines) == {"orders", "settle_pg", "history_only", "shop_cdc", "users_cdc", "fills", "shop_pg"}
    shop_pg = found.pipelines["shop_pg"]
    assert shop_pg.topics == {"shop_cdc.eo.orders", "shop_cdc.eo.items"}
    assert shop_pg.sinks == {SinkSpec("postgres", "a.orders"), SinkSpec("postgres", "a.items")}
    orders = found.pipelines["orders"]
    assert orders.topics == {"orders-t", "more"}
    assert orders.offsets_topics == {"eo-l"}
    assert orders.sinks == {SinkSpec("delta", "/lake/orders", None)}
    assert orders.full_loads == {SinkSpec("delta", "/lake/orders_full")}
    assert orders.dag_ids == {"stream"} and orders.found_in == {"dag"}
    assert orders.result_conn_ids == {"results_pg"}  # where its reconciliation results are stored
    assert found.pipelines["settle_pg"].sinks == {
        SinkSpec("postgres", "public.settled", None, dead_letter_store="public.settled_eu_letters")
    }
    assert found.pipelines["history_only"].full_loads == {SinkSpec("delta", "/lake/customers")}
    cdc = found.pipelines["shop_cdc"]
    assert cdc.topics == {"shop_cdc.eo.orders", "shop_cdc.eo.items"} and cdc.offsets_topics == {"eo-cdc"}
    assert cdc.full_loads == {SinkSpec("delta", "/lake/orders_full")}
    assert [u.split(":")[0] for u in found.unresolved] == ["settle.extract", "cdc.capture_bare"]
    assert found.unresolved[0].startswith("settle.extract: 'settle-{{ ds }}'")
    assert found.offsets_topics() == {"eo-offsets", "eo-l", "eo-cdc"}
    # the ledger keys the page reads backwards: each producer's source partition (default, table, rendered)
    assert orders.source_partitions == {"0"} and cdc.source_partitions == {"binlog"}
    assert found.pipelines["fills"].source_partitions == {"eo.fills", "fees-eu"}
    assert found.pipelines["settle_pg"].source_partitions == set()  # a stream writes no ledger key


def test_ledger_keys_and_postgres_rows_add_pipelines_no_dag_names():
    found = add_dags(Discovery(), _dags())
    add_ledger_keys(found, ["orders/0", "external/db1.users"], "eo-offsets")
    add_postgres_pipelines(found, ["settle_pg", "pg_only"], "postgres_default")

    assert found.pipelines["orders"].found_in == {"dag", "ledger"}
    assert found.pipelines["external"].offsets_topics == {"eo-offsets"}
    assert [s.location for s in found.pipelines["settle_pg"].sinks] == ["public.settled"]  # not twice
    assert found.pipelines["pg_only"].sinks == {SinkSpec("postgres", "", "postgres_default")}


def test_an_iceberg_sink_is_found_by_its_table_in_the_catalog_the_task_names():
    with DAG("lake", schedule=None, start_date=START, params={"ns": "lake"}) as dag:
        SparkKafkaToSinkOperator(
            task_id="to_iceberg",
            pipeline="orders-lake",
            topics="shop.orders",
            sink="iceberg",
            sink_table="{{ params.ns }}.orders",
            sink_path="s3://bucket/warehouse/orders",
            checkpoint_location="/ck",
            iceberg_conn_id="lake_catalog",
            iceberg_catalog="{{ params.ns }}",
        )
        SparkKafkaToSinkOperator(  # current mode on local disk: the table beside the full load, no aws connection
            task_id="current",
            pipeline="orders-current",
            topics="shop.orders",
            sink="iceberg",
            mode="current",
            sink_table="lake.orders_current",
            sink_path="/lake/orders_full",
            checkpoint_location="/ck2",
        )
    found = add_dags(Discovery(), [_serialized(dag)])

    assert found.pipelines["orders-lake"].sinks == {
        SinkSpec("iceberg", "lake.orders", "lake_catalog", "aws_default", iceberg_catalog="lake")
    }
    assert found.pipelines["orders-current"].sinks == {
        SinkSpec("iceberg", "lake.orders_current", "postgres_default", None, iceberg_catalog="eo")
    }


def test_render_refuses_what_only_a_run_knows():
    assert render("{{ params.p }}-x", {"p": "a"}) == "a-x"
    assert render(5, {}) == 5
    with pytest.raises(ValueError, match="known only when a run renders it"):
        render("{{ ds }}", {})


def test_tables_matched_at_run_time_are_the_newest_runs_and_unknown_before_the_first():
    from exactly_once_provider.templates.history_stream import history_stream_dag

    dag = _serialized(
        history_stream_dag(
            dag_id="db",
            schema="shop",
            tables=["o*"],
            pipeline="p",
            table_path="/data/{table}",
            checkpoint_location="/data/cp",
            start_date=START,
        )
    )
    before = add_dags(Discovery(), [dag])
    assert {u.split(":")[0] for u in before.unresolved} == {"db.full_load", "db.capture", "db.apply", "db.reconcile"}
    assert "known after the first run" in " ".join(before.unresolved)
    newest = {
        ("db", "preflight", "tables"): ["orders", "outbox"],
        ("db", "preflight", "capture_tables"): ["shop.orders", "shop.outbox"],
        ("db", "preflight", "full_load_paths"): {"shop.orders": "/data/orders", "shop.outbox": "/data/outbox"},
        ("db", "preflight", "reconciles"): [
            {"name": "p.orders", "topics": ["p.shop.orders"]},
            {"name": "p.outbox", "topics": ["p.shop.outbox"]},
        ],
        ("db", "preflight", "streams"): [
            {"topics": ["p.shop.orders"], "sink_path": "/data/orders"},
            {"topics": ["p.shop.outbox"], "sink_path": "/data/outbox"},
        ],
    }
    found = add_dags(Discovery(), [dag], lambda dag_id, task_id, key: newest.get((dag_id, task_id, key)))
    capture, apply = found.pipelines["p"], found.pipelines["p-apply"]
    assert capture.sources == {"shop.orders", "shop.outbox"}
    assert capture.topics == apply.topics == {"p.shop.orders", "p.shop.outbox"}
    assert {s.location for s in apply.sinks} == {"/data/orders", "/data/outbox"}
    assert {s.location for s in capture.full_loads} == {"/data/orders", "/data/outbox"}
    assert not found.unresolved
    assert found.pipelines["p.outbox"].dag_ids == {"db"}  # each table's reconciliation results
    assert found.pipelines["p.outbox"].checked_topics == {"p.shop.outbox"}  # on the card of its flow


def test_a_mapped_task_is_read_by_its_partial_arguments_and_its_per_instance_ones_listed():
    from airflow.sdk import DAG

    from exactly_once_provider.operators.spark_stream import SparkKafkaToSinkOperator

    with DAG("mapped", schedule=None, start_date=START) as dag:
        SparkKafkaToSinkOperator.partial(
            task_id="apply", pipeline="m-apply", sink="delta", checkpoint_location="/cp", kafka_conn_id="k"
        ).expand(sink_path=["/lake/a", "/lake/b"])
    found = add_dags(Discovery(), [_serialized(dag)])
    assert found.pipelines["m-apply"].dag_ids == {"mapped"}
    assert [u.split(":")[0] for u in found.unresolved] == ["mapped.apply"]  # its sink: per mapped instance
    assert "differs per mapped instance" in found.unresolved[0]  # listed, not guessed, and the page is read
