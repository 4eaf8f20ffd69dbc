"""SettlementReportOperator construction and its settings for a window-mode table on S3 (no services)."""

from __future__ import annotations

from exactly_once_provider.operators.settlement_report import SettlementReportOperator
from exactly_once_provider.spark_jobs.packages import SPARK_PACKAGES


def _op(**kwargs) -> SettlementReportOperator:
    base = {
        "task_id": "r",
        "window_id": "p/t/1",
        "sink_path": "/lake/w",
        "report_table": "r",
        "source_table": "t",
        "group_by": ["currency"],
        "sum_columns": ["amount"],
    }
    return SettlementReportOperator(**{**base, **kwargs})


def test_constructor_does_no_io_and_templates_match_arguments(monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_AWS_DEFAULT", raising=False)  # resolving it would fail
    op = _op(sink_path="s3://lake/w")
    assert all(hasattr(op, field) for field in op.template_fields) and op.aws_conn_id == "aws_default"


def test_a_table_on_s3_gets_the_aws_connection_in_the_secrets_file_and_the_s3a_package(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_AWS_LAKE",
        '{"conn_type": "aws", "login": "AKIA-lake", "password": '
        '"lake-s3cret", "extra": {"endpoint_url": "http://127.0.0.1:9"}}',
    )
    op = _op(sink_path="s3://lake/w", aws_conn_id="aws_lake")
    s3 = op.job_secrets()["s3"]
    assert (s3["access_key_id"], s3["secret_access_key"], s3["endpoint_url"]) == (
        "AKIA-lake",
        "lake-s3cret",
        "http://127.0.0.1:9",
    )
    assert any(p.startswith("org.apache.hadoop:hadoop-aws:") for p in op.default_packages())
    local = _op(aws_conn_id="aws_missing")
    assert local.job_secrets() == {} and local.default_packages() == SPARK_PACKAGES
