from __future__ import annotations

import pytest

from exactly_once_provider.positions import BinlogPosition, parse_position


def test_positions_order_across_log_rotation():
    assert BinlogPosition("binlog.000009", 900) < BinlogPosition("binlog.000010", 4)
    assert BinlogPosition("binlog.000010", 4) < BinlogPosition("binlog.000010", 5)
    assert BinlogPosition("binlog.000010", 5) >= BinlogPosition("binlog.000010", 5)
    assert max([BinlogPosition("b.000002", 1), BinlogPosition("b.000010", 1)]).file == "b.000010"


@pytest.mark.parametrize("file,pos", [("binlog", 4), ("binlog.000001", -1)])
def test_invalid_positions_are_refused(file, pos):
    with pytest.raises(ValueError):
        BinlogPosition(file, pos)


def test_str_is_file_colon_offset():
    assert str(BinlogPosition("binlog.000003", 1234)) == "binlog.000003:1234"


def test_parse_position():
    assert parse_position("binlog.000003:4711") == BinlogPosition("binlog.000003", 4711)
    with pytest.raises(ValueError, match="FILE:POS"):
        parse_position("binlog.000003")


def test_every_wire_form_parses_to_one_position():
    position = BinlogPosition("binlog.000003", 4711)
    for form in (
        position,
        str(position),
        position.to_json(),
        {"position": position.to_json()},
        {"position": str(position)},
        {"log_file": "binlog.000003", "log_pos": 4711},
        {"format": 1, "binlog_file": "binlog.000003", "binlog_pos": "4711", "rows": 3},
    ):
        assert parse_position(form) == position
    with pytest.raises(ValueError, match="holds no binlog position"):
        parse_position({"offset": 3})
