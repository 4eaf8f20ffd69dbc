"""SparkKafkaToSinkOperator: input validation, connection checks and the spark-submit command it builds."""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
import zipfile

import pytest
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk.exceptions import AirflowException

from exactly_once_provider.hooks.spark_submit import CleanEnvironmentSparkSubmitHook
from exactly_once_provider.operators import spark_submit
from exactly_once_provider.operators.spark_stream import SparkKafkaToSinkOperator
from exactly_once_provider.spark_jobs import kafka_to_sink
from exactly_once_provider.spark_jobs.packages import SPARK_PACKAGES


@pytest.fixture
def connections(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": "k:9092"}})
    )
    # No broker behind k:9092: the operator's access check is the integration tests' (a real SASL_SSL listener).
    monkeypatch.setattr("exactly_once_provider.connections.check_kafka_access", lambda config, conn_id: None)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_CLUSTER",
        json.dumps({"conn_type": "spark", "host": "spark://h", "port": 7077, "extra": {"deploy-mode": "cluster"}}),
    )
    # Port 1 on loopback: nothing listens, so the REST server check fails at once.
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_NO_REST",
        json.dumps(
            {
                "conn_type": "spark",
                "host": "spark://127.0.0.1",
                "port": 7077,
                "extra": {"deploy-mode": "cluster", "rest-port": 1},
            }
        ),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_POSTGRES_DEFAULT",
        json.dumps(
            {"conn_type": "postgres", "host": "db", "port": 5433, "login": "u", "password": "s3cret", "schema": "d"}
        ),
    )
    monkeypatch.delenv("AIRFLOW_CONN_SPARK_MISSING", raising=False)


def _op(**kwargs):
    base = {
        "task_id": "t",
        "pipeline": "p1",
        "topics": "a, b",
        "sink": "delta",
        "sink_path": "/tmp/x",
        "checkpoint_location": "/tmp/cp",
    }
    return SparkKafkaToSinkOperator(**{**base, **kwargs})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"sink": "kafka"}, "sink must be one of"),
        ({"sink_path": None}, "needs sink_path"),
        ({"sink": "postgres"}, "needs sink_table"),
        ({"topics": " , "}, "topics is empty"),
        ({"pipeline": "bad name"}, "pipeline must be"),
        ({"trigger": "once"}, "trigger must be one of"),
        ({"delivery": "maybe"}, "delivery must be one of"),
        ({"mode": "upsert"}, "mode must be"),
        ({"mode": "cdc", "sink": "files"}, "files sink only appends"),
        ({"mode": "window", "delivery": "at-least-once"}, "needs delivery='exactly-once'"),
        ({"on_bad_record": "skip"}, "on_bad_record must be one of"),
        ({"max_dead_letters": 5}, "apply with on_bad_record='dead_letter' only"),
        ({"on_bad_record": "dead_letter", "max_dead_letters": 0}, "max_dead_letters must be a whole number"),
        ({"on_bad_record": "dead_letter", "max_dead_letters": "many"}, "max_dead_letters must be a number"),
        (
            {"on_bad_record": "dead_letter", "max_dead_letter_ratio": 1.5},
            r"max_dead_letter_ratio must be a number in \(0, 1\]",
        ),
        ({"on_bad_record": "dead_letter", "sink": "files", "dead_letter_store": "/x"}, "in its own manifest"),
        ({"on_bad_record": "dead_letter", "mode": "window", "sink": "files"}, "not yet for files"),
        ({"on_bad_record": "dead_letter", "dead_letter_store": "/tmp/x"}, "is the sink itself"),
    ],
)
def test_bad_input_is_a_value_error_naming_the_setting(connections, kwargs, message):
    with pytest.raises(ValueError, match=message):
        _op(**kwargs).execute({})


def test_missing_spark_connection_is_an_error_not_yarn(connections):
    with pytest.raises(AirflowException, match="'spark_missing' is not defined"):
        _op(spark_conn_id="spark_missing").execute({})


