"""ConsumerLagSensor under a real Airflow: while the sink is more than ``max_lag`` records behind its topic, the
sensor defers to the triggerer (the task instance is ``deferred`` and holds no worker slot); when a Spark apply in
another DAG, triggered through the REST API, catches the sink up, the trigger fires and the task resumes and
succeeds. The sink is read with pyarrow from the Delta log's live files, the topic with a raw consumer.

A third DAG is scheduled on the sink's commits (``sink_commits``: an AssetWatcher in the triggerer): the apply's
commit starts it through the scheduler, with the batch's figures (rows, offsets) in the Asset event's extra."""

from __future__ import annotations

import textwrap
import time
import uuid

import pytest

from tests import spark_job_support as jobs
from tests.kafka_support import new_topic

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

MAX_LAG = 20


def _dag_file(folder, dag_id: str, body: str) -> None:
    # "airflow" and "dag" must appear in the file, or the DAG processor's safe mode skips it.
    (folder / f"{dag_id}.py").write_text(
        textwrap.dedent(f"""\
        # An airflow DAG written by a test.
        import pendulum
        from airflow.sdk import DAG

        with DAG(dag_id={dag_id!r}, schedule=None, start_date=pendulum.datetime(2026, 1, 1), catchup=False):
        """)
        + textwrap.indent(textwrap.dedent(body), "    ")
    )


def _wait_state(client, dag_id: str, run_id: str, task_id: str, state: str, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ti = client.task_instance(dag_id, run_id, task_id)
        if ti["state"] == state:
            return ti
        assert ti["state"] not in ("success", "failed", "upstream_failed"), ti
        time.sleep(1)
    raise AssertionError(f"{dag_id}.{task_id} never reached {state}:\n{client.describe(dag_id, run_id)}")


def test_lag_sensor_defers_to_the_triggerer_and_resumes_when_the_sink_catches_up(stack, airflow_server, tmp_path):
    client = airflow_server.client
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap, partitions=2)
    committed = jobs.produce_interleaved(bootstrap, topic, transactions=4, per_transaction=25, partitions=2)
    jobs.wait_for_committed_end(bootstrap, topic, 2)
    sink, pipeline, tag = str(tmp_path / "sink"), f"lag-{topic}", uuid.uuid4().hex[:6]
    gate, apply = f"eo_lag_gate_{tag}", f"eo_lag_apply_{tag}"
    _dag_file(
        airflow_server.dags,
        gate,
        f"""\
        from exactly_once_provider.operators.backpressure import ConsumerLagSensor

        ConsumerLagSensor(task_id="lag_gate", topics=[{topic!r}], max_lag={MAX_LAG}, sink="delta",
                          sink_location={sink!r}, sink_pipeline={pipeline!r}, missing_topics_ok=False,
                          poke_interval=2, timeout=900)
        """,
    )
    _dag_file(
        airflow_server.dags,
        apply,
        f"""\
        from exactly_once_provider.operators.spark_stream import SparkKafkaToSinkOperator

        SparkKafkaToSinkOperator(task_id="apply", pipeline={pipeline!r}, topics=[{topic!r}], sink="delta",
                                 sink_path={sink!r}, checkpoint_location={str(tmp_path / "checkpoint")!r},
                                 conf={{"spark.jars": {stack.spark_conf()["spark.jars"]!r}}})
        """,
    )
    downstream = f"eo_on_commit_{tag}"
    (airflow_server.dags / f"{downstream}.py").write_text(
        textwrap.dedent(f"""\
        # An airflow DAG written by a test: it runs on each commit of the apply's sink.
        import pendulum
        from airflow.sdk import DAG, task

        from exactly_once_provider.assets import sink_commits

        # Unpaused at creation: Airflow registers an Asset's watchers when it parses an unpaused DAG.
        with DAG(dag_id={downstream!r}, start_date=pendulum.datetime(2026, 1, 1), catchup=False,
                 is_paused_upon_creation=False,
                 schedule=[sink_commits("delta", {sink!r}, {pipeline!r}, poll_interval=1)]):
            @task
            def refresh(triggering_asset_events=None):
                for asset, events in triggering_asset_events.items():
                    print("refresh on", asset.uri, [e.extra["payload"]["rows_total"] for e in events])

            refresh()
        """)
    )
    for dag_id in (gate, apply, downstream):
        client.wait_dag(dag_id)
        client.unpause(dag_id)

    # 1. 100 committed records, nothing applied: lag > MAX_LAG, so the sensor hands its wait to the triggerer.
    gate_run = client.trigger(gate)
    ti = _wait_state(client, gate, gate_run, "lag_gate", "deferred")
    assert ti["trigger"]["classpath"].endswith("ConsumerLagTrigger"), ti
    deadline = time.monotonic() + 60
    while not ti.get("triggerer_job") and time.monotonic() < deadline:  # the triggerer picks the trigger up
        time.sleep(1)
        ti = client.task_instance(gate, gate_run, "lag_gate")
    assert ti.get("triggerer_job"), ti
    time.sleep(8)  # several trigger checks (every 2 s): still behind, still deferred, no worker slot held
    assert client.task_instance(gate, gate_run, "lag_gate")["state"] == "deferred"

    # 2. The apply (another DAG, through the REST API) catches the sink up; the trigger fires, the task resumes.
    apply_run = client.trigger(apply)
    client.wait_run(apply, apply_run, timeout=600)
    client.wait_run(gate, gate_run, timeout=300)
    log = client.task_log(gate, gate_run, "lag_gate")
    assert f"(limit {MAX_LAG})" in log and "after" in log, log[-3000:]

    # 3. Independent checks: the sink holds every committed record once, and it is at the topic's end.
    jobs.assert_exactly(jobs.delta_rows(sink), committed)
    assert len(jobs.delta_rows(sink)) == len(committed) > MAX_LAG

    # 4. The sink's commit ran the downstream DAG, its Asset event carrying the batch's figures.
    end = jobs.end_offsets(bootstrap, topic, 2)
    deadline, extras = time.monotonic() + 180, []
    while time.monotonic() < deadline:
        runs = [r for r in client.runs(downstream) if r["state"] == "success"]
        extras = [
            event["extra"]["payload"]  # a watcher's event: Airflow puts the trigger's payload under "payload"
            for r in runs
            for event in client.request("GET", f"/dags/{downstream}/dagRuns/{r['dag_run_id']}/upstreamAssetEvents")[
                "asset_events"
            ]
        ]
        if any(e.get("rows_total") == len(committed) for e in extras):
            break
        time.sleep(2)
    last = max(extras, key=lambda e: e["batch_id"], default={})
    assert last.get("rows_total") == len(committed) and last["pipeline"] == pipeline, extras
    assert {int(p): o for p, o in last["offsets"][topic].items()} == end, (last, end)
    assert len({(e["checkpoint"], e["batch_id"]) for e in extras}) == len(extras), extras  # each announced once
