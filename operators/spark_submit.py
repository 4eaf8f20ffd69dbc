"""The one way this provider runs Spark: a packaged job submitted through the Spark provider's SparkSubmitOperator.

:class:`PackagedSparkJobOperator` is the base of every operator that needs Spark. It writes the job's typed
spec (:class:`~exactly_once_provider.spark_jobs.spec.JobSpec`), a 0600 secrets file and the package zip into a
directory, then lets ``SparkSubmitOperator.execute`` submit and track the driver: on ``local[*]`` and in client
mode the driver runs under spark-submit on this machine; with ``deploy_mode="cluster"`` on a ``spark://``
standalone master it runs on a worker (Spark refuses ``.py`` applications there, so the job is submitted as the
JVM class that runs every Python application, ``org.apache.spark.deploy.PythonRunner``, with pyspark's own
``spark-core`` jar as primary resource), and the provider tracks it by id and kills it in ``on_kill``. The
driver answers through a small result file (or the sink), never through its log.

spark-submit starts with no ``AIRFLOW*`` variable, in its own session
(:class:`~exactly_once_provider.hooks.spark_submit.CleanEnvironmentSparkSubmitHook`).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowException

import exactly_once_provider
from exactly_once_provider.connections import spark_redaction_regex, write_secret_file
from exactly_once_provider.hooks.spark_submit import CleanEnvironmentSparkSubmitHook, clean_environment
from exactly_once_provider.operators.failures import fail_task_on_pipeline_error
from exactly_once_provider.plugins.links import SparkUILink, push_link
from exactly_once_provider.spark_jobs.class_archive import ARCHIVE_DIR_EXTRA, DriverClassArchive, chosen_elsewhere
from exactly_once_provider.spark_jobs.packages import SPARK_PACKAGES
from exactly_once_provider.spark_jobs.spec import VALUE_ERROR, JobSpec, read_json

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


def module_file(module: str) -> str:
    """Return the file of ``module`` without importing it (a job's ``__main__`` must not run here)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        raise AirflowException(f"Module {module} is not installed: reinstall the provider.")
    return spec.origin


class DriverEndedError(AirflowException):
    """A cluster-mode driver ended in a state other than FINISHED (``status``: the master's, e.g. KILLED)."""

    def __init__(self, message: str, status: str) -> None:
        super().__init__(message)
        self.status = status


class DriverKilledError(AirflowException):
    """The client-mode driver (spark-submit) ended by a signal without reporting an error (SIGKILL, the OOM
    killer, SIGTERM): a restart of the same job may simply go on."""


# spark-submit's exit status when a signal ended it: -N from Python's subprocess when it died of signal N, 128+N
# when the JVM (or the Python driver it runs) did.
_KILLED_EXIT = re.compile(r"Error code is: (-9|-15|137|143)\b")


class PackagedSparkJobOperator(SparkSubmitOperator):
    """Base of the provider's Spark operators: submit one packaged job with its spec; read its result back.

    A subclass names its job (:attr:`job_name`, :attr:`job_module`) and implements :meth:`job_params` (validated
    request, JSON), :meth:`job_secrets` (the connections the driver needs) and :meth:`job_result` (XCom from the
    result file or the sink).

    :param spark_conn_id: the Spark connection (``local[*]``, ``spark://host:port``...). It must exist: the
        Spark provider would silently fall back to yarn. Its Extra ``deploy-mode`` (or ``deploy_mode``) picks
        client or cluster mode; cluster mode on a standalone master needs its REST server (``rest-port``).
    :param conf: extra Spark configuration.
    :param packages: Maven coordinates for ``--packages``; default
        :data:`~exactly_once_provider.spark_jobs.packages.SPARK_PACKAGES` unless ``jars`` or
        ``conf["spark.jars"]`` provides the connectors.
    :param jars: connector jar paths for ``--jars``.
    :param deploy_mode: overrides the connection's ``deploy-mode``. In cluster mode the worker must read the
        same paths as this machine (the spec, the package zip, the jars: a shared disk or the same install) and
        runs the driver with ``conf["spark.pyspark.driver.python"]`` (default: this interpreter).
    :param driver_memory: driver memory.
    :param env_vars: extra environment for spark-submit and the driver (e.g. ``PYSPARK_PYTHON``); no secrets.
    :param driver_restarts: client mode: how many times a driver killed by a signal without reporting an error
        is started again at once within this try (what ``spark-submit --supervise`` does for a cluster-mode
        driver); past them, or on any other failure, the task fails and Airflow's retries take over. A task
        stopped by Airflow (mark failed, on_kill) is never restarted.
    """

    job_name: str = ""
    job_module: str = ""
    # The Spark settings a job gets unless the user sets them.
    default_conf: dict[str, str] = {}
    hook_class: type[CleanEnvironmentSparkSubmitHook] = CleanEnvironmentSparkSubmitHook

    def __init__(
        self,
        *,
        spark_conn_id: str = "spark_default",
        conf: dict[str, Any] | None = None,
        packages: Sequence[str] | None = None,
        jars: Sequence[str] | None = None,
        deploy_mode: str | None = None,
        driver_memory: str = "1g",
        env_vars: dict[str, str] | None = None,
        driver_restarts: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(conn_id=spark_conn_id, **kwargs)
        # Set after SparkSubmitOperator.__init__, which sets its own (unused here) values of these names.
        self.spark_conn_id = spark_conn_id
        self.conf = conf or {}
        self.packages = packages
        self.jars = jars
        self.deploy_mode = deploy_mode
        self.driver_memory = driver_memory
        self.env_vars = env_vars or {}
        self.driver_restarts = driver_restarts
        self.spark_ui_url: str | None = None
        self.driver_id: str | None = None
        self.driver_started: dict | None = None
        self._job_dir: str | None = None
        self._submit_settings: dict[str, Any] = {}
        self._class_archive: DriverClassArchive | None = None
        self._stopping = False
        # Seconds since this try's first driver was submitted, when this driver is a restart (else None).
        self.restarted_after: float | None = None

    # ------------------------------------------------------------------------------------------ subclass API
    def job_params(self, context: Any) -> dict[str, Any]:
        """Validate the (rendered) arguments; return the job's request as JSON. Raise ValueError on bad input."""
        raise NotImplementedError

    def job_secrets(self) -> dict[str, Any]:
        """Return the connection settings the driver needs (they go to the 0600 secrets file only)."""
        return {}

    def job_result(self, result: Any, context: Any) -> Any:
        """Turn the driver's result (None when this try did not run the driver, e.g. a reconnect) into XCom."""
        return result

    def before_submit(self) -> None:
        """Called after every check passed, right before spark-submit starts (e.g. to read the sink's state)."""

    def job_label(self) -> str:
        """Name the job in messages."""
        return f"{self.job_name} job of task {self.task_id}"

    def app_name(self) -> str:
        """Name the Spark application (Spark's UI, the master's list of drivers, the process list)."""
        return f"eo-{self.job_name}-{self.task_id}"

    # ------------------------------------------------------------------------------------------ connection
    def spark_master(self) -> tuple[str, str | None, dict]:
        """Return (master, deploy mode, Extra) of the Spark connection; refuse a missing one."""
        try:
            conn = BaseHook.get_connection(self.spark_conn_id)
        except Exception as err:  # the provider's hook would silently fall back to yarn: refuse instead
            raise AirflowException(
                f"Spark connection {self.spark_conn_id!r} is not defined; create it (host local[*] or "
                f"spark://host:port) instead of relying on the Spark provider's fallback to yarn."
            ) from err
        master = conn.host or ""
        if conn.port and "://" in master:
            master = f"{master}:{conn.port}"
        extra = conn.extra_dejson
        return master, self.deploy_mode or extra.get("deploy-mode"), extra

    def check_rest_server(self, master: str, extra: dict) -> None:
        """Refuse to submit a cluster-mode driver that could be neither tracked nor killed: the master's REST
        server must answer (the provider polls and kills the driver there)."""
        import urllib.error
        import urllib.request

        host = master.removeprefix("spark://").split(",")[0].rsplit(":", 1)[0]
        endpoint = f"{extra.get('rest-scheme', 'http')}://{host}:{int(extra.get('rest-port', 6066))}"
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
                "pass deploy_mode='client'."
            ) from err

    def job_default_conf(self) -> dict[str, str]:
        """Return the Spark settings this job gets unless ``conf`` sets them (default: :attr:`default_conf`)."""
        return dict(self.default_conf)

    # ------------------------------------------------------------------------------------------ run
    def _get_hook(self) -> SparkSubmitHook:
        # The provider's own subclasses (SparkJDBCOperator) build their hook here; ours adds the clean
        # environment and takes the settings execute() prepared for this job.
        return self.hook_class(conn_id=self.spark_conn_id, **self._submit_settings)

    def _prepare(self, context: Any, job_dir: str) -> JobSpec:
        params = self.job_params(context)
        master, deploy_mode, extra = self.spark_master()
        self._class_archive = None
        cluster = master.startswith("spark://") and deploy_mode == "cluster"
        secrets = self.job_secrets()
        conf = {**self.job_default_conf(), **self.conf}
        # Keeps the secrets out of Spark's UI and event log should a setting or option carry one.
        conf["spark.redaction.regex"] = spark_redaction_regex(self.conf.get("spark.redaction.regex"))
        jars = ",".join(self.jars) if self.jars else None
        packages = self.packages
        if packages is None and not jars and "spark.jars" not in conf:
            packages = self.default_packages()
        py_files = package_zip(job_dir)
        spec = JobSpec(
            job=self.job_name,
            params=params,
            secrets_file=write_secret_file(job_dir, secrets, prefix="connections-"),
            result_file=str(Path(job_dir) / "result.json"),
            started_file=str(Path(job_dir) / "started.json"),
            app_name=self.app_name(),
        )
        args = ["--spec", spec.write(Path(job_dir) / "spec.json")]
        entry = module_file(self.job_module)
        java_class = None
        if cluster:
            self.check_rest_server(master, extra)
            conf.setdefault("spark.pyspark.driver.python", sys.executable)
            conf.setdefault("spark.submit.pyFiles", py_files)  # executors' Python path, as in client mode
            self.application, java_class = python_runner_jar(), PYTHON_RUNNER
            args = [entry, py_files, *args]
            py_files = None
        else:
            self.application = entry
        submit_env = clean_environment(self.env_vars)
        if not cluster and extra.get(ARCHIVE_DIR_EXTRA):  # the driver JVM starts here: from the class archive
            self._use_class_archive(extra[ARCHIVE_DIR_EXTRA], conf, submit_env)
        # env_vars stay off the hook: it would rebuild spark-submit's environment from this process's (with
        # Airflow's variables) and refuses them in standalone cluster mode; they go into the clean environment.
        self._submit_settings = dict(
            conf=conf,
            py_files=py_files,
            jars=jars,
            java_class=java_class,
            packages=",".join(packages) if packages else None,
            name=spec.app_name,
            application_args=args,
            driver_memory=self.driver_memory,
            deploy_mode=self.deploy_mode,
            submit_env=submit_env,
        )
        self.before_submit()
        return spec

    def _use_class_archive(self, directory: str, conf: dict[str, Any], submit_env: dict[str, str]) -> None:
        driver_options = conf.get("spark.driver.extraJavaOptions")
        if chosen_elsewhere(submit_env.get("SPARK_SUBMIT_OPTS"), driver_options):
            self.log.info("The driver's JVM options already name a class archive; %r is not used", ARCHIVE_DIR_EXTRA)
            return
        self._class_archive = DriverClassArchive.in_directory(directory)
        conf["spark.driver.extraJavaOptions"] = " ".join(
            filter(None, [driver_options, self._class_archive.java_options()])
        )

    def default_packages(self) -> tuple[str, ...]:
        """Return the connectors' Maven coordinates when neither ``packages`` nor jars were given."""
        return SPARK_PACKAGES

    def may_restart(self, elapsed: float) -> bool:
        """Return whether a killed driver is started again ``elapsed`` seconds into the try (a subclass with a
        time budget says no once it is spent)."""
        return True

    @fail_task_on_pipeline_error()
    def execute(self, context: Any) -> Any:
        first_submit = time.monotonic()
        restarts = 0
        while True:
            try:
                return self._execute_once(context)
            except DriverKilledError as err:
                elapsed = time.monotonic() - first_submit
                if self._stopping or restarts >= self.driver_restarts or not self.may_restart(elapsed):
                    raise
                restarts += 1
                self.restarted_after = elapsed
                self.log.warning(
                    "%s Starting it again at once (restart %d of %d in this try; then Airflow's retries take over).",
                    err,
                    restarts,
                    self.driver_restarts,
                )

    def on_kill(self) -> None:
        self._stopping = True  # the driver killed now is not restarted
        super().on_kill()

    def _execute_once(self, context: Any) -> Any:
        # One directory per operator object: the hook the provider keeps on the operator between two execute()
        # calls of the same object (tests; Airflow builds a new operator per try) names these same paths.
        if self._job_dir is None:
            self._job_dir = tempfile.mkdtemp(prefix="eo-spark-")
        else:  # created again by us only (0700): a directory someone else made under that name is refused
            os.mkdir(self._job_dir, 0o700)
        try:
            spec = self._prepare(context, self._job_dir)
            watcher = _StartedWatcher(spec.started_file, lambda started: self._driver_started(context, started))
            watcher.start()
            succeeded = False
            try:
                super().execute(context)
                succeeded = True
            except (AirflowException, RuntimeError) as err:
                self._raise_job_error(spec, err)
            finally:
                watcher.stop()
                if self._class_archive and self._class_archive.publish(succeeded):
                    self.log.info(
                        "Spark driver class archive written: %s (later drivers start from it)", self._class_archive.path
                    )
            report = read_json(spec.result_file)
            if report is not None and "error" in report:
                self._raise_job_error(spec, AirflowException("the driver reported an error"))
            return self.job_result(report["result"] if report else None, context)
        finally:
            shutil.rmtree(self._job_dir, ignore_errors=True)  # the secrets file goes with it

    def _raise_job_error(self, spec: JobSpec, err: BaseException) -> None:
        report = read_json(spec.result_file) or {}
        error = report.get("error")
        if isinstance(err, DriverEndedError) and err.status == "KILLED":
            # A killed driver (on_kill, mark failed, or the cluster's kill) may still report the error its
            # interrupted query raised on the way down; what happened is the kill.
            raise err
        if error and error["kind"] == VALUE_ERROR:
            raise ValueError(error["message"]) from err
        if error:
            raise AirflowException(f"{self.job_label()} failed: {error['type']}: {error['message']}") from err
        killed = _KILLED_EXIT.search(str(err))
        if killed and not self.driver_id:  # client mode (a cluster driver's end is DriverEndedError)
            raise DriverKilledError(
                f"The Spark driver of {self.job_label()} was killed (exit status {killed.group(1)}) without "
                "reporting an error."
            ) from err
        raise err if isinstance(err, AirflowException) else AirflowException(str(err)) from err

    def submit_job(self, context: Any) -> str | None:
        self.driver_id = super().submit_job(context)
        return self.driver_id

    def poll_until_complete(self, external_id: Any, context: Any) -> None:
        self.driver_id = str(external_id)
        self.log.info("%s: driver %s runs on the cluster; tracking it until it ends", self.job_label(), external_id)
        try:
            super().poll_until_complete(external_id, context)
        except RuntimeError as err:  # the provider's standalone backend: "Driver <id> exited with status <s>"
            status = (re.search(r"status (\w+)", str(err)) or re.search(r"(\w+)$", str(err))).group(1)
            raise DriverEndedError(
                f"Spark driver {external_id} of {self.job_label()} ended {status}; its log is in the worker's work "
                f"directory (<work-dir>/{external_id}/stderr).",
                status,
            ) from err
        self.log.info("%s: driver %s FINISHED", self.job_label(), external_id)

    def _driver_started(self, context: Any, started: dict) -> None:
        """Publish the Spark UI link as soon as the driver runs (a stream may run for days)."""
        self.driver_started = started
        url = started.get("spark_ui")
        if not url:
            return
        self.spark_ui_url = url
        self.log.info("Spark UI of %s: %s", self.job_label(), url)
        if not any(isinstance(link, SparkUILink) for link in self.operator_extra_links):
            return
        try:
            push_link(context, SparkUILink(), url)
        except Exception:  # a link must never stop the job; Airflow stores it again when the task ends
            self.log.warning("Could not publish the Spark UI link yet", exc_info=True)


class _StartedWatcher:
    """Call ``found(started)`` once, when the driver wrote its started file (polled while spark-submit runs;
    checked once more at the end, for a job shorter than one poll)."""

    def __init__(self, path: str, found: Any) -> None:
        self._path, self._found = path, found
        self._delivered = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="eo-driver-started", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _deliver(self) -> bool:
        started = read_json(self._path)
        if started is None:
            return False
        with self._lock:
            if not self._delivered:
                self._delivered = True
                self._found(started)
        return True

    def _run(self) -> None:
        while not self._stop.is_set() and not self._deliver():
            self._stop.wait(0.5)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._deliver()
