"""Template: history then stream — a consistent full load, then bounded binlog increments every N minutes.

``preflight`` -> ``choose_load`` -> (``full_load`` | ``retention_guard``) -> ``lag_gate`` -> ``capture``
(bounded: up to the binlog end seen at start) -> ``apply`` (Spark CDC mode into a Delta changes table) ->
``reconcile`` (source vs full load + changes, at the common position, without stopping writers).

Where each guarantee lives: the full load's Delta commit carries its chunks' snapshot positions (the
handoff); the capture commits change records and its binlog offset in one Kafka transaction and drops every
change already in the snapshot of its key's chunk; the apply commits each micro-batch with its Kafka offsets
in the Delta changes table and applies a change only if its version is newer.

The effective table is the full load with each key's newest change applied: a change wins over the
full-load row only if it is after the snapshot of the key's chunk (see
:func:`exactly_once_provider.reconcile.sides.delta_side`).

Reruns:

* any rerun (cleared task, new run) continues from committed offsets: the full load is not repeated, the
  capture resumes from its ledger offset, the apply from its sink's offsets; nothing new -> nothing written;
* ``full_reload`` (a Param of the trigger form) takes a new snapshot and replaces the full-load table in ONE
  Delta commit with new handoff positions; the capture keeps its ledger offset but drops every change
  already in the new snapshot, and changes older than the new snapshot stop counting over it: the stream
  restarts from the new position with nothing lost or doubled, even while writers run;
* a purged binlog position fails ``retention_guard`` and asks for a ``full_reload`` run.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from airflow.sdk import DAG, Asset, Param, task

from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
from exactly_once_provider.operators.backpressure import BinlogRetentionGuardOperator, ConsumerLagSensor
from exactly_once_provider.operators.full_load import MySqlFullLoadOperator
from exactly_once_provider.operators.reconcile import ReconcileOperator
from exactly_once_provider.operators.spark_stream import SparkKafkaToSinkOperator

CAPTURE_SOURCE_PARTITION = "binlog"


def history_stream_dag(
    *,
    dag_id: str,
    schema: str,
    table: str,
    key_column: str,
    pipeline: str,
    full_load_path: str,
    changes_path: str,
    checkpoint_location: str,
    start_date: datetime,
    every_minutes: int = 5,
    topic_partitions: int = 1,
    chunk_rows: int = 100_000,
    max_lag: int = 100_000,
    reconcile_columns: Sequence[str] | None = None,
    mysql_conn_id: str = "mysql_default",
    kafka_config_id: str = "kafka_default",
    postgres_conn_id: str = "postgres_default",
    spark_conn_id: str = "spark_default",
    spark_conf: dict[str, str] | None = None,
    retries: int = 2,
    retry_delay: timedelta = timedelta(minutes=1),
    tags: Sequence[str] = (),
) -> DAG:
    """Return a history -> stream DAG for ``schema.table``.

    :param dag_id: the DAG id.
    :param schema: the source database.
    :param table: the source table.
    :param key_column: the table's integer primary key (reconciliation bisects it).
    :param pipeline: the pipeline name; the capture uses it (topic ``<pipeline>.<schema>.<table>``), the apply
        ``<pipeline>-apply``.
    :param full_load_path: the full load's Delta table (declared as an Asset).
    :param changes_path: the CDC apply's Delta table (declared as an Asset).
    :param checkpoint_location: the apply's Spark checkpoint.
    :param start_date: the first run.
    :param every_minutes: minutes between increments.
    :param topic_partitions: partitions of the capture's topic.
    :param chunk_rows: rows per full-load chunk (one snapshot each).
    :param max_lag: the capture waits while the apply is more than this many records behind (backpressure).
    :param reconcile_columns: columns compared; default every source column.
    :param mysql_conn_id: the source ``mysql`` connection.
    :param kafka_config_id: the ``kafka`` connection.
    :param postgres_conn_id: the ``postgres`` connection (reconciliation results).
    :param spark_conn_id: the ``spark`` connection.
    :param spark_conf: extra Spark settings (e.g. ``spark.jars`` with the connectors).
    :param retries: retries per task (every step is idempotent, so retries are safe).
    :param retry_delay: delay between retries.
    :param tags: extra DAG tags.
    """
    try:
        from exactly_once_provider.operators.binlog_capture import BinlogCaptureOperator
    except ImportError as err:
        raise ImportError("history_stream_dag needs the binlog capture operator "
                          "(exactly_once_provider.operators.binlog_capture).") from err
    topic = f"{pipeline}.{schema}.{table}"  # the capture's default topic template
    apply_pipeline = f"{pipeline}-apply"
    with DAG(
        dag_id=dag_id,
        schedule=timedelta(minutes=every_minutes),
        start_date=start_date,
        catchup=False,
        max_active_runs=1,  # one capture per ledger key; increments follow each other
        default_args={"retries": retries, "retry_delay": retry_delay},
        tags=["exactly-once", "cdc", *tags],
        params={"full_reload": Param(False, type="boolean",
                                     description="take a new snapshot, replace the table atomically and restart "
                                                 "the stream from its position")},
        doc_md=__doc__,
    ) as dag:
        @task
        def preflight() -> dict:
            """Check the server and table are fit for a full load and a binlog capture."""
            checked = MySqlSourceHook(mysql_conn_id).preflight(schema, table)
            print(f"preflight ok: {checked.server.version_string}, key {list(checked.key.columns)}, "
                  f"~{checked.estimated_rows} rows")
            return {"key": list(checked.key.columns), "estimated_rows": checked.estimated_rows}

        @task.branch
        def choose_load(params: dict | None = None) -> str:
            """Run the full load on the first run or when ``full_reload`` is set; otherwise continue."""
            from exactly_once_provider.sinks.delta_commit import latest_marker
            from exactly_once_provider.full_load.handoff import MARKER_KEY

            reload = str((params or {}).get("full_reload", False)).lower() == "true"
            if reload or latest_marker(full_load_path, MARKER_KEY) is None:
                return "full_load"
            return "retention_guard"

        # [START howto_operator_full_load]
        full_load = MySqlFullLoadOperator(
            task_id="full_load", table=table, schema=schema, sink_path=full_load_path, chunk_rows=chunk_rows,
            full_reload="{{ params.full_reload }}", mysql_conn_id=mysql_conn_id, spark_conn_id=spark_conn_id,
            spark_conf=spark_conf, outlets=[Asset(name=f"{dag_id}.full_load", uri=f"file://{full_load_path}")])
        # [END howto_operator_full_load]
        # [START howto_operator_retention_guard]
        guard = BinlogRetentionGuardOperator(
            task_id="retention_guard", capture_pipeline=pipeline, capture_source_partition=CAPTURE_SOURCE_PARTITION,
            mysql_conn_id=mysql_conn_id, kafka_config_id=kafka_config_id)
        # [END howto_operator_retention_guard]
        # [START howto_sensor_consumer_lag]
        lag_gate = ConsumerLagSensor(
            task_id="lag_gate", topics=[topic], max_lag=max_lag, sink="delta", sink_location=changes_path,
            sink_pipeline=apply_pipeline, missing_topics_ok=True, kafka_config_id=kafka_config_id,
            timeout=3600, trigger_rule="none_failed_min_one_success")
        # [END howto_sensor_consumer_lag]
        # [START howto_operator_binlog_capture]
        capture = BinlogCaptureOperator(
            task_id="capture", tables=[f"{schema}.{table}"], pipeline=pipeline,
            full_load_paths={f"{schema}.{table}": full_load_path}, mode="bounded",
            source_partition=CAPTURE_SOURCE_PARTITION, topic_partitions=topic_partitions,
            mysql_conn_id=mysql_conn_id, kafka_config_id=kafka_config_id)
        # [END howto_operator_binlog_capture]
        # [START howto_operator_spark_kafka_to_sink_cdc]
        apply = SparkKafkaToSinkOperator(
            task_id="apply", pipeline=apply_pipeline, topics=[topic], sink="delta", sink_path=changes_path,
            checkpoint_location=checkpoint_location, mode="cdc", key_field="pk", version_field="version",
            op_field="op", trigger="available-now", kafka_conn_id=kafka_config_id, spark_conn_id=spark_conn_id,
            conf=dict(spark_conf or {}), outlets=[Asset(name=f"{dag_id}.changes", uri=f"file://{changes_path}")])
        # [END howto_operator_spark_kafka_to_sink_cdc]
        # [START howto_operator_reconcile_cdc]
        reconcile = ReconcileOperator(
            task_id="reconcile", name=pipeline, table=f"{schema}.{table}", key_column=key_column,
            columns=reconcile_columns, sink="delta", sink_path=changes_path, base_path=full_load_path,
            sink_json_column="record_value", sink_json_path="after",
            sink_key_json_paths=[f"after.{key_column}", f"before.{key_column}"], sink_deleted_column="deleted",
            sink_version_column="source_version", sink_binary_encoding="base64", capture_pipeline=pipeline,
            capture_source_partition=CAPTURE_SOURCE_PARTITION, topics=[topic], sink_pipeline=apply_pipeline,
            full_load_path=full_load_path, mysql_conn_id=mysql_conn_id, postgres_conn_id=postgres_conn_id,
            spark_conn_id=spark_conn_id, kafka_config_id=kafka_config_id, spark_conf=spark_conf)
        # [END howto_operator_reconcile_cdc]
        choice = choose_load()
        preflight() >> choice
        choice >> [full_load, guard]
        [full_load, guard] >> lag_gate >> capture >> apply >> reconcile
    return dag