def test_cluster_mode_without_the_masters_rest_server_is_refused_before_submitting(connections):
    with pytest.raises(AirflowException, match="spark.master.rest.enabled=true .* 'rest-port'"):
        _op(spark_conn_id="spark_no_rest").execute({})


class _FakeHook(CleanEnvironmentSparkSubmitHook):
    """The real hook class (connection resolution, tracking decisions) with spark-submit itself faked."""

    created: list[dict] = []
    driver_status = "FINISHED"

    def __init__(self, **kwargs):
        _FakeHook.created.append(dict(kwargs))
        super().__init__(**kwargs)


def _fake_submit(self, application="", **kwargs):
    """SparkSubmitHook.submit: record what spark-submit would get, read the job's files while they exist."""
    args = _FakeHook.created[-1]["application_args"]
    spec = json.loads(open(args[args.index("--spec") + 1]).read())
    path = spec["secrets_file"]
    with open(path) as handle:  # exists while the job runs
        secrets = json.load(handle)
    _FakeHook.created[-1].update(
        application=application,
        popen=kwargs,
        secrets=secrets,
        secrets_file=path,
        secrets_file_mode=stat.S_IMODE(os.stat(path).st_mode),
        spec=spec,
    )
    self._driver_id = "driver-20260101000000-0000" if self._should_track_driver_status else None
    return self._driver_id


def _fake_tracking(self):
    _FakeHook.created[-1]["tracked"] = self._driver_id
    self._driver_status = _FakeHook.driver_status


def _submitted(monkeypatch, op) -> dict:
    _FakeHook.created = []
    monkeypatch.setattr(SparkSubmitHook, "submit", _fake_submit)
    monkeypatch.setattr(SparkSubmitHook, "_start_driver_status_tracking", _fake_tracking)
    monkeypatch.setattr(op, "hook_class", _FakeHook)
    monkeypatch.setattr(op, "check_rest_server", lambda master, extra: None)  # no REST server in unit tests
    monkeypatch.setattr(op, "sink_state", lambda: None)
    op.execute({})
    return _FakeHook.created[-1]


def _job_args(call) -> list[str]:
    """The job's request as the command-line arguments it stands for."""
    params = call["spec"]["params"]
    args = ["--topics", ",".join(params["topics"]), "--mode", params["mode"]]
    return args + (["--table", params["table"]] if params["table"] else ["--path", params["path"]])


def test_command_ships_the_package_and_defaults_to_the_connector_packages(connections, monkeypatch):
    call = _submitted(monkeypatch, _op(spark_conn_id="spark_cluster", deploy_mode="client"))
    assert call["application"] == kafka_to_sink.__file__
    assert call["packages"] == ",".join(SPARK_PACKAGES) and call["jars"] is None
    assert call["deploy_mode"] == "client" and call["popen"]["start_new_session"] is True
    # No Airflow setting or connection reaches the driver (a task's blocked SQL_ALCHEMY_CONN fails its import).
    assert call.get("env_vars") is None
    assert not [k for k in call["popen"]["env"] if k.startswith(("AIRFLOW_CONN", "AIRFLOW__"))]
    assert call["application_args"] == ["--spec", call["application_args"][1]]  # nothing else on the command line
    args = _job_args(call)
    assert args[args.index("--topics") + 1] == "a,b"
    assert call["secrets"] == {"kafka": {"bootstrap.servers": "k:9092"}} and call["secrets_file_mode"] == 0o600
    assert not os.path.exists(call["secrets_file"])  # removed after the run
    assert args[args.index("--path") + 1] == "/tmp/x"


def test_resolved_jars_replace_packages_and_postgres_credentials_go_to_the_secrets_file(connections, monkeypatch):
    call = _submitted(monkeypatch, _op(sink="postgres", sink_table="s.t", conf={"spark.jars": "/j/a.jar"}))
    assert call["packages"] is None and call["conf"]["spark.jars"] == "/j/a.jar"
    assert call["secrets"]["libpq"]["PGPASSWORD"] == "s3cret" and call["secrets"]["libpq"]["PGHOST"] == "db"
    assert "s3cret" not in " ".join(call["application_args"]) + json.dumps(call["spec"]) + json.dumps(
        call.get("env_vars")
    )
    assert _submitted(monkeypatch, _op(jars=["/j/b.jar"]))["jars"] == "/j/b.jar"


