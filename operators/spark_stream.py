"""Submit the packaged Kafka -> sink streaming job (through the Spark provider's SparkSubmitOperator).

How it is submitted (local, client, standalone cluster mode with the driver on a worker) is the base's:
:class:`~exactly_once_provider.operators.spark_submit.PackagedSparkJobOperator`.

Where the guarantees live: not here. The job commits each micro-batch and its Kafka offsets in the sink
(:mod:`exactly_once_provider.spark_jobs.kafka_to_sink`), so a retry or a rerun simply submits the job again:
it continues from what the sink holds. XCom only mirrors the sink's committed state, read back after the run.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from exactly_once_provider import lineage
from exactly_once_provider import lineage_facets as facets
from exactly_once_provider.connections import libpq_environment
from exactly_once_provider.hooks.kafka_client import checked_kafka_config
from exactly_once_provider.kafka_config import portable_kafka_config, spark_kafka_options
from exactly_once_provider.operators.spark_submit import PackagedSparkJobOperator
from exactly_once_provider.plugins.links import PipelineStatusLink, SparkUILink
from exactly_once_provider.spark_jobs.packages import S3A_PACKAGES, SPARK_PACKAGES
from exactly_once_provider.spark_jobs.stream_spec import Route, StreamSpec, split_topics
from exactly_once_provider.storage import is_s3


class SparkKafkaToSinkOperator(facets.OpenLineageMixin, PackagedSparkJobOperator):
    """Run the exactly-once Kafka -> sink Spark job once (availableNow) or as a long stream (processing time).

    :param pipeline: stable pipeline name; part of every sink commit. Never derive it from the run or try.
    :param topics: Kafka topics to read (read_committed); with ``streams``, leave it unset.
    :param streams: several tables in ONE Spark application, instead of ``topics``/``sink_path``/``sink_table``:
        a list of ``{"topics": [...], "sink_path": ... | "sink_table": ...}``, each table's topics into its own
        sink (in ``current`` mode: one source table's topic into that table's current table). With
        ``checkpoint_location`` set, the tables share ONE streaming query over all their topics: each
        micro-batch is split per table, and only the tables it touches are read and committed, so a batch
        costs what its changed tables cost, however many are followed. Without it, each stream names its own
        ``checkpoint_location`` and runs its own query (a failure of one stops the others). Each table commits
        exactly once as a one-table run does. XCom returns ``{"streams": {sink location: committed state}}``.
    :param sink: ``delta``, ``postgres``, ``files`` or ``iceberg`` (the table ``sink_table``, ``namespace.table``, in
        the SQL catalog of ``iceberg_conn_id``, created at ``sink_path``; ``mode="current"``: built from the Delta
        full load at ``sink_path``, at ``<sink_path>_iceberg``: docs/iceberg.md).
    :param checkpoint_location: this pipeline's Spark checkpoint directory (with ``streams``: the query they
        share).
    :param sink_path: the Delta table or files sink directory (``delta`` / ``files``), local or on S3 or an
        S3-compatible store, ``s3://bucket/prefix`` (Spark writes it through ``s3a``); the checkpoint location
        may be on S3 as well.
    :param aws_conn_id: the standard ``aws`` connection of an ``s3://`` sink path or checkpoint (credentials, ``endpoint_url``
        and ``region_name`` in its extra); they reach the driver in the job's secrets file, never the command
        line. The location is checked before the job starts (reachable, credentials, bucket, conditional writes).
    :param sink_table: the PostgreSQL table (``postgres``); the offsets table ``eo_stream_offsets`` sits next to it.
        ``iceberg``: the Iceberg table, ``namespace.table``.
    :param iceberg_conn_id: ``iceberg``: the ``postgres`` connection of the database holding the SQL catalog (its
        ``iceberg_tables`` table); its settings reach the driver in the job's secrets file.
    :param iceberg_catalog: ``iceberg``: the catalog's name (a Java JDBC catalog of that name sees the same tables).
    :param kafka_conn_id: Kafka connection (its Extra is the confluent-kafka configuration, SASL/TLS included);
        the job gets it in a file only its owner can read, removed after the run, never on the command line.
    :param postgres_conn_id: PostgreSQL connection (``postgres`` sink); its settings (TLS included) reach the
        driver as libpq ``PG*`` variables in the same file as the Kafka settings, never the command line.
    :param spark_conn_id: Spark connection (``local[*]``, ``spark://host:port``...). It must exist.
    :param trigger: ``available-now`` (process what is there, then stop) or ``processing-time``.
    :param interval: processing-time trigger interval, e.g. ``"30 seconds"``.
    :param max_offsets_per_trigger: cap on records per micro-batch.
    :param max_runtime: ``processing-time``: seconds after which the stream stops cleanly and the task succeeds
        (a supervising schedule starts the next one); default: run until the task is stopped. A driver
        restarted within the try (``driver_restarts``) runs for what is left of it.
    :param mode: ``append`` (records), ``cdc`` (apply changes by key into a changes table; newer source version
        wins; deletes kept as tombstones; needs the ``delta`` or ``postgres`` sink), ``current`` (merge the
        binlog capture's changes into the full load's Delta table ``sink_path``, typed like its rows, on the
        source key: ONE current table, read with ``WHERE NOT _eo_deleted``; see
        :mod:`~exactly_once_provider.sinks.current_table`; with the ``postgres`` sink, the typed table
        ``sink_table`` is built from the full load in ``sink_path`` and follows it the same way:
        :mod:`~exactly_once_provider.sinks.postgres_current`) or ``window`` (settlement batches of
        :class:`~exactly_once_provider.operators.watermark_extract.WatermarkExtractOperator`, all sinks).
        In ``window`` mode each batch, framed by begin/end markers, REPLACES its window's output in ONE
        atomic sink commit together with the offsets; a re-extracted version supersedes the older one and an
        older version never wins; a batch whose end marker was not read yet is never published (it is read
        again whole by the next micro-batch or run). The window is ``<pipeline>/<source_partition>/<batch_id>``
        of the extract task; rows carry ``window_id``, ``window_version``, ``kafka_topic``,
        ``kafka_partition``, ``kafka_offset``, ``record_key``, ``record_value`` (the JSON row). Where the
        versions live: Delta: the commit marker (``windows``), replaced with ``replaceWhere``; PostgreSQL:
        table ``eo_stream_windows`` next to ``sink_table``, same transaction; files: the manifest, one
        directory per window version under ``windows/``. A settlement DAG runs the extract task, then this
        operator with ``mode="window"``, ``trigger="available-now"`` on the extract's topic; XCom returns the
        sink state including ``windows`` (id -> version, rows). Window mode needs ``delivery="exactly-once"``.
    :param key_field: CDC: JSON field of the record value holding the primary key.
    :param version_field: CDC: JSON field holding the change's source version (e.g. its binlog position).
    :param op_field: CDC: JSON field holding the operation (``d`` or ``delete`` deletes).
    :param on_bad_record: a record the sink cannot store (a key or value that is not valid UTF-8; for
        PostgreSQL, text holding a NUL character): ``fail`` (the default) stops the job before its batch
        commits and names it; ``dead_letter`` commits it to the dead-letter store with its batch, in the same
        exactly-once step as the batch's good records (every mode, window mode not into ``files``; in ``cdc`` /
        ``current`` mode a key is held back only when its newest change of the batch is the letter; a settlement
        window settles without the bad record and counts it: docs/dead-letters.md). The task log counts each
        batch's dead letters.
    :param max_dead_letters: ``dead_letter``: bad records allowed in one batch (default 100); a batch holding
        more fails with nothing of it committed, and the error names the limit and the store.
    :param max_dead_letter_ratio: ``dead_letter``: the share of a batch's records allowed to be bad
        (0 < ratio <= 1), checked as well.
    :param dead_letter_store: ``dead_letter``: the PostgreSQL table (``postgres``, default
        ``<sink_table>_dead_letters``, created if missing, written in the batch's transaction) or the Delta
        table's location (``delta``, default ``<sink_path>_dead_letters``, committed before the batch's sink
        commit under an offset watermark); the ``files`` sink lists its letters in the batch's manifest (not
        settable); with ``streams``, leave it unset (each table's default).
    :param delivery: ``exactly-once``; ``at-least-once`` is a plain append without sink-side progress (a
        benchmark baseline, never a fallback).
    :param packages: Maven coordinates for ``--packages``; default :data:`~exactly_once_provider.spark_jobs.packages.SPARK_PACKAGES`
        unless ``jars`` or ``conf["spark.jars"]`` provides the connectors.
    :param jars: connector jar paths for ``--jars``.
    :param conf: extra Spark configuration.
    :param deploy_mode: overrides the connection's ``deploy-mode``. ``cluster`` on a ``spark://`` standalone
        master runs the Python driver on a worker: the job is submitted as the JVM application
        ``org.apache.spark.deploy.PythonRunner`` (Spark refuses ``.py`` applications there), the driver is
        tracked by id until it ends (the connection's Extra ``rest-port`` must name the master's REST port,
        ``spark.master.rest.enabled=true`` on the master) and ``on_kill`` kills it. The worker must read the
        same paths as this machine (the job file, the package zip, the jars: a shared disk or the same
        install) and run the driver with ``conf["spark.pyspark.driver.python"]`` (default: this interpreter).
        The driver gets spark-submit's environment (Spark's standalone client forwards it), minus ``AIRFLOW*``
        variables.
    :param driver_memory: driver memory.
    :param env_vars: extra environment for the driver (e.g. ``PYSPARK_PYTHON``).
    """

    template_fields: Sequence[str] = (
        "pipeline",
        "topics",
        "streams",
        "sink",
        "checkpoint_location",
        "sink_path",
        "sink_table",
        "trigger",
        "interval",
        "max_offsets_per_trigger",
        "max_runtime",
        "mode",
        "on_bad_record",
        "max_dead_letters",
        "max_dead_letter_ratio",
        "dead_letter_store",
        "iceberg_conn_id",  # templated, so serialized: the status page reads the Iceberg sink through its catalog
        "iceberg_catalog",
        "conf",
    )
    ui_color = "#e8f4d9"
    operator_extra_links = (PipelineStatusLink(), SparkUILink())
    job_name = "kafka_to_sink"
    job_module = "exactly_once_provider.spark_jobs.kafka_to_sink"
    # Adaptive query execution off: a micro-batch of a few hundred changes gains nothing from re-planning at
    # each shuffle (two partitions to begin with), and each action paid a job per shuffle stage and a new plan
    # between them (4 followed tables at 500 changes/s on 2 cores: a table's commit 2.8 -> 2.1 s, freshness p99
    # 6.6 -> 5.5 s, benchmarks/bench_freshness.py --tables 4). The user's conf may turn it on again.
    default_conf = {"spark.sql.shuffle.partitions": "2", "spark.sql.adaptive.enabled": "false"}
    # A bounded run lives ~20 s: the JVM's C2 compiler threads then only compete with the job for the cores
    # (measured: apply of 1,000 changes 21.3 -> 18.2 s on 2 cores, make bench-increment); a long stream keeps C2.
    bounded_run_conf = {
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
        "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1",
    }

    def __init__(
        self,
        *,
        pipeline: str,
        topics: str | Sequence[str] | None = None,
        sink: str,
        checkpoint_location: str | None = None,
        streams: Sequence[dict[str, Any]] | None = None,
        sink_path: str | None = None,
        sink_table: str | None = None,
        kafka_conn_id: str = "kafka_default",
        postgres_conn_id: str = "postgres_default",
        aws_conn_id: str = "aws_default",
        iceberg_conn_id: str = "postgres_default",
        iceberg_catalog: str = "eo",
        spark_conn_id: str = "spark_default",
        trigger: str = "available-now",
        interval: str = "30 seconds",
        max_offsets_per_trigger: int | None = None,
        max_runtime: float | str | None = None,
        mode: str = "append",
        key_field: str = "pk",
        version_field: str = "version",
        op_field: str = "op",
        delivery: str = "exactly-once",
        on_bad_record: str = "fail",
        max_dead_letters: int | str | None = None,
        max_dead_letter_ratio: float | str | None = None,
        dead_letter_store: str | None = None,
        packages: Sequence[str] | None = None,
        jars: Sequence[str] | None = None,
        conf: dict[str, Any] | None = None,
        deploy_mode: str | None = None,
        driver_memory: str = "1g",
        env_vars: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            spark_conn_id=spark_conn_id,
            conf=conf,
            packages=packages,
            jars=jars,
            deploy_mode=deploy_mode,
            driver_memory=driver_memory,
            env_vars=env_vars,
            **kwargs,
        )
        self.pipeline = pipeline
        self.topics = topics
        self.streams = streams
        self._views: list[SparkKafkaToSinkOperator] | None = None
        self.sink = sink
        self.checkpoint_location = checkpoint_location
        self.sink_path = sink_path
        self.sink_table = sink_table
        self.kafka_conn_id = kafka_conn_id
        self.postgres_conn_id = postgres_conn_id
        self.aws_conn_id = aws_conn_id
        self.iceberg_conn_id = iceberg_conn_id
        self.iceberg_catalog = iceberg_catalog
        self._s3 = None
        self.trigger = trigger
        self.interval = interval
        self.max_offsets_per_trigger = max_offsets_per_trigger
        self.max_runtime = max_runtime
        self.mode = mode
        self.key_field = key_field
        self.version_field = version_field
        self.op_field = op_field
        self.delivery = delivery
        self.on_bad_record = on_bad_record
        self.max_dead_letters = max_dead_letters
        self.max_dead_letter_ratio = max_dead_letter_ratio
        self.dead_letter_store = dead_letter_store
        self._before: dict | None = None
        self._before_version = -1

    def job_label(self) -> str:
        return f"pipeline {self.pipeline}"

    def app_name(self) -> str:
        """Name the application after the pipeline: one stream per pipeline, found by it in Spark's UI."""
        return f"eo-{self.pipeline}"

    # ------------------------------------------------------------------------------------------ checks
    def _routes(self) -> tuple[Route, ...]:
        routes = []
        for item in self.streams or ():
            unknown = sorted(set(item) - {"topics", "sink_path", "sink_table", "checkpoint_location"})
            if unknown:
                raise ValueError(
                    f"streams: unknown settings {unknown}; each stream names topics, sink_path or "
                    "sink_table, and checkpoint_location."
                )
            routes.append(
                Route(
                    topics=split_topics(item.get("topics") or ()),
                    checkpoint=item.get("checkpoint_location") or "",
                    path=item.get("sink_path") if self._reads_path() else None,
                    table=item.get("sink_table") if self.sink == "postgres" else None,
                )
            )
        return tuple(routes)

    def stream_views(self) -> list[SparkKafkaToSinkOperator]:
        """Return one one-table view of this operator per stream (itself without ``streams``).

        A view is this operator with one stream's topics, sink and checkpoint: the sink reads, checks and
        lineage of a one-table run apply to each stream unchanged.
        """
        if not self.streams:
            return [self]
        if self._views is None:
            views = []
            for route in self._routes():
                view = copy.copy(self)
                view.streams, view._views, view._s3 = None, None, None
                view.topics = list(route.topics)
                view.checkpoint_location = route.checkpoint or self.checkpoint_location
                view.sink_path, view.sink_table = route.path, route.table
                views.append(view)
            self._views = views
        return self._views

    def _stream_spec(self) -> StreamSpec:
        routed = bool(self.streams)
        if routed and (split_topics(self.topics or ()) or self.sink_path or self.sink_table):
            raise ValueError(
                "streams name each table's topics and sink: leave topics, sink_path and sink_table unset beside them."
            )
        return StreamSpec(
            pipeline=self.pipeline,
            topics=() if routed else split_topics(self.topics or ()),
            checkpoint=self.checkpoint_location or "",
            routes=self._routes(),
            sink=self.sink,
            path=self.sink_path if self._reads_path() and not routed else None,
            table=self.sink_table if self.sink in ("postgres", "iceberg") and not routed else None,
            trigger=self.trigger,
            interval=self.interval,
            max_offsets_per_trigger=int(self.max_offsets_per_trigger) if self.max_offsets_per_trigger else None,
            max_runtime=self._runtime_left(),
            mode=self.mode,
            key_field=self.key_field,
            version_field=self.version_field,
            op_field=self.op_field,
            delivery=self.delivery,
            on_bad_record=self.on_bad_record,
            max_dead_letters=_number(self.max_dead_letters, int, "max_dead_letters"),
            max_dead_letter_ratio=_number(self.max_dead_letter_ratio, float, "max_dead_letter_ratio"),
            dead_letter_store=self.dead_letter_store or None,
        ).validate()

    def _runtime_left(self) -> float | None:
        """Return ``max_runtime`` in seconds, less what this try's earlier drivers ran (a restarted driver)."""
        if self.max_runtime in (None, "", "None"):
            return None
        return float(self.max_runtime) - (self.restarted_after or 0.0)

    def may_restart(self, elapsed: float) -> bool:
        """Restart a killed driver only while the stream's ``max_runtime`` has time left."""
        return self.max_runtime in (None, "", "None") or float(self.max_runtime) > elapsed

    def _reads_path(self) -> bool:
        """Whether ``sink_path`` is read: the sink's own location, or (PostgreSQL current table) its full load."""
        return self.sink != "postgres" or self.mode == "current"

    def _sink_on_s3(self) -> bool:
        return self._reads_path() and bool(self.sink_path) and is_s3(self.sink_path)

    def _on_s3(self) -> bool:
        if self.streams:
            return any(view._on_s3() for view in self.stream_views())
        return self._sink_on_s3() or is_s3(self.checkpoint_location or "")

    def _s3_settings(self):
        """Return the S3 settings of ``aws_conn_id`` (read once per run), or None for a local sink path."""
        if self._s3 is None and self._on_s3():
            from exactly_once_provider.storage.s3 import S3Settings

            self._s3 = S3Settings.from_connection(self.aws_conn_id)
        return self._s3

    def _kafka_config(self) -> dict[str, Any]:
        """Return the Kafka connection's settings for the job; refuse what its Spark source cannot use."""
        config = portable_kafka_config(checked_kafka_config(self.kafka_conn_id))
        try:
            spark_kafka_options(config)
        except ValueError as err:
            raise ValueError(f"Kafka connection {self.kafka_conn_id!r}: {err}") from None
        return config

    # ------------------------------------------------------------------------------------------ run
    def job_default_conf(self) -> dict[str, str]:
        bounded = self.trigger == "available-now"
        return {**self.default_conf, **(self.bounded_run_conf if bounded else {})}

    def job_params(self, context: Any) -> dict[str, Any]:
        return self._stream_spec().to_json()

    def job_secrets(self) -> dict[str, Any]:
        # The job's secrets travel in one file only its owner can read, never in spark-submit's arguments or
        # environment (on YARN and Kubernetes the Spark provider turns env_vars into --conf arguments).
        secrets: dict[str, Any] = {"kafka": self._kafka_config()}
        if self.sink == "postgres":
            secrets["libpq"] = libpq_environment(self.postgres_conn_id)
        if self._s3_settings() is not None:
            secrets["s3"] = self._s3_settings().to_json()
        if self.sink == "iceberg":
            secrets["iceberg"] = self._iceberg_catalog()
        return secrets

    def _iceberg_catalog(self) -> dict[str, Any]:
        """Return the settings of the Iceberg sink's catalog (they hold a password: the secrets file only)."""
        from exactly_once_provider.sinks.iceberg import catalog_settings

        return catalog_settings(self.iceberg_conn_id, self.iceberg_catalog)

    def default_packages(self) -> tuple[str, ...]:
        return SPARK_PACKAGES + (S3A_PACKAGES if self._on_s3() else ())

    def _sink_location(self) -> str | None:
        return self.sink_table if self.sink in ("postgres", "iceberg") else self.sink_path

    def sink_state(self) -> dict | None:
        """Read the pipeline's committed state back from the sink (the source of truth), without Spark.

        With ``streams``: ``{"streams": {sink location: state}}``.
        """
        if self.streams:
            return {"streams": {v._sink_location(): v.sink_state() for v in self.stream_views()}}
        from exactly_once_provider.connections import connect_kwargs
        from exactly_once_provider.sinks.base import open_sink

        state = open_sink(
            self.sink,
            self._sink_location(),
            self.pipeline,
            s3=self._s3_settings(),
            iceberg_catalog=self._iceberg_catalog if self.sink == "iceberg" else None,
            postgres_connect=lambda: connect_kwargs(self.postgres_conn_id),
            topics=split_topics(self.topics) if self.topics else (),
        ).committed()  # this query's
        return state.to_json() if state else None

    def before_submit(self) -> None:
        from exactly_once_provider.storage.preflight import preflight_locations

        if self.streams:
            for view in self.stream_views():
                view.before_submit()
            return
        # An unusable S3 location (the sink's or the checkpoint's) fails here, before anything is written.
        sink = self.sink_path if self._sink_on_s3() else None
        for checked in preflight_locations([sink, self.checkpoint_location], self._s3_settings()):
            self.log.info("storage %s", checked)
        self._before = self.sink_state() if self.delivery == "exactly-once" else None
        self._before_version = self._delta_version()

    def _delta_version(self) -> int:
        from exactly_once_provider.sinks.delta_log import table_state

        if self.sink != "delta" or not self.sink_path:
            return -1
        state = table_state(self._delta_table())
        return state.version if state else -1

    def _delta_table(self):
        """The Delta sink's location, or on S3 its storage (the Airflow side has the settings, not a registry)."""
        from exactly_once_provider.storage import open_storage

        return open_storage(self.sink_path, self._s3_settings()) if self._sink_on_s3() else self.sink_path

    def sink_dataset(self) -> lineage.DatasetName:
        """Name the sink: the PostgreSQL table, or the Delta / Iceberg table or files directory by its location."""
        if self.sink == "postgres":
            return lineage.postgres_table_of(self.postgres_conn_id, self.sink_table)
        if self.sink == "iceberg":
            return lineage.iceberg_table(self.sink_path, self.mode)
        return lineage.storage_path(self.sink_path)

    def openlineage_datasets(self, result: dict | None) -> tuple[list, list]:
        """The topics in; the sink out, with the Kafka end offsets committed with its rows."""
        if self.streams:
            inputs, outputs = [], []
            for view in self.stream_views():
                found = result["streams"].get(view._sink_location()) if result else None
                more_in, more_out = view.openlineage_datasets(found)
                inputs, outputs = inputs + more_in, outputs + more_out
            return inputs, outputs
        inputs = [
            facets.input_dataset(lineage.kafka_topic_of(self.kafka_conn_id, t)) for t in split_topics(self.topics)
        ]
        sink = self.sink_dataset()
        fields = None
        if self.sink == "delta":
            fields = self.lineage_fields(sink.name, lambda: facets.delta_fields(self._delta_table()))
        if result is None:
            return inputs, [facets.output_dataset(sink, fields)]
        if "batch_id" not in result:  # the run committed nothing (no batch yet): it wrote 0 rows
            return inputs, [facets.output_dataset(sink, fields, rows=0, size=0, files=0)]
        size = files = None
        if self.sink == "delta":
            size, files = facets.delta_commit_size(self._delta_table(), self._before_version, self._delta_version())
        commit = facets.CommitFacet(
            pipeline=self.pipeline, kafkaOffsets=result["offsets"], sinkVersion=result["batch_id"]
        )
        return inputs, [
            facets.output_dataset(sink, fields, rows=result["rows_this_run"], size=size, files=files, commit=commit)
        ]

    def job_result(self, result: Any, context: Any) -> dict | None:
        # XCom mirrors the sink, read here; the driver's own answer is not needed (and absent on a reconnect).
        if self.delivery != "exactly-once":
            return None
        if self.streams:
            views = self.stream_views()
            states = {v._sink_location(): v.job_result(None, context) for v in views}
            self.openlineage_result = {"streams": {v._sink_location(): v.openlineage_result for v in views}}
            return {"streams": states}
        before, after = self._before, self.sink_state()
        self.log.info(
            "pipeline %s: sink %s committed batch %s of checkpoint %s, %s rows in total (%s before "
            "this run); offsets %s",
            self.pipeline,
            self.sink,
            after and after["batch_id"],
            after and after["checkpoint_id"],
            after and after["rows_total"],
            before["rows_total"] if before else 0,
            after and after["offsets"],
        )
        if after is not None:
            after["rows_this_run"] = after["rows_total"] - (before["rows_total"] if before else 0)
        # Lineage of a run that committed nothing still says what it wrote: 0 rows (the XCom stays None).
        self.openlineage_result = after if after is not None else {"rows_this_run": 0}
        return after


def _number(value: Any, kind: type, name: str) -> Any:
    """Return a templated number (a rendered template is a string) as ``kind``; None when unset."""
    if value in (None, "", "None"):
        return None
    if isinstance(value, str):
        try:
            return kind(value)
        except ValueError:
            raise ValueError(f"{name} must be a number, got {value!r}.") from None
    return value
