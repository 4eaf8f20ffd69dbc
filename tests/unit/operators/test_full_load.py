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


@pytest.mark.parametrize("kwargs,message", [
    ({"table": "", "sink_path": "/x"}, "table and sink_path"),
    ({"table": "t", "sink_path": "/x", "full_reload": "maybe"}, "full_reload must be true or false"),
])
def test_bad_templated_values_are_rejected_in_execute(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MySqlFullLoadOperator(task_id="t", **kwargs).execute({})


def test_the_request_is_validated_once_by_its_own_rules(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_MYSQL_DEFAULT", '{"conn_type": "mysql", "host": "h", "schema": "eo"}')
    with pytest.raises(ValueError, match="reader must be one of"):  # FullLoadRequest.validate, before any submit
        MySqlFullLoadOperator(task_id="t", table="t", sink_path="/x", reader="fast").execute({})