def test_standalone_cluster_mode_submits_python_runner_and_tracks_the_driver(connections, monkeypatch):
    monkeypatch.setenv("AIRFLOW__CORE__FERNET_KEY", "never-leaves-airflow")
    call = _submitted(monkeypatch, _op(spark_conn_id="spark_cluster", sink="postgres", sink_table="s.t"))
    assert call["application"] == spark_submit.python_runner_jar() and "spark-core_" in call["application"]
    assert call["java_class"] == "org.apache.spark.deploy.PythonRunner"
    job, py_files, *rest = call["application_args"]
    assert job == kafka_to_sink.__file__ and py_files.endswith("exactly_once_provider.zip") and rest[0] == "--spec"
    args = _job_args(call)
    assert args[args.index("--topics") + 1] == "a,b" and args[args.index("--table") + 1] == "s.t"
    assert call["py_files"] is None and call.get("env_vars") is None  # the hook refuses env_vars in this mode
    assert call["conf"]["spark.submit.pyFiles"] == py_files
    assert call["conf"]["spark.pyspark.driver.python"] == sys.executable
    env = call["popen"]["env"]
    assert call["popen"]["start_new_session"] and call["secrets"]["libpq"]["PGPASSWORD"] == "s3cret"
    assert "PGPASSWORD" not in env or env["PGPASSWORD"] != "s3cret"  # never in spark-submit's environment
    assert not [name for name in env if name.startswith("AIRFLOW")]
    assert "s3cret" not in " ".join(call["application_args"]) + json.dumps(call["conf"])
    assert call["tracked"] == "driver-20260101000000-0000"


def test_cluster_mode_driver_that_does_not_finish_fails_the_task(connections, monkeypatch):
    monkeypatch.setattr(_FakeHook, "driver_status", "FAILED")
    with pytest.raises(AirflowException, match="driver-20260101000000-0000 of pipeline p1 ended FAILED"):
        _submitted(monkeypatch, _op(spark_conn_id="spark_cluster"))


def test_package_zip_holds_the_job_and_its_imports(tmp_path):
    with zipfile.ZipFile(spark_submit.package_zip(str(tmp_path))) as archive:
        names = set(archive.namelist())
    for module in (
        "__init__.py",
        "sinks/delta_commit.py",
        "spark_jobs/kafka_to_sink.py",
        "spark_jobs/batch.py",
        "sinks/postgres.py",
        "sinks/files.py",
        "sinks/delta.py",
    ):
        assert f"exactly_once_provider/{module}" in names


def test_dead_letter_policy_reaches_the_job_with_the_default_store(connections, monkeypatch):
    op = _op(on_bad_record="dead_letter", max_dead_letters="{{ 3 }}", sink="postgres", sink_table="s.orders")
    op.max_dead_letters = "3"  # as rendered
    params = _submitted(monkeypatch, op)["spec"]["params"]
    assert (params["on_bad_record"], params["max_dead_letters"], params["dead_letter_store"]) == (
        "dead_letter",
        3,
        None,
    )
    policy = kafka_to_sink.StreamSpec.from_json(params).dead_letter_policy()
    assert (policy.store, policy.max_letters, policy.max_ratio) == ("s.orders_dead_letters", 3, None)


def test_window_mode_is_passed_to_the_job(connections, monkeypatch):
    args = _job_args(_submitted(monkeypatch, _op(mode="window", sink="files")))
    assert args[args.index("--mode") + 1] == "window"


SASL_SSL = {
    "bootstrap.servers": "k:9093",
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "eo",
    "sasl.password": "kafka-MARKER-pw",
    "ssl.ca.location": "/etc/eo/ca.pem",
}


