"""The dead-letter policy's checks and the Delta store's watermark rule (no services)."""

from __future__ import annotations

import pytest

from exactly_once_provider.sinks import dead_letters
from exactly_once_provider.spark_jobs.stream_spec import Route, StreamSpec

pytestmark = pytest.mark.unit


def _letter(partition: int, offset: int) -> dict:
    return {"kafka_topic": "t", "kafka_partition": partition, "kafka_offset": offset, "error_class": "invalid_utf8"}


def test_the_store_writes_only_letters_at_or_past_its_watermark():
    rows = [_letter(0, 3), _letter(0, 7), _letter(1, 2)]
    assert dead_letters.unheld(rows, {}) == rows
    # a crash after the store's commit of [0, 8) on partition 0: its replay (or a batch of another checkpoint
    # cut elsewhere) writes partition 0's letters no second time
    assert dead_letters.unheld(rows, {"t": {0: 8}}) == [_letter(1, 2)]
    assert dead_letters.unheld(rows, {"t": {0: 7, 1: 3}}) == [_letter(0, 7)]


def test_the_watermark_moves_to_the_batch_end_and_never_back():
    assert dead_letters.raised({"t": {0: 8}}, {"t": {0: 5, 1: 4}, "u": {0: 2}}) == {"t": {0: 8, 1: 4}, "u": {0: 2}}


def test_default_stores_sit_next_to_the_sink():
    assert dead_letters.default_store("postgres", "s.orders") == "s.orders_dead_letters"
    assert dead_letters.default_store("delta", "s3://b/lake/orders/") == "s3://b/lake/orders_dead_letters"
    assert dead_letters.default_store("files", "/lake/orders") == "/lake/orders/dead_letters"  # in its manifest


def test_the_limit_error_names_the_limit_the_store_and_the_offsets():
    err = dead_letters.limit_error(
        [("t", 0, 7, "invalid_utf8", "")],
        "3, more than max_dead_letters=2",
        "delta",
        "/lake/x_dead_letters",
        4,
        {"t": {0: 5}},
    )
    assert isinstance(err, ValueError)
    message = str(err)
    for part in (
        "Batch 4",
        "max_dead_letters=2",
        "/lake/x_dead_letters",
        "t/0@7",
        '{"t": {"0": 5}}',
        "Nothing of this batch",
    ):
        assert part in message


def _spec(**kwargs) -> StreamSpec:
    base = {"pipeline": "p", "topics": ("t",), "checkpoint": "/cp", "sink": "delta", "path": "/lake/x"}
    return StreamSpec(**{**base, **kwargs})


def test_fail_is_the_default_and_has_no_policy():
    assert _spec().validate().dead_letter_policy() is None


def test_dead_letter_policy_defaults():
    policy = _spec(on_bad_record="dead_letter", max_dead_letter_ratio=0.1).validate().dead_letter_policy()
    assert (policy.store, policy.max_letters, policy.max_ratio) == ("/lake/x_dead_letters", 100, 0.1)


def test_routes_get_each_their_own_store_and_refuse_a_shared_one():
    routes = (Route(("a",), path="/lake/a"), Route(("b",), path="/lake/b"))
    spec = _spec(topics=(), path=None, routes=routes, on_bad_record="dead_letter").validate()
    assert [q.dead_letter_policy().store for q in spec.queries()] == ["/lake/a_dead_letters", "/lake/b_dead_letters"]
    with pytest.raises(ValueError, match="with streams, leave it unset"):
        _spec(topics=(), path=None, routes=routes, on_bad_record="dead_letter", dead_letter_store="/dl").validate()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"on_bad_record": "dead_letter", "delivery": "at-least-once"}, "needs delivery='exactly-once'"),
        ({"on_bad_record": "dead_letter", "max_dead_letters": True}, "whole number"),
        ({"on_bad_record": "dead_letter", "max_dead_letter_ratio": 0}, r"in \(0, 1\]"),
        ({"on_bad_record": "dead_letter", "dead_letter_store": " "}, "dead_letter_store is empty"),
        ({"dead_letter_store": "/dl"}, "on_bad_record='dead_letter' only"),
    ],
)
def test_bad_policy_settings_are_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _spec(**kwargs).validate()


def test_cdc_current_and_window_modes_take_the_policy_with_their_mode():
    for mode in ("cdc", "current", "window"):
        policy = _spec(on_bad_record="dead_letter", mode=mode).validate().dead_letter_policy()
        assert policy.mode == mode
    with pytest.raises(ValueError, match="not yet for files"):
        _spec(on_bad_record="dead_letter", mode="window", sink="files", path="/lake/f").validate()


# The newest-version rule of the cdc and current modes: key -> newest (version, offset) in the batch.
@pytest.mark.parametrize(
    "bad, good, held",
    [
        ({("1",): (7, 3)}, {}, {("1",)}),  # only bad changes of the key: held back
        ({("1",): (7, 3)}, {("1",): (6, 2)}, {("1",)}),  # a good older change, the bad one newest: held back
        ({("1",): (7, 3)}, {("1",): (8, 4)}, set()),  # a good newer change follows the bad one: it applies
        ({("1",): (7, 3)}, {("1",): (7, 2)}, {("1",)}),  # equal versions: the later offset is the newer
        ({("1",): (7, 3), ("2",): (5, 1)}, {("2",): (9, 9)}, {("1",)}),  # per key
    ],
)
def test_a_key_is_held_back_only_when_its_newest_version_in_the_batch_is_a_letter(bad, good, held):
    assert dead_letters.held_back(bad, good) == held


def test_a_letters_key_and_version_are_read_from_its_value_despite_bad_bytes():
    current = dead_letters.ChangeKey.current(("id", "region"))
    update = b'{"op":"u","before":{"id":1,"region":"x"},"after":{"id":1,"region":"eu","s":"\xff"},"version":42}'
    assert current.of_record(update) == (("1", "eu"), 42)
    delete = b'{"op":"d","before":{"id":2,"region":"us"},"after":null,"version":"43"}'
    assert current.of_record(delete) == (("2", "us"), 43)
    assert current.of_record(b'{"after":{"id":1},"version":42}') is None  # a key part missing
    assert current.of_record(b'{"after":{"id":1,"region":"eu"},"version":4.5}') is None  # no whole version
    assert current.of_record(b"\xff\xfe not json") is None
    assert current.of_record(None) is None
    cdc = dead_letters.ChangeKey.cdc("source.table, pk", "meta.v")
    assert cdc.of_record(b'{"source":{"table":"t"},"pk":{"id":3},"meta":{"v":7}}') == (("t", '{"id":3}'), 7)
