"""SparkKafkaToSinkOperator submits the packaged job through SparkSubmitHook on local[*] and on a standalone
master + worker (client mode, and cluster mode with the Python driver on the worker); XCom carries the sink's
committed offsets and row counts; retries are no-ops; on_kill stops the whole driver process group (or kills
the cluster-mode driver by id) and the next run still ends exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowException

from exactly_once_provider.operators.spark_stream import SparkKafkaToSinkOperator
from exactly_once_provider.plugins.links import SparkUILink
from tests import spark_job_support as jobs
from tests.kafka_support import new_topic


def _operator(stack, tmp_path, **kwargs) -> SparkKafkaToSinkOperator:
    defaults = {
        "task_id": "stream",
        "checkpoint_location": str(tmp_path / "checkpoint"),
        "conf": {"spark.jars": stack.spark_conf()["spark.jars"], "spark.ui.enabled": "false"},
        "env_vars": {"PYSPARK_PYTHON": sys.executable},
    }
    return SparkKafkaToSinkOperator(**{**defaults, **kwargs})


def _end(bootstrap: str, topic: str) -> dict:
    return {topic: {str(p): o for p, o in jobs.end_offsets(bootstrap, topic, 2).items()}}


def test_local_submit_returns_sink_state_and_a_retry_is_a_no_op(stack, airflow_connections, tmp_path):
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap, partitions=2)
    table = f"eo_op_{topic.replace('-', '_')}"
    committed = jobs.produce_interleaved(bootstrap, topic, transactions=5, per_transaction=30, partitions=2)
    op = _operator(
        stack,
        tmp_path,
        pipeline=f"op-{topic}",
        topics=[topic],
        sink="postgres",
        sink_table=table,
        max_offsets_per_trigger=100,
    )

    state = op.execute({})
    assert state["offsets"] == _end(bootstrap, topic)
    assert state["rows_total"] == state["rows_this_run"] == len(committed)
    jobs.assert_exactly(jobs.postgres_rows(stack, table), committed)

    retry = op.execute({})  # an Airflow retry / clear: the job continues from the sink -> nothing new
    assert retry["rows_this_run"] == 0
    assert {k: v for k, v in retry.items() if k != "rows_this_run"} == {
        k: v for k, v in state.items() if k != "rows_this_run"
    }
    jobs.assert_exactly(jobs.postgres_rows(stack, table), committed)


def _group_alive(pgid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    return True
            except ProcessLookupError:
                continue
    return False


def test_on_kill_stops_the_running_stream_and_the_next_run_is_exact(stack, airflow_connections, tmp_path):
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap, partitions=2)
    target = str(tmp_path / "files-sink")
    committed = jobs.produce_interleaved(bootstrap, topic, transactions=4, per_transaction=30, partitions=2)
    op = _operator(
        stack,
        tmp_path,
        pipeline="op-kill",
        topics=topic,
        sink="files",
        sink_path=target,
        trigger="processing-time",
        interval="1 second",
        max_offsets_per_trigger=40,
        conf={"spark.jars": stack.spark_conf()["spark.jars"]},
    )  # Spark UI on: its extra link is checked
    outcome: dict = {}
    links: dict = {}

    class _TaskInstance:
        def xcom_push(self, key, value):
            links[key] = value

    def run() -> None:
        try:
            outcome["result"] = op.execute({"ti": _TaskInstance()})
        except BaseException as err:  # noqa: BLE001 - the killed submit must surface as an error
            outcome["error"] = err

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 240
    while op.sink_state() is None and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.5)
    assert op.sink_state() is not None, f"the stream committed nothing: {outcome}"
    # The Spark UI extra link is published while the stream runs (not only when the task ends), and answers;
    # checked after on_kill so a failure never leaves the stream running.
    try:
        with urllib.request.urlopen(f"{op.spark_ui_url}/jobs/", timeout=30) as page:
            ui_page = page.read()
    except (OSError, ValueError) as err:
        ui_page = repr(err).encode()
    pgid = op._hook._submit_sp.pid
    op.on_kill()
    thread.join(60)
    assert not thread.is_alive()
    assert isinstance(outcome.get("error"), AirflowException), outcome
    deadline = time.monotonic() + 30
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _group_alive(pgid), "a process of the killed job's group is still running"
    assert links == {SparkUILink().xcom_key: op.spark_ui_url}
    assert b"Spark Jobs" in ui_page, ui_page[:300]

    more = jobs.produce_interleaved(bootstrap, topic, transactions=2, per_transaction=30, partitions=2, tag="m")
    again = _operator(stack, tmp_path, pipeline="op-kill", topics=topic, sink="files", sink_path=target)
    state = again.execute({})
    assert state["offsets"] == _end(bootstrap, topic)
    jobs.assert_exactly(jobs.files_rows(target), committed + more)


def _master_state(stack) -> dict:
    with urllib.request.urlopen(f"http://{stack.HOST}:{stack.SPARK_MASTER_UI_PORT}/json/", timeout=10) as response:
        return json.load(response)


def _driver_state(stack, driver: str) -> str:
    url = f"http://{stack.HOST}:{stack.SPARK_MASTER_REST_PORT}/v1/submissions/status/{driver}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)["driverState"]


def _python_drivers(pipeline: str) -> list[int]:
    """Return the pids of Python drivers of the job running ``pipeline``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if (
            any(arg.endswith(b"kafka_to_sink.py") for arg in argv)
            and pipeline.encode() in argv
            and not any(b"java" in arg for arg in argv[:1])
        ):
            found.append(int(entry.name))
    return found