def test_kafka_secrets_reach_the_job_in_a_0600_file_only_and_spark_redacts_them(connections, monkeypatch, caplog):
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_SECURE", json.dumps({"conn_type": "kafka", "extra": SASL_SSL}))
    caplog.set_level(logging.DEBUG)
    call = _submitted(
        monkeypatch,
        _op(
            kafka_conn_id="kafka_secure", sink="postgres", sink_table="s.t", conf={"spark.redaction.regex": "(?i)mine"}
        ),
    )
    assert call["secrets"]["kafka"] == SASL_SSL and call["secrets_file_mode"] == 0o600
    assert call["secrets"]["libpq"]["PGPASSWORD"] == "s3cret"
    assert not os.path.exists(call["secrets_file"])
    visible = json.dumps({k: v for k, v in call.items() if k != "secrets"}) + caplog.text
    assert "kafka-MARKER-pw" not in visible and "s3cret" not in visible
    regex = call["conf"]["spark.redaction.regex"]
    assert regex.startswith("(?i)mine|") and "jaas" in regex and "password" in regex


def test_kafka_settings_the_spark_source_cannot_use_are_refused_before_submitting(connections, monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_KAFKA_GSSAPI",
        json.dumps(
            {
                "conn_type": "kafka",
                "extra": {"bootstrap.servers": "k:9093", "security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"},
            }
        ),
    )
    _FakeHook.created = []
    with pytest.raises(ValueError, match="'kafka_gssapi'.*sasl.mechanism='GSSAPI'"):
        _submitted(monkeypatch, _op(kafka_conn_id="kafka_gssapi"))
    assert _FakeHook.created == []


def test_a_files_sink_on_s3_gets_its_settings_in_the_secrets_file_only(connections, monkeypatch):
    from exactly_once_provider.storage import preflight as preflight_module

    monkeypatch.setenv(
        "AIRFLOW_CONN_AWS_LAKE",
        json.dumps(
            {
                "conn_type": "aws",
                "login": "AKIA-lake",
                "password": "lake-s3cret",
                "extra": {"endpoint_url": "http://127.0.0.1:9", "region_name": "eu-west-1"},
            }
        ),
    )
    checked = []
    monkeypatch.setattr(preflight_module, "preflight", lambda storage: checked.append(storage.uri()) or "ok")
    call = _submitted(monkeypatch, _op(sink="files", sink_path="s3://lake/orders", aws_conn_id="aws_lake"))
    assert checked == ["s3://lake/orders"]  # checked before the submit
    s3 = call["secrets"]["s3"]
    assert (s3["access_key_id"], s3["secret_access_key"], s3["endpoint_url"], s3["region_name"]) == (
        "AKIA-lake",
        "lake-s3cret",
        "http://127.0.0.1:9",
        "eu-west-1",
    )
    assert "org.apache.hadoop:hadoop-aws:" in call["packages"]
    visible = " ".join(call["application_args"]) + json.dumps(call["spec"]) + json.dumps(call["conf"])
    assert "lake-s3cret" not in visible and "AKIA-lake" not in visible


def test_a_delta_sink_and_a_checkpoint_on_s3_get_the_settings_in_the_secrets_file_only(connections, monkeypatch):
    from exactly_once_provider.storage import preflight as preflight_module

    monkeypatch.setenv(
        "AIRFLOW_CONN_AWS_LAKE",
        json.dumps(
            {
                "conn_type": "aws",
                "login": "AKIA-lake",
                "password": "lake-s3cret",
                "extra": {"endpoint_url": "http://127.0.0.1:9"},
            }
        ),
    )
    checked = []
    monkeypatch.setattr(preflight_module, "preflight", lambda storage: checked.append(storage.uri()) or "ok")
    monkeypatch.setattr(SparkKafkaToSinkOperator, "_delta_version", lambda self: -1)
    call = _submitted(
        monkeypatch,
        _op(
            sink="delta",
            sink_path="s3a://lake/t",
            aws_conn_id="aws_lake",
            checkpoint_location="s3://lake/_checkpoints/p",
        ),
    )
    # both checked before the submit: an unusable checkpoint location fails as early as the sink's
    assert checked == ["s3://lake/t", "s3://lake/_checkpoints/p"]
    assert call["secrets"]["s3"]["secret_access_key"] == "lake-s3cret"
    assert "org.apache.hadoop:hadoop-aws:" in call["packages"]


