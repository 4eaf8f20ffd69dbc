"""MariaDB GTID positions and states: parsing, and which delivered transactions a server lacks (no services)."""

from __future__ import annotations

import pytest

from exactly_once_provider.source.gtid import (
    Gtid,
    MissingRange,
    advance,
    format_position,
    missing,
    parse_list,
    parse_position,
)


def test_a_gtid_parses_and_prints_as_domain_server_sequence():
    assert Gtid.parse(" 0-1-77 ") == Gtid(0, 1, 77)
    assert str(Gtid(10, 2, 5)) == "10-2-5"
    for bad in ("0-1", "a-b-c", "0-1-2-3", "", "-1-2-3"):
        with pytest.raises(ValueError, match="domain-server_id-sequence"):
            Gtid.parse(bad)


def test_a_position_holds_one_gtid_per_domain_in_domain_order():
    position = parse_position("1-5-3,0-1-77")
    assert position == {0: Gtid(0, 1, 77), 1: Gtid(1, 5, 3)}
    assert format_position(position) == "0-1-77,1-5-3"
    assert parse_position("") == {} and parse_position(None) == {} and parse_list(None) == []
    with pytest.raises(ValueError, match="names domain 0 twice"):
        parse_position("0-1-77,0-2-80")  # a gtid_binlog_state, not a position


def test_advance_moves_only_the_transactions_domain():
    position = parse_position("0-1-77,1-5-3")
    advance(position, "1-6-4")
    advance(position, "2-1-1")
    assert format_position(position) == "0-1-77,1-6-4,2-1-1"


def test_nothing_is_missing_when_the_server_holds_every_delivered_gtid():
    state = parse_list("0-1-100,0-2-40,1-5-9")
    assert missing(parse_position("0-1-100"), state) == []
    assert missing(parse_position("0-1-90,1-5-9"), state) == []  # the server is ahead: fine
    assert missing({}, state) == []


def test_a_replica_behind_the_delivered_gtids_lacks_the_range_after_its_last():
    lost = missing(parse_position("0-1-100,1-5-9"), parse_list("0-1-95,1-5-9"))
    assert lost == [MissingRange(0, 1, 96, 100)]
    assert str(lost[0]) == "0-1-96 .. 0-1-100"
    assert str(MissingRange(0, 1, 100, 100)) == "0-1-100"


def test_higher_sequence_numbers_of_another_server_do_not_hide_missing_transactions():
    # The promoted replica lost 0-1-96..100, then took writes of its own up to 0-2-110.
    assert missing(parse_position("0-1-100"), parse_list("0-1-95,0-2-110")) == [MissingRange(0, 1, 96, 100)]


def test_a_domain_or_server_the_server_never_saw_is_missing_from_the_first():
    lost = missing(parse_position("0-1-10,3-1-4"), parse_list("0-1-10"))
    assert lost == [MissingRange(3, 1, None, 4)]
    assert str(lost[0]) == "every GTID of server 1 in domain 3 up to 3-1-4"


def test_a_range_touches_a_table_whose_last_delivered_change_is_inside_it():
    span = MissingRange(0, 1, 96, 100)
    assert span.touches(parse_position("0-1-98"))
    assert span.touches(parse_position("0-1-96"))
    assert not span.touches(parse_position("0-1-95"))  # its last change is before the range
    assert not span.touches(parse_position("1-1-99"))  # another domain
    assert MissingRange(0, 1, None, 5).touches(parse_position("0-1-1"))
