"""Which dead letters are new, what an event says about them, and the Asset helper's checks."""

from __future__ import annotations

import datetime as dt

import pytest

from exactly_once_provider.assets import dead_letters
from exactly_once_provider.triggers.dead_letters import DeadLetterTrigger, describe_letters, letter_mark, new_letters

T0 = dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.UTC)


def letter(offset, seconds, partition=0, error="invalid_utf8", naive=False):
    at = T0 + dt.timedelta(seconds=seconds)
    return {
        "kafka_topic": "t",
        "kafka_partition": partition,
        "kafka_offset": offset,
        "error_class": error,
        "error_message": "m",
        "dead_lettered_at": at.replace(tzinfo=None) if naive else at,
    }


def test_letters_past_the_mark_are_new_oldest_first_whatever_the_read_order():
    letters = [letter(9, 5), letter(2, 1), letter(4, 5, partition=1), letter(3, 1, naive=True)]
    assert [r["kafka_offset"] for r in new_letters(letters, None)] == [2, 3, 9, 4]
    mark = letter_mark(letter(3, 1))
    assert [r["kafka_offset"] for r in new_letters(letters, mark)] == [9, 4]
    assert new_letters(letters, letter_mark(letter(4, 5, partition=1))) == []


def test_an_event_counts_every_new_letter_and_names_the_newest():
    new = [letter(o, o, error="nul_character" if o % 3 else "invalid_utf8") for o in range(30)]
    extra = describe_letters(new, 31, "s_dead_letters", "p")
    assert extra["new_letters"] == 30 and extra["open_letters"] == 31
    assert extra["by_class"] == {"invalid_utf8": 10, "nul_character": 20}
    assert len(extra["letters"]) == 20 and extra["letters"][-1]["record"] == "t/0@29"


def test_the_asset_watches_postgres_and_delta_stores_only():
    asset = dead_letters("postgres", "orders", "p", poll_interval=5)
    assert asset.name == "p.dead_letters"
    trigger = asset.watchers[0].trigger
    assert isinstance(trigger, DeadLetterTrigger) and trigger.serialize()[1]["poll_interval"] == 5
    with pytest.raises(ValueError, match="manifest"):
        dead_letters("files", "/lake/t", "p")
    with pytest.raises(ValueError, match="poll_interval"):
        dead_letters("delta", "/lake/t", "p", poll_interval=0)