def test_a_bounded_run_gets_a_c1_only_jvm_and_a_stream_or_the_user_keeps_their_own(connections, monkeypatch):
    bounded = _submitted(monkeypatch, _op())["conf"]
    assert bounded["spark.driver.extraJavaOptions"] == "-XX:TieredStopAtLevel=1"
    assert bounded["spark.sql.shuffle.partitions"] == "2"
    stream = _submitted(monkeypatch, _op(trigger="processing-time"))["conf"]
    assert "spark.driver.extraJavaOptions" not in stream and stream["spark.sql.shuffle.partitions"] == "2"
    assert bounded["spark.sql.adaptive.enabled"] == stream["spark.sql.adaptive.enabled"] == "false"
    assert (
        _submitted(monkeypatch, _op(conf={"spark.sql.adaptive.enabled": "true"}))["conf"]["spark.sql.adaptive.enabled"]
        == "true"
    )
    mine = _submitted(monkeypatch, _op(conf={"spark.driver.extraJavaOptions": "-Dmine=1"}))["conf"]
    assert mine["spark.driver.extraJavaOptions"] == "-Dmine=1"


STREAMS = [
    {"topics": ["eo.orders"], "sink_path": "/tmp/orders", "checkpoint_location": "/tmp/cp/orders"},
    {"topics": "eo.lines", "sink_path": "/tmp/lines", "checkpoint_location": "/tmp/cp/lines"},
]


def test_streams_run_in_one_job_with_one_route_each(connections, monkeypatch):
    op = _op(topics=None, sink_path=None, checkpoint_location=None, mode="current", streams=STREAMS)
    call = _submitted(monkeypatch, op)
    params = call["spec"]["params"]
    assert params["routes"] == [
        {"topics": ["eo.orders"], "checkpoint": "/tmp/cp/orders", "path": "/tmp/orders", "table": None},
        {"topics": ["eo.lines"], "checkpoint": "/tmp/cp/lines", "path": "/tmp/lines", "table": None},
    ]
    assert params["topics"] == [] and params["path"] is None and params["checkpoint"] == ""
    assert [(v.topics, v.sink_path, v.checkpoint_location) for v in op.stream_views()] == [
        (["eo.orders"], "/tmp/orders", "/tmp/cp/orders"),
        (["eo.lines"], "/tmp/lines", "/tmp/cp/lines"),
    ]


