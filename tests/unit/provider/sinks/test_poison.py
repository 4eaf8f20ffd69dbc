"""The poison-record error: recognised through Spark's exception chain, and a message that names the records."""

from __future__ import annotations

from exactly_once_provider.sinks.poison import PoisonRecordError, is_invalid_utf8, refuse


def test_invalid_utf8_failure_is_recognised_through_the_cause_chain():
    try:
        try:
            raise RuntimeError("[INVALID_UTF8_STRING] Invalid UTF8 byte sequence found in string: \\xFF")
        except RuntimeError as inner:
            raise Exception("StreamingQueryException: foreachBatch failed") from inner
    except Exception as outer:
        assert is_invalid_utf8(outer)
    assert not is_invalid_utf8(ValueError("something else"))


def test_error_names_the_records_and_the_offsets_the_sink_keeps():
    error = refuse([("t", 0, 7, "value", "7B226E")], "key or value is not valid UTF-8", "delta", 3, {"t": {0: 6}})
    assert isinstance(error, PoisonRecordError) and isinstance(error, ValueError)
    text = str(error)
    assert "Batch 3 holds records the delta sink cannot store" in text
    assert "t/0@7 (value, 0x7B226E)" in text and '{"t": {"0": 6}}' in text
    assert "never skips a record silently" in text
