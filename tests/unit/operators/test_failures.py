"""A PipelineError of the code that also runs without Airflow fails the task as an AirflowException, in one place."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowException

from exactly_once_provider.capture.loop import CaptureStoppedError
from exactly_once_provider.capture.resume import DivergedSourceError
from exactly_once_provider.errors import PipelineError
from exactly_once_provider.operators.failures import fail_task_on_pipeline_error

OPERATORS = Path(__file__).resolve().parents[3] / "operators"
ENTRY_POINTS = {"execute", "execute_complete", "poke"}
DECORATOR = f"{fail_task_on_pipeline_error.__name__}()"


class FencedError(PipelineError):
    """A driver-side failure of its own kind, as sinks and the Kafka writer define them."""


def test_a_pipeline_error_becomes_an_airflow_exception_with_its_message_and_cause():
    original = FencedError("Commit of batch 7 refused: a newer driver owns the checkpoint.")
    with pytest.raises(AirflowException) as raised, fail_task_on_pipeline_error():
        raise original
    assert str(raised.value) == str(original) and raised.value.__cause__ is original


@pytest.mark.parametrize("error", [ValueError("bad column"), AirflowException("no result"), KeyError("x")])
def test_any_other_error_passes_unchanged(error):
    with pytest.raises(type(error)) as raised, fail_task_on_pipeline_error():
        raise error
    assert raised.value is error


def test_as_a_decorator_it_keeps_the_method_and_its_result():
    class Operator:
        @fail_task_on_pipeline_error()
        def execute(self, context):
            """Run."""
            if context.get("fail"):
                raise PipelineError("stream lost")
            return {"rows": 3}

    assert Operator().execute({}) == {"rows": 3} and Operator.execute.__doc__ == "Run."
    with pytest.raises(AirflowException, match="stream lost"):
        Operator().execute({"fail": True})


def _entry_points():
    for path in sorted(OPERATORS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name in ENTRY_POINTS:
                        decorators = {ast.unparse(d) for d in item.decorator_list}
                        yield f"{path.name}:{node.name}.{item.name}", DECORATOR in decorators


def test_every_operator_entry_point_translates_pipeline_errors():
    found = dict(_entry_points())
    assert len(found) >= 10  # the check reads the operators it means to
    assert [name for name, decorated in found.items() if not decorated] == []


def test_the_capture_operator_fails_its_task_on_a_stopped_capture(monkeypatch):
    from exactly_once_provider.operators.binlog_capture import BinlogCaptureOperator

    op = BinlogCaptureOperator(task_id="c", tables=["eo.t"], pipeline="p")
    stopped = CaptureStoppedError("DROP TABLE eo.t at binlog.000003:4711: the stream cannot follow it.")
    monkeypatch.setattr(op, "_capture", lambda: (_ for _ in ()).throw(stopped))
    with pytest.raises(AirflowException, match="the stream cannot follow it") as raised:
        op.execute({})
    assert raised.value.__cause__ is stopped


def test_a_spark_operator_fails_its_task_on_a_diverged_source_before_submitting(monkeypatch):
    from exactly_once_provider.capture import resume
    from exactly_once_provider.kafka import offsets
    from exactly_once_provider.operators.full_load import MySqlFullLoadOperator

    monkeypatch.setenv("AIRFLOW_CONN_MYSQL_DEFAULT", '{"conn_type": "mysql", "host": "h", "schema": "eo"}')
    monkeypatch.setattr("exactly_once_provider.hooks.kafka_client.checked_kafka_config", lambda conn_id: {})
    monkeypatch.setattr(offsets, "read_committed_offset", lambda *args: SimpleNamespace(offset={"server_id": 1}))
    diverged = DivergedSourceError("The source server (server_id 2) lacks transactions the capture delivered")

    def version_base(hook, committed):
        raise diverged

    monkeypatch.setattr(resume, "full_load_version_base", version_base)
    op = MySqlFullLoadOperator(
        task_id="t", table="t", sink_path="/x", capture_pipeline="p", capture_source_partition="binlog"
    )
    with pytest.raises(AirflowException, match="lacks transactions") as raised:
        op.execute({})
    assert raised.value.__cause__ is diverged