def _standalone_conf(stack) -> dict:
    return {
        "spark.jars": stack.spark_conf()["spark.jars"],
        "spark.ui.enabled": "false",
        "spark.executor.memory": "512m",
        "spark.cores.max": "1",
    }


# Client mode on the standalone master is a variant (the operator's client path is the local[*] one); the
# default suite keeps the cluster-mode run below, the issue's "standalone master + worker, cluster mode".
@pytest.mark.slow
@pytest.mark.matrix
def test_standalone_master_and_worker_client_mode(stack, airflow_connections, tmp_path):
    stack.start_spark_cluster()
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap, partitions=2)
    target = str(tmp_path / "delta-sink")
    committed = jobs.produce_interleaved(bootstrap, topic, transactions=5, per_transaction=30, partitions=2)

    op = _operator(
        stack,
        tmp_path,
        pipeline="op-standalone",
        topics=topic,
        sink="delta",
        sink_path=target,
        spark_conn_id="spark_standalone",
        deploy_mode="client",
        max_offsets_per_trigger=100,
        conf=_standalone_conf(stack),
    )
    state = op.execute({})
    assert state["offsets"] == _end(bootstrap, topic)
    assert state["rows_total"] == len(committed)
    jobs.assert_exactly(jobs.delta_rows(target), committed)
    # The executors ran on the standalone worker: the master lists the finished application.
    apps = _master_state(stack)["completedapps"]
    assert any(app["name"] == "eo-op-standalone" for app in apps), [app["name"] for app in apps]


def _assert_ran_on_the_worker(stack, driver: str) -> None:
    """The driver's JVM and Python ran in the worker's work directory; the password stayed out of its logs."""
    driver_dir = stack.HOME / "spark" / "work" / driver
    logs = (driver_dir / "stderr").read_text() + (driver_dir / "stdout").read_text()
    assert "org.apache.spark.deploy.PythonRunner" in logs and "MicroBatchExecution" in logs
    assert stack.DB_PASSWORD not in logs


