"""PackagedSparkJobOperator: only the Spark provider's public API; the driver's errors keep their meaning."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowException

from exactly_once_provider.operators.full_load import MySqlFullLoadOperator
from exactly_once_provider.operators.spark_submit import DriverEndedError, DriverKilledError, PackagedSparkJobOperator
from exactly_once_provider.source.server import source_from_secrets
from exactly_once_provider.spark_jobs.spec import JobSpec, report_error

ROOT = Path(__file__).resolve().parents[3]
# The hook's and the operator's private state: what the provider's own backends touch, never this package.
PRIVATE = re.compile(
    r"\._driver_id|_submit_sp|_driver_status|_start_driver_status_tracking|hook\._connection"
    r"|_process_spark_submit_log|_kubernetes_driver_pod|_yarn_application_id"
)


def test_no_module_uses_the_spark_hooks_private_members():
    used = [
        f"{path.relative_to(ROOT)}:{n}"
        for folder in ("provider", "hooks", "operators", "plugins")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if PRIVATE.search(line)
    ]
    assert len(list((ROOT / "operators").rglob("*.py"))) > 5  # the walk found the sources
    assert used == []


def test_every_spark_operator_submits_through_the_base():
    from exactly_once_provider.operators.spark_stream import SparkKafkaToSinkOperator

    for operator in (MySqlFullLoadOperator, SparkKafkaToSinkOperator):
        assert issubclass(operator, PackagedSparkJobOperator) and operator.job_name and operator.job_module


@pytest.fixture
def spark_connection(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    monkeypatch.setenv(
        "AIRFLOW_CONN_MYSQL_DEFAULT",
        json.dumps({"conn_type": "mysql", "host": "db", "login": "u", "password": "pw-MARKER", "schema": "eo"}),
    )


def test_a_missing_spark_connection_is_refused_not_yarn(spark_connection):
    with pytest.raises(AirflowException, match="'spark_missing' is not defined"):
        MySqlFullLoadOperator(task_id="t", table="t", sink_path="/x", spark_conn_id="spark_missing").execute({})


def _spec(tmp_path) -> JobSpec:
    return JobSpec(
        job="full_load",
        params={},
        secrets_file="",
        result_file=str(tmp_path / "result.json"),
        started_file=str(tmp_path / "started.json"),
    )


@pytest.mark.parametrize(
    "error, raised", [(ValueError("bad column name"), ValueError), (RuntimeError("Access denied"), AirflowException)]
)
def test_the_drivers_error_is_raised_with_its_meaning(tmp_path, error, raised):
    spec = _spec(tmp_path)
    report_error(spec, error)  # what the driver writes before it exits non-zero
    op = MySqlFullLoadOperator(task_id="t", table="t", sink_path="/x")
    with pytest.raises(raised, match=str(error)):
        op._raise_job_error(spec, AirflowException("Cannot execute: spark-submit ... Error code is: 1."))


@pytest.mark.parametrize("status, raised", [("KILLED", "ended KILLED"), ("FAILED", "query interrupted")])
def test_a_killed_cluster_driver_is_reported_killed_whatever_it_wrote_on_the_way_down(tmp_path, status, raised):
    spec = _spec(tmp_path)
    report_error(spec, RuntimeError("query interrupted"))  # the interrupted query's error, written as it died
    op = MySqlFullLoadOperator(task_id="t", table="t", sink_path="/x")
    with pytest.raises(AirflowException, match=raised):
        op._raise_job_error(spec, DriverEndedError(f"Spark driver d-1 of t ended {status}; ...", status))


@pytest.mark.parametrize("status", ["-9", "137", "-15", "143"])
def test_a_client_driver_ended_by_a_signal_without_an_error_is_a_killed_driver(tmp_path, status):
    op = MySqlFullLoadOperator(task_id="t", table="t", sink_path="/x")
    with pytest.raises(DriverKilledError, match=f"killed \\(exit status {status}\\)"):
        op._raise_job_error(
            _spec(tmp_path), AirflowException(f"Cannot execute: spark-submit. Error code is: {status}.")
        )


def test_a_killed_driver_that_reported_an_error_keeps_its_error(tmp_path):
    spec = _spec(tmp_path)
    report_error(spec, RuntimeError("Access denied"))
    op = MySqlFullLoadOperator(task_id="t", table="t", sink_path="/x")
    with pytest.raises(AirflowException, match="Access denied") as raised:
        op._raise_job_error(spec, AirflowException("Cannot execute: spark-submit. Error code is: -9."))
    assert not isinstance(raised.value, DriverKilledError)


class _Drivers:
    """Stand-in for one driver run per call: the listed outcomes in turn (an exception is raised)."""

    def __init__(self, *outcomes):
        self.outcomes = list(outcomes)
        self.calls = 0

    def __call__(self, context):
        self.calls += 1
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def test_a_killed_driver_is_restarted_within_the_try_up_to_driver_restarts(monkeypatch):
    op = MySqlFullLoadOperator(task_id="t", table="t", sink_path="/x", driver_restarts=2)
    drivers = _Drivers(DriverKilledError("killed"), DriverKilledError("killed"), "done")
    monkeypatch.setattr(op, "_execute_once", drivers)
    assert op.execute({}) == "done" and drivers.calls == 3 and op.restarted_after is not None

    op = MySqlFullLoadOperator(task_id="t", table="t", sink_path="/x", driver_restarts=1)
    monkeypatch.setattr(op, "_execute_once", _Drivers(DriverKilledError("a"), DriverKilledError("b"), "unused"))
    with pytest.raises(DriverKilledError, match="b"):  # past its restarts: the task fails, Airflow retries
        op.execute({})


def test_no_restart_by_default_of_other_failures_or_of_a_task_airflow_stops(monkeypatch):
    for op, outcome in (
        (MySqlFullLoadOperator(task_id="t", table="t", sink_path="/x"), DriverKilledError("killed")),
        (MySqlFullLoadOperator(task_id="t", table="t", sink_path="/x", driver_restarts=3), AirflowException("bad")),
    ):
        drivers = _Drivers(outcome, "unused")
        monkeypatch.setattr(op, "_execute_once", drivers)
        with pytest.raises(AirflowException):
            op.execute({})
        assert drivers.calls == 1

    op = MySqlFullLoadOperator(task_id="t", table="t", sink_path="/x", driver_restarts=3)
    op.on_kill()  # Airflow stops the task: the driver it kills stays dead
    drivers = _Drivers(DriverKilledError("killed"), "unused")
    monkeypatch.setattr(op, "_execute_once", drivers)
    with pytest.raises(DriverKilledError):
        op.execute({})
    assert drivers.calls == 1


def test_the_mysql_connection_goes_to_the_secrets_only(spark_connection):
    op = MySqlFullLoadOperator(task_id="t", table="orders", sink_path="/lake/orders", chunk_key=["a", "b"])
    params = op.job_params({})
    assert params["schema"] == "eo" and params["chunk_key"] == ("a", "b") and params["mysql_conn_id"] == "mysql_default"
    assert "pw-MARKER" not in json.dumps(params)
    secrets = op.job_secrets()["mysql"]  # resolved here, through the hook: the driver reads no connection
    assert secrets["settings"]["password"] == "pw-MARKER" and secrets["label"] == "MySQL connection 'mysql_default'"
    source = source_from_secrets(json.loads(json.dumps(op.job_secrets())))  # as the driver reads the file
    assert source.connection_settings().password == "pw-MARKER" and "pw-MARKER" not in repr(
        source.connection_settings()
    )


def test_on_kill_before_anything_was_submitted_is_harmless(spark_connection):
    MySqlFullLoadOperator(task_id="t", table="t", sink_path="/x").on_kill()  # builds an idle hook, kills nothing


def test_the_submit_environment_has_no_airflow_variable(monkeypatch):
    from exactly_once_provider.hooks.spark_submit import clean_environment

    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "airflow-db-not-allowed:///")
    monkeypatch.setenv("AIRFLOW_CONN_SECRET", "mysql://u:pw-MARKER@h/db")
    monkeypatch.setenv("AIRFLOW_HOME", "/home/airflow")
    env = clean_environment({"PYSPARK_PYTHON": "/py"})
    assert [k for k in env if k.startswith("AIRFLOW")] == ["AIRFLOW_HOME"] and env["PYSPARK_PYTHON"] == "/py"
    assert "pw-MARKER" not in json.dumps(env)