def test_streams_without_their_own_checkpoints_share_one_query(connections, monkeypatch):
    shared = [{k: v for k, v in s.items() if k != "checkpoint_location"} for s in STREAMS]
    op = _op(topics=None, sink_path=None, checkpoint_location="/tmp/cp/all", mode="current", streams=shared)
    params = _submitted(monkeypatch, op)["spec"]["params"]
    assert params["checkpoint"] == "/tmp/cp/all" and [r["checkpoint"] for r in params["routes"]] == ["", ""]
    assert [(v.topics, v.checkpoint_location) for v in op.stream_views()] == [
        (["eo.orders"], "/tmp/cp/all"),
        (["eo.lines"], "/tmp/cp/all"),
    ]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"streams": STREAMS}, "leave topics, sink_path and sink_table unset"),
        (
            {"streams": STREAMS, "topics": None, "sink_path": None, "checkpoint_location": "/tmp/cp/all"},
            "leave each route's checkpoint unset",
        ),
        (
            {
                "streams": [STREAMS[0], {**STREAMS[1], "checkpoint_location": None}],
                "topics": None,
                "sink_path": None,
                "checkpoint_location": None,
            },
            "checkpoint_location is required: one for the query all routes share, or one per route",
        ),
        (
            {
                "streams": [STREAMS[0], {**STREAMS[1], "sink_path": "/tmp/orders"}],
                "topics": None,
                "sink_path": None,
                "checkpoint_location": None,
            },
            "Two routes share the sink '/tmp/orders'",
        ),
        (
            {
                "streams": [STREAMS[0], {**STREAMS[1], "checkpoint_location": "/tmp/cp/orders"}],
                "topics": None,
                "sink_path": None,
                "checkpoint_location": None,
            },
            "Two routes share the checkpoint",
        ),
        (
            {
                "streams": [STREAMS[0], {**STREAMS[1], "topics": ["eo.orders"]}],
                "topics": None,
                "sink_path": None,
                "checkpoint_location": None,
            },
            "Two routes share the topic 'eo.orders'",
        ),
        (
            {"streams": [{**STREAMS[0], "path": "/x"}], "topics": None, "sink_path": None, "checkpoint_location": None},
            r"unknown settings \['path'\]",
        ),
        (
            {
                "streams": [{**STREAMS[0], "sink_path": None}],
                "topics": None,
                "sink_path": None,
                "checkpoint_location": None,
            },
            "needs sink_path",
        ),
        (
            {"streams": STREAMS, "mode": "window", "topics": None, "sink_path": None, "checkpoint_location": None},
            "takes no routes",
        ),
    ],
)
def test_bad_streams_are_refused_naming_the_setting(connections, kwargs, message):
    with pytest.raises(ValueError, match=message):
        _op(**kwargs).execute({})


def test_a_killed_stream_driver_restarts_at_once_for_what_is_left_of_max_runtime(connections, monkeypatch):
    op = _op(trigger="processing-time", max_runtime=300, driver_restarts=1)
    runs = []

    def killed_then_running(self, application="", **kwargs):
        _fake_submit(self, application, **kwargs)
        runs.append(_FakeHook.created[-1]["spec"]["params"]["max_runtime"])
        if len(runs) == 1:
            raise AirflowException("Cannot execute: spark-submit ... Error code is: -9.")

    _submitted(monkeypatch, op)  # the fakes in place; one plain run
    monkeypatch.setattr(SparkSubmitHook, "submit", killed_then_running)
    op.restarted_after = None
    op.execute({})
    assert len(runs) == 2 and runs[0] == 300 and 290 < runs[1] < 300
    assert not op.may_restart(301)


def test_an_iceberg_sink_gets_its_catalog_in_the_secrets_file_only(connections, monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_LAKE_CATALOG",
        json.dumps(
            {
                "conn_type": "postgres",
                "host": "catalog-db",
                "login": "cat",
                "password": "cat-s3cret",
                "schema": "lake",
                "extra": {"sslmode": "verify-full"},
            }
        ),
    )
    op = _op(sink="iceberg", sink_table="lake.orders", sink_path="/lake/orders", iceberg_conn_id="lake_catalog")
    call = _submitted(monkeypatch, op)
    params = call["spec"]["params"]
    assert (params["sink"], params["table"], params["path"]) == ("iceberg", "lake.orders", "/lake/orders")
    catalog = call["secrets"]["iceberg"]
    assert (catalog["type"], catalog["name"]) == ("sql", "eo")
    assert catalog["postgres"]["host"] == "catalog-db" and catalog["postgres"]["sslmode"] == "verify-full"
    assert catalog["postgres"]["password"] == "cat-s3cret" and call["secrets_file_mode"] == 0o600
    visible = " ".join(call["application_args"]) + json.dumps(call["spec"]) + json.dumps(call["conf"])
    assert "cat-s3cret" not in visible
    with pytest.raises(ValueError, match="no dead-letter store yet"):
        _op(sink="iceberg", sink_table="lake.orders", on_bad_record="dead_letter").execute({})
