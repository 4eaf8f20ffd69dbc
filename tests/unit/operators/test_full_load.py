"""MySqlFullLoadOperator construction and input validation (no services)."""

from __future__ import annotations

import pytest

from exactly_once_provider.operators.full_load import MySqlFullLoadOperator


def test_constructor_does_no_io_and_templates_match_arguments(monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_MYSQL_DEFAULT", raising=False)  # resolving it would fail
    op = MySqlFullLoadOperator(task_id="t", table="{{ params.table }}", sink_path="/lake/t", full_reload="{{ x }}")
    for field in op.template_fields:
        assert hasattr(op, field)
    assert op.table == "{{ params.table }}"


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"table": "", "sink_path": "/x"}, "table and sink_path"),
        ({"table": "t", "sink_path": "/x", "full_reload": "maybe"}, "full_reload must be true or false"),
    ],
)
def test_bad_templated_values_are_rejected_in_execute(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MySqlFullLoadOperator(task_id="t", **kwargs).execute({})


def test_the_request_is_validated_once_by_its_own_rules(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_MYSQL_DEFAULT", '{"conn_type": "mysql", "host": "h", "schema": "eo"}')
    with pytest.raises(ValueError, match="reader must be one of"):  # FullLoadRequest.validate, before any submit
        MySqlFullLoadOperator(task_id="t", table="t", sink_path="/x", reader="fast").execute({})


def test_a_capture_pipeline_needs_its_ledger_partition(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_MYSQL_DEFAULT", '{"conn_type": "mysql", "host": "h", "schema": "eo"}')
    with pytest.raises(ValueError, match="capture_pipeline needs capture_source_partition"):
        MySqlFullLoadOperator(task_id="t", table="t", sink_path="/x", capture_pipeline="p").execute({})


def test_the_version_base_comes_from_the_capture_s_ledger_on_the_server_read(monkeypatch):
    from types import SimpleNamespace

    from exactly_once_provider.capture import resume
    from exactly_once_provider.kafka import offsets

    monkeypatch.setenv("AIRFLOW_CONN_MYSQL_DEFAULT", '{"conn_type": "mysql", "host": "h", "schema": "eo"}')
    monkeypatch.setattr("exactly_once_provider.hooks.kafka_client.checked_kafka_config", lambda conn_id: {})
    asked = []

    def committed(config, pipeline, partition, topic):
        asked.append((pipeline, partition, topic))
        if pipeline == "fresh":
            raise ValueError(f"Offsets topic {topic!r} does not exist; create it with ensure_offsets_topic().")
        return SimpleNamespace(offset={"file": "binlog.000001", "pos": 4, "server_id": 7, "version_base": 99})

    monkeypatch.setattr(offsets, "read_committed_offset", committed)
    monkeypatch.setattr(
        resume,
        "full_load_version_base",
        lambda hook, found: (0, 7) if found is None else (found.offset["version_base"], 7),
    )
    op = MySqlFullLoadOperator(
        task_id="t",
        table="t",
        sink_path="/x",
        capture_pipeline="p",
        capture_source_partition="binlog",
        offsets_topic="ledger",
    )
    assert op.job_params({})["version_base"] == 99 and op.job_params({})["server_id"] == 7
    assert asked[0] == ("p", "binlog", "ledger")
    fresh = MySqlFullLoadOperator(
        task_id="t", table="t", sink_path="/x", capture_pipeline="fresh", capture_source_partition="binlog"
    )
    assert (fresh.job_params({})["version_base"], fresh.job_params({})["server_id"]) == (0, 7)
    assert MySqlFullLoadOperator(task_id="t", table="t", sink_path="/x").job_params({})["version_base"] == 0


AWS_LAKE = (
    '{"conn_type": "aws", "login": "AKIA-lake", "password": "lake-s3cret", '
    '"extra": {"endpoint_url": "http://127.0.0.1:9"}}'
)


def test_a_sink_on_s3_is_checked_first_and_its_connection_reaches_the_driver_in_the_secrets_file_only(monkeypatch):
    from exactly_once_provider.spark_jobs.packages import SPARK_PACKAGES
    from exactly_once_provider.storage import preflight as preflight_module
    from exactly_once_provider.storage import s3 as s3_module

    monkeypatch.setattr(s3_module, "_registered", None)  # the operator registers them for its task's process
    monkeypatch.setenv("AIRFLOW_CONN_MYSQL_DEFAULT", '{"conn_type": "mysql", "host": "h", "schema": "eo"}')
    monkeypatch.setenv("AIRFLOW_CONN_AWS_LAKE", AWS_LAKE)
    checked = []
    monkeypatch.setattr(preflight_module, "preflight", lambda storage: checked.append(storage.uri()) or "ok")
    op = MySqlFullLoadOperator(
        task_id="t", table="t", sink_path="s3://lake/t", staging_path="/stage/t", aws_conn_id="aws_lake"
    )
    params = op.job_params({})
    secrets = op.job_secrets()
    assert (secrets["s3"]["access_key_id"], secrets["s3"]["secret_access_key"]) == ("AKIA-lake", "lake-s3cret")
    assert secrets["mysql"]["settings"]["host"] == "h" and "lake-s3cret" not in str(params)
    assert any(p.startswith("org.apache.hadoop:hadoop-aws:") for p in op.default_packages())
    op.before_submit()
    assert checked == ["s3://lake/t"] and s3_module.registered_settings().conn_id == "aws_lake"

    local = MySqlFullLoadOperator(task_id="t", table="t", sink_path="/lake/t", aws_conn_id="aws_missing")
    assert "s3" not in local.job_secrets() and local.default_packages() == SPARK_PACKAGES


def test_a_staging_area_on_s3_is_checked_first_and_its_settings_reach_the_driver_in_the_secrets_file_only(monkeypatch):
    from exactly_once_provider.storage import preflight as preflight_module
    from exactly_once_provider.storage import s3 as s3_module

    monkeypatch.setattr(s3_module, "_registered", None)
    monkeypatch.setenv("AIRFLOW_CONN_MYSQL_DEFAULT", '{"conn_type": "mysql", "host": "h", "schema": "eo"}')
    monkeypatch.setenv("AIRFLOW_CONN_AWS_LAKE", AWS_LAKE)
    checked = []
    monkeypatch.setattr(preflight_module, "preflight", lambda storage: checked.append(storage.uri()) or "ok")
    # the default staging area is next to a sink on S3; a local sink may stage on S3 too
    for kwargs, staging in [
        ({"sink_path": "s3://lake/t"}, "s3://lake/t._eo_full_load"),
        ({"sink_path": "/lake/t", "staging_path": "s3a://stage/t"}, "s3://stage/t"),
    ]:
        checked.clear()
        op = MySqlFullLoadOperator(task_id="t", table="t", aws_conn_id="aws_lake", **kwargs)
        params = op.job_params({})
        assert params["staging_path"] == kwargs.get("staging_path")
        secrets = op.job_secrets()
        assert secrets["s3"]["secret_access_key"] == "lake-s3cret" and "lake-s3cret" not in str(params)
        assert any(p.startswith("org.apache.hadoop:hadoop-aws:") for p in op.default_packages())
        op.before_submit()
        assert checked == [p for p in (kwargs["sink_path"], staging) if p.startswith("s3")]


def test_reload_tables_takes_a_list_or_its_rendered_json_and_refuses_a_table_the_load_does_not_have():
    def reload(value, **kwargs):
        kwargs = {"tables": ["orders", "lines"], "sink_path": "/lake/{table}", **kwargs}
        return MySqlFullLoadOperator(task_id="load", reload_tables=value, **kwargs)._reload()

    assert reload(None) == reload("[]") == reload("") == set()
    assert reload('["orders"]') == reload(["orders"]) == {"orders"}
    assert reload(["orders"], tables=None, table="orders", sink_path="/lake/orders") == {"orders"}
    with pytest.raises(ValueError, match=r"names \['shop'\], which this load does not have"):
        reload('["shop"]')
    with pytest.raises(ValueError, match="list of table names"):
        reload("orders")
    with pytest.raises(ValueError, match="each table's location"):
        MySqlFullLoadOperator(task_id="load", tables=["a", "b"], sink_path="/lake/one")._names()
