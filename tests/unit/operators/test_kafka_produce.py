"""Operator construction and input validation (no services: nothing here may touch Kafka)."""

from __future__ import annotations

import inspect

import pytest

from exactly_once_provider.operators.kafka_produce import (
    SourceRecord,
    TransactionalProduceOperator,
    _as_record,
    _encode,
)


def _operator(**kwargs):
    fields = dict(
        task_id="produce",
        topic="t",
        pipeline="p",
        delivery_mode="exactly_once",
        producer_function=lambda resume_after: [],
    )
    fields.update(kwargs)
    return TransactionalProduceOperator(**fields)


def test_init_does_no_io_and_template_fields_name_constructor_args():
    operator = _operator(kafka_config_id="no_such_connection")  # no connection lookup in __init__
    parameters = inspect.signature(TransactionalProduceOperator.__init__).parameters
    for name in operator.template_fields:
        assert name in parameters and hasattr(operator, name)


def test_delivery_mode_has_no_default():
    with pytest.raises(TypeError, match="delivery_mode"):
        TransactionalProduceOperator(task_id="x", topic="t", pipeline="p", producer_function=print)


@pytest.mark.parametrize("mode", ["", "exactly-once", "EXACTLY_ONCE", "none"])
def test_unknown_delivery_mode_fails_in_execute_before_any_connection(mode):
    with pytest.raises(ValueError, match="choose 'exactly_once'.*'at_least_once'"):
        _operator(delivery_mode=mode, kafka_config_id="no_such_connection").execute({})


def test_tiny_transaction_policy_is_refused_before_any_connection():
    with pytest.raises(ValueError, match="too small"):
        _operator(max_records_per_transaction=5, kafka_config_id="no_such_connection").execute({})


def test_producer_function_must_be_callable():
    with pytest.raises(ValueError, match="callable"):
        _operator(producer_function=42).execute({})


def test_records_are_source_records_or_offset_key_value_tuples():
    assert _as_record((3, "k", "v")) == SourceRecord(offset=3, key="k", value="v")
    record = SourceRecord(offset=1, value=b"x", commit_point=False)
    assert _as_record(record) is record
    with pytest.raises(TypeError, match="yield SourceRecord"):
        _as_record({"offset": 1})
    assert _encode("é") == "é".encode() and _encode(None) is None
    with pytest.raises(TypeError, match="bytes, str or None"):
        _encode(12)
