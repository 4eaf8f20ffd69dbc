"""Poison records: Kafka records a sink cannot store as they are. The job stops cleanly and names them.

Decision: by default (``on_bad_record="fail"``) a clean stop. Every sink stores ``record_key``/``record_value``
as text, so a key or value that is not valid UTF-8 (and, for PostgreSQL, text holding a NUL character) cannot
be written without changing it. The micro-batch holding it fails BEFORE its sink commit, so the sink's offsets
stay at the end of the last good batch: nothing is committed past the poison record (and nothing before it in
the same batch either; those are written by the run after the fix, exactly once). The error names the topic,
partition and offset of the first such records and a hex preview, so the producer can be fixed. A rerun
stops at the same place until the record is dealt with; the job never drops a record silently.

The alternative, ``on_bad_record="dead_letter"``, moves such records aside only where that move commits with
the batch: in the PostgreSQL batch's transaction, in the files sink's manifest, and for Delta in a dead-letter
table committed before the sink under an offset watermark (:mod:`~exactly_once_provider.sinks.dead_letters`),
for the append mode, up to a per-batch limit past which the batch stops as here. The CDC, current and window
modes have no such step yet and keep the clean stop; so do CDC and window mode's stricter checks: a record without
the key/version fields (CDC) or outside a framed settlement batch (window) stops the job the same way
(``cdc_changes``, ``settlement``).

Detection costs no extra pass: the job's projection wraps both columns in Spark's ``validate_utf8``, which
fails the write itself; only then is the batch's range read again to locate the records (:func:`locate`).
"""

from __future__ import annotations

import json

from exactly_once_provider.sinks.base import Offsets, offsets_to_json

# The projection every mode uses for the record text: fails the job on invalid UTF-8 instead of storing it.
KEY_TEXT = "validate_utf8(CAST(key AS STRING))"
VALUE_TEXT = "validate_utf8(CAST(value AS STRING))"


class PoisonRecordError(ValueError):
    """Raise when a batch holds records the sink cannot store; nothing of the batch was committed."""


def is_invalid_utf8(error: BaseException) -> bool:
    """Return True if a Spark failure (or its cause chain) was ``validate_utf8`` rejecting a value."""
    while error is not None:
        if "INVALID_UTF8_STRING" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def locate(raw, limit: int = 5) -> list[tuple]:
    """Return ``(topic, partition, offset, column, hex preview)`` of the first invalid-UTF-8 records.

    :param raw: the batch's Kafka range as Spark's Kafka source reads it (``key``/``value`` binary).
    """
    from pyspark.sql import functions as F

    bad_key = F.col("key").isNotNull() & ~F.is_valid_utf8(F.col("key").cast("string"))
    bad_value = F.col("value").isNotNull() & ~F.is_valid_utf8(F.col("value").cast("string"))
    rows = (
        raw.filter(bad_key | bad_value)
        .select(
            "topic",
            "partition",
            "offset",
            F.when(bad_key, "key").otherwise("value").alias("column"),
            F.hex(F.substring(F.when(bad_key, F.col("key")).otherwise(F.col("value")), 1, 24)).alias("hex"),
        )
        .orderBy("topic", "partition", "offset")
        .limit(limit)
        .collect()
    )
    return [tuple(r) for r in rows]


def refuse(
    found: list[tuple], reason: str, sink_kind: str, batch_id: int | None, committed: Offsets | None
) -> PoisonRecordError:
    """Return the error that stops the job at poison records (raise it)."""
    where = ", ".join(f"{t}/{p}@{o} ({c}{', 0x' + h if h else ''})" for t, p, o, c, h in found) or "unknown offsets"
    return PoisonRecordError(
        f"{'Batch %d' % batch_id if batch_id is not None else 'The batch'} holds records the {sink_kind} sink cannot store: {reason}, at {where}. Nothing of this "
        f"batch was committed; the sink stays at offsets {json.dumps(offsets_to_json(committed or {}))} and every rerun stops "
        "here. Fix the producer to write UTF-8 text (e.g. JSON) without NUL characters; the record itself must "
        "then be dealt with at the source (a new topic, or a re-extracted window), because the job never skips "
        "a record silently."
    )
