"""Template: history then stream — a consistent full load, then the binlog's changes merged into ONE current table.

``preflight`` -> ``choose_load`` -> (``full_load`` | ``retention_guard``), then

* ``mode="scheduled"`` (default): ``lag_gate`` -> ``capture`` (bounded: up to the binlog end seen at start) ->
  ``apply`` (Spark, available-now) -> ``reconcile`` (source vs the current table at the common position, without
  stopping writers), every ``every_minutes``;
* ``mode="continuous"``: ``capture`` (continuous) and ``apply`` (Spark, a micro-batch every
  ``stream_interval``) run side by side for ``run_for`` and finish cleanly; the DAG's ``@continuous`` schedule
  starts the next run at once, and task retries restart either one if it dies in between. Both resume exactly
  once from what Kafka and the table hold.

Several tables (``tables=[...]``, locations with a ``{table}`` placeholder): one full load application of
the tables not loaded yet, one capture of them all, one ``apply`` Spark application with one query over all of
them, a reconciliation per table (see :func:`history_stream_dag`).

The table (``table_path``) is the full load's Delta table with every later change merged in
(:mod:`exactly_once_provider.sinks.current_table`): one row per source key, typed like the source, read with
``SELECT ... WHERE NOT _eo_deleted``. It and the apply's checkpoint may be local paths or on S3
(``s3://bucket/prefix``, reached with the ``aws`` connection ``aws_conn_id``; the full load stages its chunks
next to the table, on the same store, unless ``staging_path`` says otherwise). Where each guarantee lives: the full load's Delta commit carries its chunks'
snapshot positions (the handoff) and its rows their chunk's snapshot version; the capture commits change records
and its binlog offset in one Kafka transaction and drops every change already in the snapshot of its key's
chunk; the apply commits each micro-batch with its Kafka offsets in one Delta MERGE, where a change wins only
if its version is newer than the row's.

Reruns:

* any rerun (cleared task, new run) continues from committed offsets: the full load is not repeated, the
  capture resumes from its ledger offset, the apply from the table's offsets; nothing new -> nothing written;
* ``full_reload`` (a Param of the trigger form) takes a new snapshot and replaces the table in ONE Delta commit
  with new handoff positions and row versions; changes older than the new snapshot (still in Kafka) lose
  against them: the stream continues from the new position with nothing lost or doubled, even while writers
  run. In continuous mode a triggered ``full_reload`` run starts when the running one ends (``run_for``) or is
  marked failed;
* ``resnapshot`` (a Param: table names) does the same for the tables it names only; the others are not read
  again and their streams go on;
* a purged binlog position fails ``retention_guard`` and asks for a ``full_reload`` run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Asset, Param, task

from exactly_once_provider import lineage
from exactly_once_provider.full_load.job import FullLoadRequest
from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
from exactly_once_provider.operators.backpressure import BinlogRetentionGuardOperator, ConsumerLagSensor
from exactly_once_provider.operators.full_load import MySqlFullLoadOperator
from exactly_once_provider.operators.reconcile import ReconcileOperator
from exactly_once_provider.operators.spark_stream import SparkKafkaToSinkOperator
from exactly_once_provider.sinks import dead_letters
from exactly_once_provider.sinks.current_table import DELETED_COLUMN
from exactly_once_provider.source.table_patterns import is_pattern, split_name

CAPTURE_SOURCE_PARTITION = "binlog"


MODES = ("scheduled", "continuous")
TABLE = "{table}"  # in table_path, checkpoint_location and staging_path of a DAG of several tables
# Continuous mode: a killed task is retried after 2 s, 4 s, 8 s... up to 2 minutes, 20 times in one run.
CONTINUOUS_RETRIES = 20
CONTINUOUS_RETRY_DELAY = timedelta(seconds=2)
CONTINUOUS_MAX_RETRY_DELAY = timedelta(minutes=2)
# ... and a Spark driver killed by a signal is started again at once inside its task, 3 times per try: no
# retry delay, no new task process (a driver kill -> applying again in ~10 s instead of ~18 s).
CONTINUOUS_DRIVER_RESTARTS = 3
EXAMPLE_TABLE = "example"  # stands in for the tables a pattern matches when their locations' form is checked
ALL_TABLES = "_eo_all_tables"  # what a {table} in checkpoint_location becomes: the apply's one query of all tables


# The continuous capture's Kafka transaction interval: a fifth of the stream's 1 s trigger, so a change waits
# for its transaction about 0.1 s on average (1,000 ms, the capture's default, adds 0.5 s to every change).
# Five commits a second cost the capture little at the rates a 2-core source writes (docs/benchmarks.md).
CONTINUOUS_COMMIT_INTERVAL_MS = 200


def _per_table(value, name: str):
    """Return ``value`` for table ``name``: its entry of a mapping by table, or the value itself."""
    return value.get(name) if isinstance(value, Mapping) else value


def history_stream_dag(
    *,
    dag_id: str,
    schema: str,
    table: str | None = None,
    tables: Sequence[str] | None = None,
    exclude_tables: Sequence[str] = (),
    pipeline: str,
    table_path: str,
    checkpoint_location: str,
    start_date: datetime,
    staging_path: str | None = None,
    postgres_table: str | None = None,
    key_column: str | Sequence[str] | Mapping[str, str | Sequence[str]] | None = None,
    mode: str = "scheduled",
    every_minutes: int = 5,
    run_for: timedelta = timedelta(hours=1),
    stream_interval: str = "1 second",
    capture_commit_interval_ms: int | None = None,
    topic_partitions: int = 1,
    chunk_rows: int | None = None,
    max_lag: int = 100_000,
    full_reconcile_hour: int | None = 0,
    reconcile_columns: Sequence[str] | Mapping[str, Sequence[str]] | None = None,
    mysql_conn_id: str = "mysql_default",
    kafka_config_id: str = "kafka_default",
    postgres_conn_id: str = "postgres_default",
    spark_conn_id: str = "spark_default",
    aws_conn_id: str = "aws_default",
    spark_conf: dict[str, str] | None = None,
    on_bad_record: str = "fail",
    max_dead_letters: int | None = None,
    max_dead_letter_ratio: float | None = None,
    retries: int | None = None,
    retry_delay: timedelta | None = None,
    tags: Sequence[str] = (),
) -> DAG:
    """Return a history -> stream DAG for ``schema.table``, or for several tables of ``schema`` (``tables``).

    Several tables: ONE ``full_load`` Spark application of the tables not loaded yet (their chunks read together,
    each table published in its own commit as soon as it is staged; ``full_reload`` loads them all), ONE capture of all of them (one Kafka transaction
    per source transaction across the tables), ONE ``apply`` Spark application (ONE streaming query over all
    the tables' topics, each micro-batch split per table into its own current table: a batch costs what the
    tables it touches cost), and per table a ``lag_gate_<table>`` and a ``reconcile_<table>`` (named
    ``<pipeline>.<table>`` in the results). ``table_path`` (and ``staging_path``, if given) then name each
    table's location with the ``{table}`` placeholder, e.g. ``s3://lake/shop/{table}``; a ``{table}`` in
    ``checkpoint_location`` names the one checkpoint of the apply ``_eo_all_tables``.

    :param dag_id: the DAG id.
    :param schema: the source database.
    :param table: the source table (or ``tables``).
    :param tables: several source tables of ``schema``, any key shape each (integer, text, composite): names, or
        shell-style patterns (``"*"``, ``"orders_*"``, ``"[*]"`` for a literal ``*``,
        :mod:`~exactly_once_provider.source.table_patterns`) resolved by ``preflight`` at every run: a table
        created later is loaded and followed from the next run on (in continuous mode: the next ``run_for``
        period). With patterns the per-table tasks are mapped tasks, ``lag_gate`` and ``reconcile``, one instance
        per matched table, named by it; a pattern matching nothing, or a matched table without a primary key
        (exclude it), fails the preflight. Other schemas of the same server: ``"billing.*"``, ``"billing.invoices"``
        (split at the first dot); such a table is named ``billing.invoices`` everywhere (``{table}`` in the
        locations, the ``resnapshot`` Param, the reconciliation names) and ``billing_invoices`` in
        ``postgres_table``.
    :param exclude_tables: names and patterns of tables to leave out of ``tables`` (``other.pattern`` for another
        schema's).
    :param pipeline: the pipeline name; the capture uses it (topic ``<pipeline>.<schema>.<table>``), the apply
        ``<pipeline>-apply``.
    :param table_path: the current table: the full load's Delta table the changes are merged into (declared as an
        Asset): a local path or ``s3://bucket/prefix``.
    :param checkpoint_location: the apply's Spark checkpoint: a local path or ``s3://bucket/prefix``.
    :param start_date: the first run.
    :param postgres_table: also keep the current table in PostgreSQL (``postgres_conn_id``): a typed table of
        this name (``schema.table`` allowed; ``{table}`` placeholder with ``tables``), built from the same full
        load and following the same changes and schema changes (:mod:`~exactly_once_provider.sinks.postgres_current`):
        an ``apply_postgres`` Spark application (checkpoint ``<checkpoint_location>_postgres``, pipeline
        ``<pipeline>-apply-postgres``) and, scheduled, a ``reconcile_postgres`` per table.
    :param staging_path: the full load's staged chunks: a local (for a Spark cluster: shared) directory or
        ``s3://bucket/prefix``; default next to ``table_path`` (``<table_path>._eo_full_load``).
    :param key_column: the key the reconciliation compares by; default the table's primary key (any shape: one
        integer column is bisected by value, a text or composite key by its hash). With ``tables``: a mapping
        ``{table: key}`` (tables left out use their primary key).
    :param mode: ``scheduled`` (an increment every ``every_minutes``) or ``continuous`` (a long-running capture and
        Spark stream, restarted by the ``@continuous`` schedule after ``run_for``).
    :param every_minutes: scheduled: minutes between increments.
    :param run_for: continuous: how long one run's capture and stream run before they finish cleanly.
    :param stream_interval: continuous: the Spark stream's micro-batch interval.
    :param capture_commit_interval_ms: how often the capture commits its Kafka transaction (at a source commit):
        a change is readable downstream only once committed. Default :data:`CONTINUOUS_COMMIT_INTERVAL_MS`
        continuous (freshness), the capture's own 1,000 ms scheduled (fewer, larger transactions).
    :param topic_partitions: partitions of the capture's topic.
    :param chunk_rows: rows per full-load chunk (one snapshot each); default: sized from each table's row estimate
        and the Spark application's cores.
    :param max_lag: scheduled: the capture waits while the apply is more than this many records behind.
    :param full_reconcile_hour: scheduled: each increment reconciles only the keys changed since the last clean
        reconciliation (``scope="changed"``), except the increments starting in this UTC hour (and full loads, and
        runs with the ``full_reconcile`` Param), which compare the whole table; None: never on schedule.
    :param reconcile_columns: columns compared; default every source column. With ``tables``: a mapping
        ``{table: columns}``.
    :param mysql_conn_id: the source ``mysql`` connection.
    :param kafka_config_id: the ``kafka`` connection.
    :param postgres_conn_id: the ``postgres`` connection (reconciliation results, ``postgres_table``).
    :param spark_conn_id: the ``spark`` connection.
    :param aws_conn_id: the standard ``aws`` connection of a ``table_path``, ``checkpoint_location`` or
        ``staging_path`` on S3 (credentials, ``endpoint_url`` in its extra); the ``preflight`` task checks those
        locations with it.
    :param spark_conf: extra Spark settings (e.g. ``spark.jars`` with the connectors).
    :param on_bad_record: a change record the current table cannot store: ``fail`` (the apply stops before its
        batch commits) or ``dead_letter`` (committed to each table's dead-letter store with its batch; its key is
        held back only when it is the key's newest change of the batch; the reconciliations name such keys as
        dead-lettered, not as mismatches: docs/dead-letters.md). Both applies (Delta and ``postgres_table``).
    :param max_dead_letters: ``dead_letter``: bad records allowed per micro-batch (default 100).
    :param max_dead_letter_ratio: ``dead_letter``: the share of a micro-batch's records allowed to be bad.
    :param retries: retries per task (every step is idempotent, so retries are safe); default 2, in continuous
        mode 20: there they restart a capture or stream that died, and a few kills in one run must not end it.
    :param retry_delay: delay before the first retry; default 1 minute, in continuous mode 2 seconds doubling
        per retry up to 2 minutes (a killed capture or driver is back in seconds; one that keeps failing is not
        restarted in a tight loop).
    :param tags: extra DAG tags.
    """
    try:
        from exactly_once_provider.operators.binlog_capture import BinlogCaptureOperator
    except ImportError as err:
        raise ImportError(
            "history_stream_dag needs the binlog capture operator (exactly_once_provider.operators.binlog_capture)."
        ) from err
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: use one of {MODES}.")
    if (table is None) == (tables is None) or (tables is not None and (isinstance(tables, str) or not tables)):
        raise ValueError("Name the source table with table='orders', or several with tables=['orders', ...]; not both.")
    names = [table] if tables is None else list(tables)
    several = tables is not None
    if isinstance(exclude_tables, str) or (exclude_tables and not several):
        raise ValueError(f"exclude_tables={exclude_tables!r}: a list of names or patterns, beside tables=[...].")
    # Patterns are resolved by the preflight at every run: the tasks then take their tables from its XCom.
    matched = several and (any(is_pattern(n) for n in names) or bool(exclude_tables))
    if len(set(names)) != len(names):
        raise ValueError(f"tables={names!r} names a table twice.")
    if several and TABLE not in table_path:
        raise ValueError(
            f"tables={names!r}: table_path must name each table's location with the {TABLE} placeholder "
            f"(one current table per table), got {table_path!r}."
        )
    if several and ALL_TABLES in names:
        raise ValueError(f"tables={names!r}: {ALL_TABLES!r} names the apply's checkpoint of all tables; rename it.")
    if several and postgres_table is not None and TABLE not in postgres_table:
        raise ValueError(
            f"tables={names!r}: postgres_table must name each table's PostgreSQL table with the "
            f"{TABLE} placeholder, got {postgres_table!r}."
        )

    def path_of(name: str) -> str:
        return table_path.replace(TABLE, name)

    def staging_of(name: str) -> str | None:
        return staging_path.replace(TABLE, name) if staging_path else None

    # Several tables share ONE streaming query, so one checkpoint (a {table} placeholder names it ALL_TABLES).
    checkpoint = checkpoint_location.replace(TABLE, ALL_TABLES)
    for n in [EXAMPLE_TABLE] if matched else names:  # matched tables: the locations' form, checked on a stand-in
        owner, bare = split_name(n, schema)
        FullLoadRequest(schema=owner, table=bare, sink_path=path_of(n), staging_path=staging_of(n)).validate()
    continuous = mode == "continuous"
    apply_pipeline = f"{pipeline}-apply"

    # [START howto_template_per_table]
    def per_table(name: str) -> dict[str, Any]:
        """Return what the tasks need of table ``name`` (``schema.table`` for another schema's)."""
        owner, source_table = split_name(name, schema)
        topic, path = f"{pipeline}.{owner}.{source_table}", path_of(name)  # the capture's default topic template
        checked = {
            "table": f"{owner}.{source_table}",
            "key_column": _per_table(key_column, name),
            "columns": _per_table(reconcile_columns, name),
            "topics": [topic],
            "full_load_path": path,
        }
        found = {
            "topic": topic,
            "path": path,
            "stream": {"topics": [topic], "sink_path": path},
            "reconcile": {**checked, "name": f"{pipeline}.{name}" if several else pipeline, "sink_path": path},
        }
        if postgres_table is not None:
            sink_table = postgres_table.replace(TABLE, name.replace(".", "_"))  # not a PostgreSQL schema
            found["pg_stream"] = {**found["stream"], "sink_table": sink_table}
            found["reconcile_postgres"] = {
                **checked,
                "name": f"{pipeline}.{name}.postgres" if several else f"{pipeline}.postgres",
                "sink_table": sink_table,
            }
        return found

    def for_tasks(current: list[str]) -> dict[str, Any]:
        """Return what the tasks take of the tables ``current``: ONE rule for tables named here and tables matched
        at run time (the preflight pushes these as XComs for the matched ones)."""
        tasks = [per_table(n) for n in current]
        if postgres_table is not None:
            _require_distinct("postgres_table", [t["pg_stream"]["sink_table"] for t in tasks], current)
        found = {
            "tables": current,
            "capture_tables": [t["reconcile"]["table"] for t in tasks],
            "full_load_paths": {t["reconcile"]["table"]: t["path"] for t in tasks},
            "topics": [t["topic"] for t in tasks],
            "paths": [t["path"] for t in tasks],
            "streams": [t["stream"] for t in tasks],
            "reconciles": [t["reconcile"] for t in tasks],
        }
        if postgres_table is not None:
            found["pg_streams"] = [t["pg_stream"] for t in tasks]
            found["reconciles_postgres"] = [t["reconcile_postgres"] for t in tasks]
        return found

    # [END howto_template_per_table]
    seconds = run_for.total_seconds()
    with DAG(
        dag_id=dag_id,
        schedule="@continuous" if continuous else timedelta(minutes=every_minutes),
        start_date=start_date,
        catchup=False,
        max_active_runs=1,  # one capture per ledger key; increments follow each other
        default_args=_retry_policy(continuous, retries, retry_delay),
        tags=["exactly-once", "cdc", *tags],
        params={
            "full_reload": Param(
                False,
                type="boolean",
                description="take a new snapshot, replace the table atomically and restart "
                "the stream from its position",
            ),
            "resnapshot": Param(
                [],
                type="array",
                items={"type": "string"},
                description="tables to take a new snapshot of (replaced atomically, each stream continuing from "
                "its new position) while the others go on: "
                + ("any table the patterns match" if matched else f"any of {names}"),
            ),
            "full_reconcile": Param(
                False,
                type="boolean",
                description="compare the whole table, not only the keys changed since the last clean reconciliation",
            ),
        },
        doc_md=__doc__,
    ) as dag:

        @task
        def preflight(ti: Any = None) -> dict:
            """Check the server and table are fit for a full load and a binlog capture, S3 locations usable, and
            the Kafka and PostgreSQL connections accepted: a refused endpoint fails here, before anything is
            written. Tables by pattern: resolve them first, and return what each task needs of them."""
            from exactly_once_provider.capture.change_record import DEFAULT_TOPIC_TEMPLATE, topic_for
            from exactly_once_provider.connections import (
                check_kafka_access,
                explain_kafka_denials,
                postgres_connection,
            )
            from exactly_once_provider.hooks.kafka_client import kafka_client_config
            from exactly_once_provider.kafka.offsets import DEFAULT_OFFSETS_TOPIC
            from exactly_once_provider.kafka.topics import partitions_of
            from exactly_once_provider.source.table_patterns import resolve_schema_tables
            from exactly_once_provider.storage.preflight import preflight_locations
            from exactly_once_provider.storage.s3 import settings_for

            current = names
            if matched:  # one query per schema the entries name
                current = resolve_schema_tables(
                    MySqlSourceHook(mysql_conn_id).base_tables, names, exclude_tables, schema
                )
                if ALL_TABLES in current:
                    raise ValueError(f"Table {ALL_TABLES!r} names the apply's checkpoint of all tables; exclude it.")
                print(f"preflight ok: tables={names} exclude_tables={list(exclude_tables)}: {len(current)} table(s)")
            found = {}
            for name in current:
                checked = MySqlSourceHook(mysql_conn_id).preflight(*split_name(name, schema))
                print(
                    f"preflight ok: {name}: {checked.server.version_string}, key {list(checked.key.columns)}, "
                    f"~{checked.estimated_rows} rows"
                )
                found[name] = {"key": list(checked.key.columns), "estimated_rows": checked.estimated_rows}
            locations = [
                *(path_of(n) for n in current),
                checkpoint,
                *(s for s in (staging_of(n) for n in current) if s),
            ]
            for storage in preflight_locations(locations, settings_for(aws_conn_id, *locations)):
                print(f"preflight ok: {storage}")
            config = kafka_client_config(kafka_config_id)
            admin = check_kafka_access(config, kafka_config_id)
            topics = [
                DEFAULT_OFFSETS_TOPIC,
                *(topic_for(DEFAULT_TOPIC_TEMPLATE, pipeline, *split_name(n, schema)) for n in current),
            ]
            with explain_kafka_denials(
                kafka_config_id, config, f"Describe on topics {topics!r}, and the rest docs/security.md lists"
            ):
                partitions_of(admin, topics)  # the ACLs the first topic request needs, before the full load writes
            print(f"preflight ok: Kafka connection {kafka_config_id!r}, topics {topics!r} described")
            postgres_connection(postgres_conn_id).close()
            print(f"preflight ok: PostgreSQL connection {postgres_conn_id!r}")
            if matched:  # the tasks take the tables from these XComs
                for key, value in for_tasks(current).items():
                    ti.xcom_push(key=key, value=value)
            return found if several else found[table]

        @task.branch
        def choose_load(params: dict | None = None, ti: Any = None) -> str | list[str]:
            """Run the full load on the first run or when ``full_reload`` is set; otherwise continue.

            Several tables: the full loads of the tables without one (all on ``full_reload``, those named by
            ``resnapshot``), and the retention guard unless every table is loaded afresh.
            """
            from exactly_once_provider.full_load.handoff import has_full_load
            from exactly_once_provider.storage.s3 import register_settings, settings_for

            current = ti.xcom_pull(task_ids="preflight", key="tables") if matched else names
            s3 = settings_for(aws_conn_id, *(path_of(n) for n in current))
            if s3 is not None:  # the table's log is read through them
                register_settings(s3)
            reload = str((params or {}).get("full_reload", False)).lower() == "true"
            again = set((params or {}).get("resnapshot") or [])
            if again - set(current):
                raise ValueError(f"resnapshot names {sorted(again - set(current))}; this DAG follows {current}.")
            unloaded = [n for n in current if reload or n in again or not has_full_load(path_of(n))]
            if not unloaded:
                return "retention_guard"
            # The full load leaves the loaded tables as they are; the guard checks the stream of those.
            return ["full_load"] + (["retention_guard"] if len(unloaded) < len(current) else [])

        checks = preflight()
        named = None if matched else for_tasks(names)

        def each(key: str) -> Any:
            """Return what a task takes of every table (``for_tasks``): the preflight's XCom for matched tables."""
            return checks[key] if matched else named[key]

        # Tables matched at run time are not known here: their lineage is reported per table by each task.
        assets = {
            n: Asset(
                name=f"{dag_id}.{n}" if several else f"{dag_id}.table", uri=lineage.storage_path(path_of(n)).asset_uri
            )
            for n in ([] if matched else names)
        }
        # [START howto_operator_full_load]
        full_load = MySqlFullLoadOperator(
            task_id="full_load",
            **({"tables": each("tables")} if several else {"table": table}),  # several: one Spark application
            schema=schema,
            sink_path=table_path if several else path_of(table),  # several: the {table} placeholder
            staging_path=staging_path if several else staging_of(table),
            chunk_rows=chunk_rows,
            full_reload="{{ params.full_reload }}",
            reload_tables="{{ params.resnapshot | tojson }}",
            mysql_conn_id=mysql_conn_id,
            spark_conn_id=spark_conn_id,
            aws_conn_id=aws_conn_id,
            spark_conf=spark_conf,
            outlets=list(assets.values()),
            capture_pipeline=pipeline,
            capture_source_partition=CAPTURE_SOURCE_PARTITION,
            kafka_config_id=kafka_config_id,
        )
        # [END howto_operator_full_load]
        # [START howto_operator_retention_guard]
        guard = BinlogRetentionGuardOperator(
            task_id="retention_guard",
            capture_pipeline=pipeline,
            capture_source_partition=CAPTURE_SOURCE_PARTITION,
            mysql_conn_id=mysql_conn_id,
            kafka_config_id=kafka_config_id,
        )
        # [END howto_operator_retention_guard]
        # [START howto_operator_binlog_capture]
        capture = BinlogCaptureOperator(
            task_id="capture",
            tables=each("capture_tables"),
            pipeline=pipeline,
            full_load_paths=each("full_load_paths"),
            mode=mode if continuous else "bounded",
            max_runtime=seconds if continuous else None,
            source_partition=CAPTURE_SOURCE_PARTITION,
            topic_partitions=topic_partitions,
            mysql_conn_id=mysql_conn_id,
            kafka_config_id=kafka_config_id,
            aws_conn_id=aws_conn_id,
            trigger_rule="none_failed_min_one_success" if continuous else "all_success",
            commit_interval_ms=capture_commit_interval_ms or (CONTINUOUS_COMMIT_INTERVAL_MS if continuous else 1_000),
            on_drop="stop" if matched else "fail",  # tables by pattern come and go
        )
        # [END howto_operator_binlog_capture]
        # on_bad_record="dead_letter": both applies' settings (the reconciliations read the letters by sink_pipeline)
        bad_records = dead_letters.operator_settings(on_bad_record, max_dead_letters, max_dead_letter_ratio)
        # Several tables: one Spark application, ONE query split per table into each current table.
        where = {"streams": each("streams")} if several else per_table(table)["stream"]
        # [START howto_operator_spark_kafka_to_sink_current]
        apply = SparkKafkaToSinkOperator(
            task_id="apply",
            pipeline=apply_pipeline,
            sink="delta",
            **where,
            checkpoint_location=checkpoint,
            mode="current",
            trigger="processing-time" if continuous else "available-now",
            interval=stream_interval,
            max_runtime=seconds if continuous else None,
            driver_restarts=CONTINUOUS_DRIVER_RESTARTS if continuous else 0,
            **bad_records,
            kafka_conn_id=kafka_config_id,
            spark_conn_id=spark_conn_id,
            aws_conn_id=aws_conn_id,
            conf=dict(spark_conf or {}),
            outlets=list(assets.values()),
            trigger_rule="none_failed_min_one_success" if continuous else "all_success",
        )
        # [END howto_operator_spark_kafka_to_sink_current]
        apply_postgres = None
        if postgres_table is not None:  # the same changes into the typed PostgreSQL table built from the full load
            pg_where = {"streams": each("pg_streams")} if several else per_table(table)["pg_stream"]
            apply_postgres = SparkKafkaToSinkOperator(
                task_id="apply_postgres",
                pipeline=f"{pipeline}-apply-postgres",
                sink="postgres",
                **pg_where,
                checkpoint_location=checkpoint.rstrip("/") + "_postgres",
                mode="current",
                trigger="processing-time" if continuous else "available-now",
                interval=stream_interval,
                max_runtime=seconds if continuous else None,
                driver_restarts=CONTINUOUS_DRIVER_RESTARTS if continuous else 0,
                **bad_records,
                kafka_conn_id=kafka_config_id,
                postgres_conn_id=postgres_conn_id,
                spark_conn_id=spark_conn_id,
                aws_conn_id=aws_conn_id,
                conf=dict(spark_conf or {}),
                trigger_rule="none_failed_min_one_success" if continuous else "all_success",
            )
        choice = choose_load()
        checks >> choice
        loaded = [full_load, guard]
        choice >> loaded
        if continuous:
            loaded >> capture
            loaded >> apply
            if apply_postgres is not None:
                loaded >> apply_postgres
            return dag
        # run_after: when a run was due (a manual run: its trigger time); the data interval is None on manual runs.
        on_schedule = (
            "false"
            if full_reconcile_hour is None
            else (
                f"dag_run.run_after.hour == {int(full_reconcile_hour)} and dag_run.run_after.minute < {every_minutes}"
            )
        )
        # Whether this run loaded the table: the full load's own XCom (it mirrors the handoff positions) exists only if
        # it ran. Not choose_load's answer: when a branch skips tasks, Airflow 3's SkipMixin raises
        # DownstreamTasksSkipped out of execute(), so the branch's return value never reaches XCom. Several tables:
        # the tables it loaded (compared in full, the others by scope).
        loaded_now = (
            "{{ ((ti.xcom_pull(task_ids='full_load') or {}).get('tables') or {}) | list | tojson }}"
            if several
            else "ti.xcom_pull(task_ids='full_load') is not none"
        )
        reconcile_scope = (
            "{{ 'full' if params.full_reload or params.full_reconcile or "
            + ("false" if several else loaded_now)
            + " or ("
            + on_schedule
            + ") else 'changed' }}"
        )
        # Several tables: ONE lag gate (the apply's lag over all their topics) and ONE reconciliation task.
        one = per_table(table) if not several else None
        # [START howto_sensor_consumer_lag]
        lag_gate = ConsumerLagSensor(
            task_id="lag_gate",
            topics=each("topics") if several else [one["topic"]],
            max_lag=max_lag,
            sink="delta",
            sink_location=each("paths") if several else one["path"],  # several: their lags add up
            sink_pipeline=apply_pipeline,
            missing_topics_ok=True,
            kafka_config_id=kafka_config_id,
            aws_conn_id=aws_conn_id,
            timeout=3600,
            trigger_rule="none_failed_min_one_success",
        )
        # [END howto_sensor_consumer_lag]
        # [START howto_operator_reconcile_current]
        compared = {  # both reconciliations: the current table at the capture's committed position
            "sink_deleted_column": DELETED_COLUMN,
            "capture_pipeline": pipeline,
            "capture_source_partition": CAPTURE_SOURCE_PARTITION,
            "scope": reconcile_scope,
            "full_scope_tables": loaded_now if several else None,
            "mysql_conn_id": mysql_conn_id,
            "postgres_conn_id": postgres_conn_id,
            "kafka_config_id": kafka_config_id,
            "aws_conn_id": aws_conn_id,
        }
        reconcile = ReconcileOperator(
            task_id="reconcile",
            **({"tables": each("reconciles")} if several else one["reconcile"]),  # name, table, key_column...
            sink="delta",
            sink_pipeline=apply_pipeline,
            spark_conn_id=spark_conn_id,
            spark_conf=spark_conf,
            **compared,
        )
        # [END howto_operator_reconcile_current]
        loaded >> lag_gate >> capture
        apply >> reconcile
        if apply_postgres is not None:
            # [START howto_operator_reconcile_current_postgres]
            reconcile_postgres = ReconcileOperator(
                task_id="reconcile_postgres",
                **({"tables": each("reconciles_postgres")} if several else one["reconcile_postgres"]),
                sink="postgres",
                sink_pipeline=f"{pipeline}-apply-postgres",
                **compared,
            )
            # [END howto_operator_reconcile_current_postgres]
            apply_postgres >> reconcile_postgres
        capture >> apply
        if apply_postgres is not None:
            apply >> apply_postgres  # one Spark application at a time on the workers
    return dag


def _require_distinct(argument: str, rendered: list[str], tables: list[str]) -> None:
    """Raise ValueError when two tables would share one location (``billing.a_b`` and ``billing_a.b``)."""
    seen: dict[str, str] = {}
    for value, table in zip(rendered, tables, strict=True):
        if value in seen:
            raise ValueError(
                f"{argument}: tables {seen[value]!r} and {table!r} would both write {value!r}; rename one."
            )
        seen[value] = table


def _retry_policy(continuous: bool, retries: int | None, retry_delay: timedelta | None) -> dict[str, object]:
    """Return the tasks' retry settings: a scheduled increment retries after a minute; a continuous run restarts a
    dead capture or stream in seconds, backing off while it keeps failing."""
    if not continuous:
        return {"retries": 2 if retries is None else retries, "retry_delay": retry_delay or timedelta(minutes=1)}
    return {
        "retries": CONTINUOUS_RETRIES if retries is None else retries,
        "retry_delay": retry_delay or CONTINUOUS_RETRY_DELAY,
        "retry_exponential_backoff": True,
        "max_retry_delay": max(CONTINUOUS_MAX_RETRY_DELAY, retry_delay or CONTINUOUS_RETRY_DELAY),
    }
