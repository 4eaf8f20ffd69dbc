"""Submit the packaged Kafka -> sink streaming job through the Spark provider's SparkSubmitHook.

On a ``spark://`` standalone master with ``deploy_mode="cluster"`` the Python driver runs on a worker: Spark
refuses ``.py`` applications in standalone cluster mode, so the operator submits the JVM class that runs every
Python application, ``org.apache.spark.deploy.PythonRunner`` (primary resource: pyspark's own ``spark-core``
jar; arguments: the job file, the ``--py-files`` list, the job's arguments). The hook then tracks the driver
by id through the master's REST server and ``on_kill`` kills it there.

Where the guarantees live: not here. The job commits each micro-batch and its Kafka offsets in the sink
(:mod:`exactly_once_provider.spark_jobs.kafka_to_sink`), so a retry or a rerun simply submits the job again:
it continues from what the sink holds. XCom only mirrors the sink's committed state, read back after the run.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.sdk import BaseHook, BaseOperator
from airflow.sdk.exceptions import AirflowException

import exactly_once_provider
from exactly_once_provider.connections import (
    kafka_client_config,
    libpq_environment,
    portable_kafka_config,
    spark_kafka_options,
    spark_redaction_regex,
    write_secret_file,
)
from exactly_once_provider.plugins.links import PipelineStatusLink, SparkUILink, push_link, watch_spark_ui
from exactly_once_provider.spark_jobs.packages import SPARK_PACKAGES

SINKS = ("delta", "postgres", "files")
TRIGGERS = ("available-now", "processing-time")
DELIVERIES = ("exactly-once", "at-least-once")
MODES = ("append", "cdc", "window")
# The JVM entry point spark-submit itself uses for every Python application (client mode included).
PYTHON_RUNNER = "org.apache.spark.deploy.PythonRunner"


def package_zip(directory: str) -> str:
    """Zip the installed ``exactly_once_provider`` sources (``.py`` only) for ``--py-files``; return the path."""
    root = Path(exactly_once_provider.__file__).parent
    target = Path(directory) / "exactly_once_provider.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(root.rglob("*.py")):
            archive.write(path, Path("exactly_once_provider") / path.relative_to(root))
    return str(target)


def python_runner_jar() -> str:
    """Return pyspark's ``spark-core`` jar, which holds :data:`PYTHON_RUNNER` (the cluster-mode primary resource)."""
    import pyspark

    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("spark-core_*.jar"))
    if not jars:
        raise AirflowException(f"No spark-core jar in {Path(pyspark.__file__).parent / 'jars'}: reinstall pyspark.")
    return str(jars[0])


