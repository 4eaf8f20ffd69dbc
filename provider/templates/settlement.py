"""Template: a nightly settlement over each data interval, reconciled, with a per-group report.

``extract_window`` (one Kafka transaction per window, bounds in the offsets ledger) -> ``load_window``
(Spark window mode: the window's rows replace the window's previous output in ONE sink commit) ->
``reconcile_window`` (source rows of the window's bounds vs the sink's window) -> ``settlement_report``
(rows and sums per group, replaced in ONE PostgreSQL transaction).

Reruns leave exactly one copy of each window:

* clearing a run (or a backfill of a past interval) re-runs ``extract_window`` for a window already in the
  ledger: it publishes nothing and returns the recorded bounds; the load finds the version already in the
  sink; the report is replaced by the same figures;
* the ``reextract`` Param re-reads the recorded bounds and publishes the next version, which replaces the
  older one in the sink and in the report;
* the ``window_end`` Param settles the window ending at that instant (a manual run has no data interval).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import pendulum
from airflow.sdk import DAG, Asset, AssetAlias, CronDataIntervalTimetable, Param, task

from exactly_once_provider import lineage
from exactly_once_provider.operators.reconcile import ReconcileOperator
from exactly_once_provider.operators.settlement_report import SettlementReportOperator
from exactly_once_provider.operators.spark_stream import SparkKafkaToSinkOperator
from exactly_once_provider.operators.watermark_extract import WatermarkExtractOperator
from exactly_once_provider.sinks import dead_letters
from exactly_once_provider.source.identifiers import quote_identifier

_WINDOW = "ti.xcom_pull(task_ids='extract_window')"


def settlement_dag(
    *,
    dag_id: str,
    table: str,
    cursor_column: str,
    group_by: Sequence[str],
    sum_columns: Sequence[str],
    pipeline: str,
    topic: str,
    sink_path: str,
    checkpoint_location: str,
    report_table: str,
    start_date: datetime,
    cron: str = "0 2 * * *",
    timezone: str = "UTC",
    catchup: bool = False,
    safety_lag: float = 5.0,
    topic_partitions: int = 1,
    reconcile_columns: Sequence[str] | None = None,
    mysql_conn_id: str = "mysql_default",
    kafka_config_id: str = "kafka_default",
    postgres_conn_id: str = "postgres_default",
    spark_conn_id: str = "spark_default",
    aws_conn_id: str = "aws_default",
    spark_conf: dict[str, str] | None = None,
    on_bad_record: str = "fail",
    max_dead_letters: int | None = None,
    max_dead_letter_ratio: float | None = None,
    retries: int = 2,
    retry_delay: timedelta = timedelta(minutes=1),
    tags: Sequence[str] = (),
) -> DAG:
    """Return a nightly settlement DAG for ``table``.

    :param dag_id: the DAG id.
    :param table: the source table (``table`` or ``schema.table``); also the ledger's source partition.
    :param cursor_column: a TIMESTAMP/DATETIME column set by the database on insert/update.
    :param group_by: report grouping columns, e.g. ``["currency"]``.
    :param sum_columns: DECIMAL/integer columns summed per group, e.g. ``["amount"]``.
    :param pipeline: the extract's pipeline name (transactional id, ledger key, window ids).
    :param topic: the Kafka topic of the windows.
    :param sink_path: the window-mode Delta table (declared as an Asset): a local path or ``s3://bucket/prefix``.
    :param checkpoint_location: the Spark checkpoint of the load: a local path or ``s3://bucket/prefix``.
    :param report_table: the PostgreSQL report table (an Asset ``postgres://host:port/db/schema/table``, through
        the AssetAlias ``<dag_id>.report``: the report task names it when it runs, from its connection).
    :param start_date: the first interval's start.
    :param cron: when an interval ends and its run starts.
    :param timezone: the zone the cron is read in (an explicit zone, never the server's).
    :param catchup: create runs for past intervals.
    :param safety_lag: seconds the window stays behind the database clock.
    :param topic_partitions: partitions of the topic when the DAG creates it.
    :param reconcile_columns: columns compared by the reconciliation; default every source column.
    :param mysql_conn_id: the source ``mysql`` connection.
    :param kafka_config_id: the ``kafka`` connection.
    :param postgres_conn_id: the ``postgres`` connection (report and reconciliation results).
    :param spark_conn_id: the ``spark`` connection.
    :param aws_conn_id: the standard ``aws`` connection of a ``sink_path`` or ``checkpoint_location`` on S3
        (credentials, ``endpoint_url`` in its extra); ``ensure_topic`` checks those locations with it first.
    :param spark_conf: extra Spark settings (e.g. ``spark.jars`` with the connectors).
    :param on_bad_record: a data record the window's sink cannot store: ``fail`` (the load stops before the window
        settles) or ``dead_letter`` (the window settles without it, the record committed to the dead-letter store
        with the window; the reconciliation names its key as dead-lettered, the report counts it:
        docs/dead-letters.md).
    :param max_dead_letters: ``dead_letter``: bad records allowed per micro-batch of the load (default 100).
    :param max_dead_letter_ratio: ``dead_letter``: the share of a micro-batch's records allowed to be bad.
    :param retries: retries per task (every step is idempotent, so retries are safe).
    :param retry_delay: delay between retries.
    :param tags: extra DAG tags.
    """
    # The URIs OpenLineage names these tables by (exactly_once_provider.lineage): the asset graph and the
    # lineage show the same datasets. The report's URI names its PostgreSQL server, known from the connection,
    # which no DAG reads while it is parsed: the report task adds that Asset to the alias when it runs.
    sink_asset = Asset(name=f"{dag_id}.windows", uri=lineage.storage_path(sink_path).asset_uri)
    report_asset = AssetAlias(name=f"{dag_id}.report")
    cursor = quote_identifier(cursor_column)
    with DAG(
        dag_id=dag_id,
        # A cron string alone is a CronTriggerTimetable in Airflow 3 (no data interval); settlements need one.
        schedule=CronDataIntervalTimetable(cron, timezone=pendulum.timezone(timezone)),
        start_date=start_date,
        catchup=catchup,
        max_active_runs=1,  # windows follow each other: one writer per ledger key
        default_args={"retries": retries, "retry_delay": retry_delay},
        tags=["exactly-once", "settlement", *tags],
        params={
            "reextract": Param(
                False, type="boolean", description="re-read this window's recorded bounds and publish a new version"
            ),
            "window_end": Param(
                None,
                type=["null", "string"],
                format="date-time",
                description="settle the window ending at this instant instead of the interval end (ISO-8601 with zone)",
            ),
        },
        doc_md=__doc__,
    ) as dag:

        @task
        def ensure_topic() -> str:
            """Check every endpoint before a window is extracted (S3 locations, PostgreSQL, Kafka); create the
            windows' topic if it is missing (the extract writes batch markers to every partition)."""
            from exactly_once_provider.connections import (
                check_kafka_access,
                explain_kafka_denials,
                postgres_connection,
            )
            from exactly_once_provider.hooks.kafka_client import kafka_client_config
            from exactly_once_provider.kafka.topics import ensure_topics
            from exactly_once_provider.storage.preflight import preflight_locations
            from exactly_once_provider.storage.s3 import settings_for

            # Every endpoint before anything is written: a refused one fails here, naming the connection and the fix.
            locations = [sink_path, checkpoint_location]
            for storage in preflight_locations(locations, settings_for(aws_conn_id, *locations)):
                print(f"preflight ok: {storage}")
            postgres_connection(postgres_conn_id).close()
            print(f"preflight ok: PostgreSQL connection {postgres_conn_id!r}")
            config = kafka_client_config(kafka_config_id)  # the whole connection: SASL/TLS included
            admin = check_kafka_access(config, kafka_config_id)
            with explain_kafka_denials(kafka_config_id, config, f"Create and Describe on topic {topic!r}"):
                created = ensure_topics(admin, [topic], topic_partitions)
            print(f"preflight ok: Kafka connection {kafka_config_id!r}, topic {topic!r}{' created' if created else ''}")
            return topic

        # [START howto_operator_watermark_extract_template]
        extract = WatermarkExtractOperator(
            task_id="extract_window",
            table=table,
            cursor_column=cursor_column,
            cursor_kind="timestamp",
            topic=topic,
            pipeline=pipeline,
            interval_end="{{ params.window_end or data_interval_end or '' }}",
            reextract="{{ params.reextract }}",
            safety_lag=safety_lag,
            mysql_conn_id=mysql_conn_id,
            kafka_config_id=kafka_config_id,
        )
        # [END howto_operator_watermark_extract_template]
        # on_bad_record="dead_letter": the load's settings, and the reconciliation and report read its letters
        bad_records = dead_letters.operator_settings(on_bad_record, max_dead_letters, max_dead_letter_ratio)
        letters_of = {"sink_pipeline": f"{pipeline}-load"} if bad_records else {}
        # [START howto_operator_spark_kafka_to_sink_window]
        load = SparkKafkaToSinkOperator(
            task_id="load_window",
            pipeline=f"{pipeline}-load",
            topics=topic,
            sink="delta",
            sink_path=sink_path,
            checkpoint_location=checkpoint_location,
            mode="window",
            trigger="available-now",
            **bad_records,
            kafka_conn_id=kafka_config_id,
            spark_conn_id=spark_conn_id,
            aws_conn_id=aws_conn_id,
            conf=dict(spark_conf or {}),
            outlets=[sink_asset],
        )
        # [END howto_operator_spark_kafka_to_sink_window]
        # [START howto_operator_reconcile_window]
        window_id = (
            f"{{{{ {_WINDOW}['pipeline'] }}}}/{{{{ {_WINDOW}['source_partition'] }}}}/{{{{ {_WINDOW}['batch_id'] }}}}"
        )
        reconcile = ReconcileOperator(
            task_id="reconcile_window",
            name=pipeline,
            table=table,
            columns=reconcile_columns,
            sink="delta",
            sink_path=sink_path,
            sink_json_column="record_value",
            sink_json_path="row",
            sink_filter=f"window_id = '{window_id}'",
            source_filter=(
                f"{{% set w = {_WINDOW} %}}{{% if w['lower'] %}}{cursor} >= '{{{{ w['lower'] }}}}' AND "
                f"{{% endif %}}{cursor} < '{{{{ w['upper'] }}}}'"
            ),
            mysql_conn_id=mysql_conn_id,
            postgres_conn_id=postgres_conn_id,
            spark_conn_id=spark_conn_id,
            aws_conn_id=aws_conn_id,
            spark_conf=spark_conf,
            **letters_of,
        )
        # [END howto_operator_reconcile_window]
        # [START howto_operator_settlement_report]
        report = SettlementReportOperator(
            task_id="settlement_report",
            window_id=window_id,
            sink_path=sink_path,
            report_table=report_table,
            source_table=table,
            group_by=group_by,
            sum_columns=sum_columns,
            mysql_conn_id=mysql_conn_id,
            postgres_conn_id=postgres_conn_id,
            spark_conn_id=spark_conn_id,
            aws_conn_id=aws_conn_id,
            spark_conf=spark_conf,
            outlets=[report_asset],
            **letters_of,
        )
        # [END howto_operator_settlement_report]
        ensure_topic() >> extract >> load >> reconcile >> report
    return dag
