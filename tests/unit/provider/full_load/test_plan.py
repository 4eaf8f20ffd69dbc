"""Chunk plans survive JSON with their key types intact."""

from __future__ import annotations

import datetime as dt
import decimal

import pytest

from exactly_once_provider.full_load.plan import chunk_from_json, chunk_to_json, decode_value, encode_value
from exactly_once_provider.source.snapshot import Chunk


@pytest.mark.parametrize(
    "value",
    [
        7,
        -(2**63),
        2**64 - 1,
        "päß😀",
        b"\x00\xff`",
        decimal.Decimal("12.340"),
        dt.datetime(2024, 3, 31, 2, 30, 0, 5),
        dt.date(2024, 2, 29),
        1.25,
        None,
    ],
)
def test_values_round_trip_exactly(value):
    back = decode_value(encode_value(value))
    assert back == value and type(back) is type(value)


def test_chunk_round_trip():
    chunk = Chunk(3, (1, "a"), (2, b"z"))
    assert chunk_from_json(chunk_to_json(chunk)) == chunk
    assert chunk_from_json(chunk_to_json(Chunk(0, None, None))) == Chunk(0, None, None)


def test_unsupported_key_type_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot be used as a chunk boundary"):
        encode_value(object())