class SparkKafkaToSinkOperator(BaseOperator):
    """Run the exactly-once Kafka -> sink Spark job once (availableNow) or as a long stream (processing time).

    :param pipeline: stable pipeline name; part of every sink commit. Never derive it from the run or try.
    :param topics: Kafka topics to read (read_committed).
    :param sink: ``delta``, ``postgres`` or ``files``.
    :param checkpoint_location: this pipeline's Spark checkpoint directory.
    :param sink_path: the Delta table or files sink directory (``delta`` / ``files``).
    :param sink_table: the PostgreSQL table (``postgres``); the offsets table ``eo_stream_offsets`` sits next to it.
    :param kafka_conn_id: Kafka connection (its Extra is the confluent-kafka configuration, SASL/TLS included);
        the job gets it in a file only its owner can read, removed after the run, never on the command line.
    :param postgres_conn_id: PostgreSQL connection (``postgres`` sink); its settings (TLS included) reach the
        driver as libpq ``PG*`` variables in the same file as the Kafka settings, never the command line.
    :param spark_conn_id: Spark connection (``local[*]``, ``spark://host:port``...). It must exist.
    :param trigger: ``available-now`` (process what is there, then stop) or ``processing-time``.
    :param interval: processing-time trigger interval, e.g. ``"30 seconds"``.
    :param max_offsets_per_trigger: cap on records per micro-batch.
    :param mode: ``append`` (records), ``cdc`` (apply changes by key; newer source version wins; deletes
        kept as tombstones; needs the ``delta`` or ``postgres`` sink) or ``window`` (settlement batches of
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
        "pipeline", "topics", "sink", "checkpoint_location", "sink_path", "sink_table", "trigger", "interval",
        "max_offsets_per_trigger", "mode", "conf",
    )
    ui_color = "#e8f4d9"
    operator_extra_links = (PipelineStatusLink(), SparkUILink())

    def __init__(
        self,
        *,
        pipeline: str,
        topics: str | Sequence[str],
        sink: str,
        checkpoint_location: str,
        sink_path: str | None = None,
        sink_table: str | None = None,
        kafka_conn_id: str = "kafka_default",
        postgres_conn_id: str = "postgres_default",
        spark_conn_id: str = "spark_default",
        trigger: str = "available-now",
        interval: str = "30 seconds",
        max_offsets_per_trigger: int | None = None,
        mode: str = "append",
        key_field: str = "pk",
        version_field: str = "version",
        op_field: str = "op",
        delivery: str = "exactly-once",
        packages: Sequence[str] | None = None,
        jars: Sequence[str] | None = None,
        conf: dict[str, Any] | None = None,
        deploy_mode: str | None = None,
        driver_memory: str = "1g",
        env_vars: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.topics = topics
        self.sink = sink
        self.checkpoint_location = checkpoint_location
        self.sink_path = sink_path
        self.sink_table = sink_table
        self.kafka_conn_id = kafka_conn_id
        self.postgres_conn_id = postgres_conn_id
        self.spark_conn_id = spark_conn_id
        self.trigger = trigger
        self.interval = interval
        self.max_offsets_per_trigger = max_offsets_per_trigger
        self.mode = mode
        self.key_field = key_field
        self.version_field = version_field
        self.op_field = op_field
        self.delivery = delivery
        self.packages = packages
        self.jars = jars
        self.conf = conf or {}
        self.deploy_mode = deploy_mode
        self.driver_memory = driver_memory
        self.env_vars = env_vars or {}
        self._hook = None
        self.spark_ui_url: str | None = None

    # ------------------------------------------------------------------------------------------ checks
    def _validate(self) -> list[str]:
        topics = [self.topics] if isinstance(self.topics, str) else list(self.topics)
        topics = [t.strip() for item in topics for t in item.split(",") if t.strip()]
        if not self.pipeline or not str(self.pipeline).replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"pipeline must be a non-empty name of letters, digits, '-' and '_', got {self.pipeline!r}.")
        if not topics:
            raise ValueError("topics is empty: name at least one Kafka topic.")
        if self.sink not in SINKS:
            raise ValueError(f"sink must be one of {SINKS}, got {self.sink!r}.")
        if self.sink in ("delta", "files") and not self.sink_path:
            raise ValueError(f"sink={self.sink!r} needs sink_path (the table or directory to write).")
        if self.sink == "postgres" and not self.sink_table:
            raise ValueError("sink='postgres' needs sink_table.")
        if self.trigger not in TRIGGERS:
            raise ValueError(f"trigger must be one of {TRIGGERS}, got {self.trigger!r}.")
        if self.delivery not in DELIVERIES:
            raise ValueError(f"delivery must be one of {DELIVERIES}, got {self.delivery!r}.")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}.")
        if self.mode == "window" and self.delivery != "exactly-once":
            raise ValueError("mode='window' replaces windows by version: it needs delivery='exactly-once'.")
        if self.mode == "cdc" and self.sink == "files":
            raise ValueError("mode='cdc' needs sink='delta' or 'postgres': the files sink only appends.")
        if not self.checkpoint_location:
            raise ValueError("checkpoint_location is required: one checkpoint directory per pipeline.")
        return topics

    def _spark_connection(self) -> bool:
        """Check the Spark connection exists; return True for cluster deploy mode on a standalone master."""
        try:
            conn = BaseHook.get_connection(self.spark_conn_id)
        except Exception as err:  # the provider's hook would silently fall back to yarn: refuse instead
            raise AirflowException(
                f"Spark connection {self.spark_conn_id!r} is not defined; create it (host local[*] or "
                f"spark://host:port) instead of relying on the Spark provider's fallback to yarn.") from err
        master = conn.host or ""
        if conn.port and "://" in master:
            master = f"{master}:{conn.port}"
        mode = self.deploy_mode or conn.extra_dejson.get("deploy-mode")
        return master.startswith("spark://") and mode == "cluster"

    def _kafka_config(self) -> dict[str, Any]:
        """Return the Kafka connection's settings for the job; refuse what its Spark source cannot use."""
        config = portable_kafka_config(kafka_client_config(self.kafka_conn_id))
        try:
            spark_kafka_options(config)
        except ValueError as err:
            raise ValueError(f"Kafka connection {self.kafka_conn_id!r}: {err}") from None
        return config

    # ------------------------------------------------------------------------------------------ run
    def _application_args(self, topics: list[str], secrets_file: str) -> list[str]:
        args = ["--pipeline", self.pipeline, "--secrets-file", secrets_file, "--topics", ",".join(topics),
                "--checkpoint", self.checkpoint_location, "--sink", self.sink, "--trigger", self.trigger,
                "--interval", self.interval, "--delivery", self.delivery, "--mode", self.mode,
                "--key-field", self.key_field, "--version-field", self.version_field, "--op-field", self.op_field]
        args += ["--table", self.sink_table] if self.sink == "postgres" else ["--path", self.sink_path]
        if self.max_offsets_per_trigger:
            args += ["--max-offsets-per-trigger", str(int(self.max_offsets_per_trigger))]
        return args

    def sink_state(self) -> dict | None:
        """Read the pipeline's committed state back from the sink (the source of truth), without Spark."""
        from exactly_once_provider.connections import connect_kwargs
        from exactly_once_provider.sinks.base import open_sink

        location = self.sink_table if self.sink == "postgres" else self.sink_path
        state = open_sink(self.sink, location, self.pipeline,
                          postgres_connect=lambda: connect_kwargs(self.postgres_conn_id)).committed()
        return state.to_json() if state else None

    def execute(self, context: Any) -> dict | None:
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        from exactly_once_provider.spark_jobs import kafka_to_sink

        topics = self._validate()
        cluster = self._spark_connection()
        # Local and client mode: the driver runs on this machine and can use this interpreter, which has the
        # package and its dependencies (psycopg2, confluent-kafka) installed.
        env = {"PYSPARK_DRIVER_PYTHON": sys.executable, **self.env_vars}
        # pyspark (a dependency of this package) puts spark-submit next to the interpreter; the worker's PATH
        # may not include that directory when Airflow runs from a virtualenv without activating it.
        bin_dir = Path(sys.executable).parent
        if (bin_dir / "spark-submit").exists() and "PATH" not in env:
            env["PATH"] = os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])
        # The job's secrets travel in one file only its owner can read, never in spark-submit's arguments or
        # environment (on YARN and Kubernetes the Spark provider turns env_vars into --conf arguments).
        secrets = {"kafka": self._kafka_config()}
        if self.sink == "postgres":
            secrets["libpq"] = libpq_environment(self.postgres_conn_id)
        conf = {"spark.sql.shuffle.partitions": "2", **self.conf}
        # Keeps the secrets out of Spark's UI and event log should a setting or option carry one.
        conf["spark.redaction.regex"] = spark_redaction_regex(self.conf.get("spark.redaction.regex"))
        jars = ",".join(self.jars) if self.jars else None
        packages = self.packages
        if packages is None and not jars and "spark.jars" not in conf:
            packages = SPARK_PACKAGES
        before = self.sink_state() if self.delivery == "exactly-once" else None
        with tempfile.TemporaryDirectory(prefix="eo-spark-") as tmp:
            py_files = package_zip(tmp)
            # Removed with the directory when the run ends; the path is on this machine (cluster mode: a shared disk,
            # as for the package zip next to it).
            secrets_file = write_secret_file(tmp, secrets, prefix="connections-")
            args = self._application_args(topics, secrets_file)
            # The environment goes to spark-submit (submit(env=...)): the hook rejects env_vars in standalone
            # cluster mode, whose client forwards it to the driver. Airflow's own settings and connections
            # (AIRFLOW_CONN_*, AIRFLOW__*) must not reach the driver in any mode; in a task process Airflow 3
            # also sets AIRFLOW__DATABASE__SQL_ALCHEMY_CONN to a blocked URL that fails the driver's `import airflow`.
            submit_env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW") or k == "AIRFLOW_HOME"}
            submit_env.update(env)
            if cluster:
                conf.setdefault("spark.pyspark.driver.python", sys.executable)
                conf.setdefault("spark.submit.pyFiles", py_files)  # executors' Python path, as in client mode
                application, java_class = python_runner_jar(), PYTHON_RUNNER
                args = [kafka_to_sink.__file__, py_files, *args]
                hook_env, py_files = None, None
            else:
                application, java_class, hook_env = kafka_to_sink.__file__, None, None
            self._hook = SparkSubmitHook(
                conn_id=self.spark_conn_id, conf=conf, py_files=py_files, jars=jars, java_class=java_class,
                packages=",".join(packages) if packages else None, name=f"eo-{self.pipeline}",
                application_args=args, env_vars=hook_env, driver_memory=self.driver_memory,
                deploy_mode=self.deploy_mode,
            )
            if cluster:
                self._check_rest_server()
            # Own process group: on_kill stops spark-submit, the driver JVM and the Python driver together.
            kwargs = {"start_new_session": True, "env": submit_env}
            with watch_spark_ui(self._hook, lambda url: self._show_spark_ui(context, url)):
                self._hook.submit(application, **kwargs)
            if cluster:
                self._track_driver()
        if self.delivery != "exactly-once":
            return None
        after = self.sink_state()
        self.log.info("pipeline %s: sink %s committed batch %s of checkpoint %s, %s rows in total (%s before "
                      "this run); offsets %s", self.pipeline, self.sink, after and after["batch_id"],
                      after and after["checkpoint_id"], after and after["rows_total"],
                      before["rows_total"] if before else 0, after and after["offsets"])
        if after is not None:
            after["rows_this_run"] = after["rows_total"] - (before["rows_total"] if before else 0)
        return after

    def _check_rest_server(self) -> None:
        """Refuse to submit a driver that could be neither tracked nor killed: the master's REST server must answer."""
        import urllib.error
        import urllib.request

        endpoint = self._hook._connection["rest_endpoint"]
        if not endpoint:  # the hook then asks spark-submit --status instead of the REST server
            return
        try:
            with urllib.request.urlopen(f"{endpoint}/v1/submissions/status/eo-probe", timeout=10):
                pass
        except urllib.error.HTTPError:
            pass  # an HTTP answer (even an error) proves the REST server is there
        except OSError as err:
            raise AirflowException(
                f"The standalone master's REST server does not answer at {endpoint} ({err}); cluster deploy mode "
                "tracks and kills the driver there. Start the master with spark.master.rest.enabled=true and put "
                f"its spark.master.rest.port in connection {self.spark_conn_id!r}'s Extra as 'rest-port', or "
                "pass deploy_mode='client'.") from err

    def _track_driver(self) -> None:
        """Wait for the cluster-mode driver to end (polled through the master's REST server); fail unless FINISHED."""
        driver = self._hook._driver_id
        if not driver:
            raise AirflowException("spark-submit reported no driver id; see its output above.")
        self.log.info("pipeline %s: driver %s runs on the cluster; tracking it until it ends", self.pipeline, driver)
        # The same private calls the Spark provider's own SparkSubmitOperator makes for standalone cluster mode.
        self._hook._start_driver_status_tracking()
        status = self._hook._driver_status
        if status != "FINISHED":
            raise AirflowException(
                f"Spark driver {driver} of pipeline {self.pipeline} ended {status}; its log is in the worker's "
                f"work directory (<work-dir>/{driver}/stderr). The sink keeps only whole committed batches.")
        self.log.info("pipeline %s: driver %s FINISHED", self.pipeline, driver)

    def _show_spark_ui(self, context: Any, url: str) -> None:
        """Publish the Spark UI link as soon as the driver starts (a stream may run for days)."""
        self.spark_ui_url = url
        self.log.info("Spark UI of pipeline %s: %s", self.pipeline, url)
        try:
            push_link(context, SparkUILink(), url)
        except Exception:  # a link must never stop the job; Airflow stores it again when the task ends
            self.log.warning("Could not publish the Spark UI link yet", exc_info=True)

    def on_kill(self) -> None:
        if self._hook is None:
            return
        process = self._hook._submit_sp
        self._hook.on_kill()  # cluster mode: kills the driver by id through the master's REST server
        if process is not None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