@pytest.mark.slow
def test_standalone_cluster_mode_runs_the_python_driver_on_the_worker(stack, airflow_connections, tmp_path):
    stack.start_spark_cluster()
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap, partitions=2)
    table = f"eo_op_cluster_{topic.replace('-', '_')}"
    committed = jobs.produce_interleaved(bootstrap, topic, transactions=5, per_transaction=30, partitions=2)

    # Spark refuses a .py application in standalone cluster mode (the real spark-submit says so)...
    job = tmp_path / "noop.py"
    job.write_text("print('never runs')\n")
    refused = subprocess.run(
        [jobs.SPARK_SUBMIT, "--master", stack.SPARK_MASTER_URL, "--deploy-mode", "cluster", str(job)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **stack.spark_env()},
    )
    assert refused.returncode != 0
    assert (
        "Cluster deploy mode is currently not supported for python applications on standalone clusters"
        in refused.stdout + refused.stderr
    )

    # ... so the operator submits the JVM class PythonRunner; cluster mode comes from the connection's Extra.
    op = _operator(
        stack,
        tmp_path,
        pipeline=f"op-cluster-{topic}",
        topics=topic,
        sink="postgres",
        sink_table=table,
        spark_conn_id="spark_standalone",
        max_offsets_per_trigger=100,
        conf=_standalone_conf(stack),
    )
    state = op.execute({})
    driver = op._hook._driver_id
    assert driver and _driver_state(stack, driver) == "FINISHED"
    assert state["offsets"] == _end(bootstrap, topic)
    assert state["rows_total"] == state["rows_this_run"] == len(committed)
    jobs.assert_exactly(jobs.postgres_rows(stack, table), committed)
    _assert_ran_on_the_worker(stack, driver)


@pytest.mark.slow
@pytest.mark.matrix
def test_standalone_cluster_mode_on_kill_kills_the_driver_and_the_next_run_is_exact(
    stack, airflow_connections, tmp_path
):
    stack.start_spark_cluster()
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap, partitions=2)
    table = f"eo_op_cluster_{topic.replace('-', '_')}"
    committed = jobs.produce_interleaved(bootstrap, topic, transactions=6, per_transaction=30, partitions=2)
    stream = _operator(
        stack,
        tmp_path,
        pipeline=f"op-cluster-{topic}",
        topics=topic,
        sink="postgres",
        sink_table=table,
        spark_conn_id="spark_standalone",
        trigger="processing-time",
        interval="1 second",
        max_offsets_per_trigger=40,
        conf=_standalone_conf(stack),
    )
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = stream.execute({})
        except BaseException as err:  # noqa: BLE001 - the killed driver must surface as an error
            outcome["error"] = err

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 240
    while stream.sink_state() is None and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.5)
    assert stream.sink_state() is not None, f"the stream committed nothing: {outcome}"
    driver = stream._hook._driver_id
    assert driver and _driver_state(stack, driver) == "RUNNING"
    stream.on_kill()
    thread.join(120)
    assert not thread.is_alive()
    assert isinstance(outcome.get("error"), AirflowException) and "KILLED" in str(outcome["error"]), outcome
    assert _driver_state(stack, driver) == "KILLED"
    _assert_ran_on_the_worker(stack, driver)
    # Killing the driver JVM ends its Python driver process too (no zombie keeps streaming).
    deadline = time.monotonic() + 30
    while _python_drivers(stream.pipeline) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _python_drivers(stream.pipeline)

    more = jobs.produce_interleaved(bootstrap, topic, transactions=3, per_transaction=30, partitions=2, tag="m")
    again = _operator(
        stack,
        tmp_path,
        pipeline=f"op-cluster-{topic}",
        topics=topic,
        sink="postgres",
        sink_table=table,
        spark_conn_id="spark_standalone",
        max_offsets_per_trigger=100,
        conf=_standalone_conf(stack),
    )
    state = again.execute({})
    assert _driver_state(stack, again._hook._driver_id) == "FINISHED"
    assert state["offsets"] == _end(bootstrap, topic)
    jobs.assert_exactly(jobs.postgres_rows(stack, table), committed + more)
