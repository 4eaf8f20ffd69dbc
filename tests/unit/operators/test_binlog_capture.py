"""BinlogCaptureOperator: no I/O in __init__, templated values validated in execute()."""

from __future__ import annotations

import inspect

import pytest

from exactly_once_provider.operators.binlog_capture import BinlogCaptureOperator


def test_template_fields_are_constructor_arguments():
    params = inspect.signature(BinlogCaptureOperator.__init__).parameters
    assert set(BinlogCaptureOperator.template_fields) <= set(params)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"mode": "stream"}, "mode='stream'"),
        ({"mode": "continuous", "max_runtime": "-1"}, "max_runtime"),
        ({"pipeline": "bad name"}, "Invalid pipeline"),
        ({"max_records": 5}, "too small"),
    ],
)
def test_bad_arguments_are_refused_before_any_io(kwargs, message):
    op = BinlogCaptureOperator(task_id="c", **{"tables": ["t"], "pipeline": "p", **kwargs})
    with pytest.raises(ValueError, match=message):
        op.execute({})
