"""DeadLetterRepairOperator: bad input is a ValueError before anything is read; the selection is parsed."""

from __future__ import annotations

import pytest

from exactly_once_provider.operators.dead_letter_repair import DeadLetterRepairOperator


def _op(**kwargs) -> DeadLetterRepairOperator:
    return DeadLetterRepairOperator(task_id="r", **{"pipeline": "p", "sink_table": "orders", **kwargs})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"sink": "delta", "accept": True}, "built for the postgres sink"),
        ({}, "Give fix"),
        ({"accept": "maybe"}, "accept must be true or false"),
        ({"accept": True, "mode": "current"}, "built for the append and cdc modes"),
        ({"fix": "not a function"}, "fix must be a function"),
        ({"accept": True, "offsets": ["t@7"]}, "is not 'topic/partition@offset'"),
        ({"accept": True, "sink_table": ""}, "must be non-empty"),
    ],
)
def test_bad_input_is_a_value_error_before_any_connection(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _op(**kwargs).execute({})


def test_the_selection_takes_offsets_as_text_or_tuples_and_keys_as_text_or_bytes():
    selection = _op(
        error_classes=["invalid_utf8"], offsets=["shop.eo-orders/0@7", ("t", "1", 8)], keys=["k1", b"\xff"]
    )._selection()
    assert selection.error_classes == ("invalid_utf8",)
    assert selection.offsets == (("shop.eo-orders", 0, 7), ("t", 1, 8))
    assert selection.keys == (b"k1", b"\xff")
