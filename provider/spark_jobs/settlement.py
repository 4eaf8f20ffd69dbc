"""Window mode (``--mode window``): a settlement batch replaces its window's output atomically; newer versions win.

A batch of :class:`~exactly_once_provider.operators.watermark_extract.WatermarkExtractOperator` is ONE Kafka
transaction framed per partition of the topic (:mod:`exactly_once_provider.hooks.kafka_producer`)::

    begin marker   header eo.marker=begin   JSON {pipeline, source_partition, batch_id, batch_version, ...}
    data records   header eo.batch=<pipeline>/<source_partition>/<batch_id>/v<batch_version>
    end marker     header eo.marker=end     JSON {..., "records": <data records in this partition>,
                                                        "batch_records": <data records of the whole batch>}

The window is ``<pipeline>/<source_partition>/<batch_id>``; a re-extract publishes ``batch_version + 1``.

Each micro-batch re-reads Kafka from the sink's committed offsets to the micro-batch's end offsets (the
streaming DataFrame only paces the query) and :func:`plan_windows` decides:

* a window version is COMPLETE when its end markers account for all its records; it is checked (its begin
  marker and exactly ``records`` data records in every partition with an end marker) and, if it is newer
  than the version the sink holds, published: the sink replaces the window's rows, records the version and
  commits the offsets in ONE atomic step (``commit_windows`` of each sink);
* an INCOMPLETE version (a micro-batch cut through it) is never published: the offsets the sink commits
  stay at its begin marker in each partition (the *carry*), so the next micro-batch reads it again, whole;
* a version at or below the sink's is skipped: an older version arriving later never wins.

The sink's offsets stay the source of truth: they are always at or before the first record of any window
not yet settled, so a lost or replayed checkpoint re-reads from there and the version check makes the
re-read harmless.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from exactly_once_provider.sinks.base import Offsets, newer_version

MARKER_HEADER = "eo.marker"  # same names as exactly_once_provider.kafka.offsets / .windows (no confluent-kafka here)
BATCH_HEADER = "eo.batch"
_HEADER = re.compile(r"^(?P<window>.+)/v(?P<version>\d+)$")


class WindowIntegrityError(ValueError):
    """Raise when a settlement batch in Kafka is not what its markers announce."""


@dataclass(frozen=True)
class Marker:
    """A begin or end marker as read from the topic."""

    topic: str
    partition: int
    offset: int
    kind: str  # "begin" | "end"
    window_id: str
    version: int
    records: int = 0  # end: data records of the batch in this partition
    batch_records: int = 0  # end: data records of the whole batch

    @classmethod
    def parse(cls, topic: str, partition: int, offset: int, kind: str, value: bytes | str) -> Marker:
        """Return the marker of a record carrying the ``eo.marker`` header; raise if its body is not one."""
        try:
            body = json.loads(value)
            window = f"{body['pipeline']}/{body['source_partition']}/{body['batch_id']}"
            version = int(body["batch_version"])
            records = int(body.get("records") or 0)
            total = int(body.get("batch_records") or 0)
        except (TypeError, ValueError, KeyError) as err:
            raise WindowIntegrityError(
                f"{topic}/{partition}@{offset} has header {MARKER_HEADER}={kind!r} but its value is not a batch "
                f"marker ({err!r}): only WatermarkExtractOperator / TransactionalProducerHook(batch_markers=True) "
                "may write this topic in window mode."
            ) from None
        if kind not in ("begin", "end"):
            raise WindowIntegrityError(f"{topic}/{partition}@{offset}: unknown marker kind {kind!r}.")
        return cls(topic, partition, offset, kind, window, version, records, total)


def batch_header(window_id: str, version: int) -> str:
    """Return the ``eo.batch`` header value of the data records of one window version."""
    return f"{window_id}/v{version}"


def parse_batch_header(value: str) -> tuple[str, int]:
    """Return ``(window id, version)`` of an ``eo.batch`` header value."""
    match = _HEADER.match(value)
    if not match:
        raise WindowIntegrityError(f"{BATCH_HEADER} header {value!r} is not '<window>/v<version>'.")
    return match["window"], int(match["version"])


@dataclass
class WindowPlan:
    """What one micro-batch does in window mode.

    :param publish: window id -> version to publish now (replacing the sink's rows of that window).
    :param rows: window id -> data records of the published version.
    :param carry: the offsets the sink commits: the next read starts there.
    :param incomplete: ``window vN`` of versions cut by the read (read again next time).
    :param stale: ``window vN`` of versions at or below what the sink holds (skipped).
    """

    publish: dict[str, int] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    carry: Offsets = field(default_factory=dict)
    incomplete: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)


def plan_windows(
    markers: list[Marker],
    data_counts: dict[tuple[str, str, int], int],
    start: Offsets,
    end: Offsets,
    published: dict[str, int],
) -> WindowPlan:
    """Decide which window versions of a read ``[start, end)`` are published and where the next read starts.

    :param markers: every begin/end marker in the read.
    :param data_counts: ``(eo.batch header, topic, partition) -> data records`` in the read.
    :param start: where the read started (the sink's committed offsets; missing partitions: earliest).
    :param end: where the read ended (exclusive).
    :param published: window id -> version the sink holds.
    """
    plan = WindowPlan(
        carry={t: {p: max(o, start.get(t, {}).get(p, 0)) for p, o in parts.items()} for t, parts in end.items()}
    )
    versions: dict[tuple[str, int], list[Marker]] = {}
    for marker in markers:
        versions.setdefault((marker.window_id, marker.version), []).append(marker)
    complete: dict[str, int] = {}
    for (window, version), found in sorted(versions.items()):
        label = f"{window} v{version}"
        if not newer_version(version, published.get(window)):
            plan.stale.append(label)
            continue
        begins = {(m.topic, m.partition): m for m in found if m.kind == "begin"}
        ends = {(m.topic, m.partition): m for m in found if m.kind == "end"}
        total = max((m.batch_records for m in ends.values()), default=-1)
        if ends and sum(m.records for m in ends.values()) == total:
            for (topic, partition), end_marker in ends.items():
                where = f"{topic}/{partition}"
                if (topic, partition) not in begins:
                    raise WindowIntegrityError(
                        f"{label}: end marker at {where}@{end_marker.offset} but no begin marker after "
                        f"offset {start.get(topic, {}).get(partition, 'earliest')}: the read started inside the "
                        "batch (records deleted by retention, or offsets committed by something else). "
                        "Re-extract the window (reextract=True) to publish a whole new version."
                    )
                counted = data_counts.get((batch_header(window, version), topic, partition), 0)
                if counted != end_marker.records:
                    raise WindowIntegrityError(
                        f"{label}: {where} holds {counted} data records between its markers, the end marker "
                        f"announces {end_marker.records}. The topic was written by something else than the batch "
                        "producer; re-extract the window."
                    )
            if version > complete.get(window, 0):
                complete[window] = version
                plan.rows[window] = total
            continue
        plan.incomplete.append(label)
        for (topic, partition), begin in begins.items():
            parts = plan.carry.setdefault(topic, {})
            parts[partition] = min(parts.get(partition, begin.offset), begin.offset)
    for window, version in complete.items():
        plan.publish[window] = version
    plan.stale += [
        f"{w} v{v}"
        for (w, v) in sorted(versions)
        if w in complete and v < complete[w] and newer_version(v, published.get(w))
    ]
    return plan


def read_range(spark, kafka_options: dict[str, str], start: Offsets, end: Offsets, raw: bool = False):
    """Return the committed records of ``[start, end)`` with their batch/marker headers (a Kafka batch read).

    Columns: ``kafka_topic, kafka_partition, kafka_offset, record_key, record_value, eo_marker, eo_batch``;
    key and value must be UTF-8 text (:mod:`~exactly_once_provider.sinks.poison`).

    :param raw: ``on_bad_record="dead_letter"``: ``kafka_timestamp`` and the raw ``key``/``value`` bytes instead
        of ``record_key``/``record_value`` (:func:`~exactly_once_provider.sinks.dead_letters.flag` decides).
    """
    from exactly_once_provider.sinks.poison import KEY_TEXT, VALUE_TEXT
    from exactly_once_provider.spark_jobs.batch import read_kafka_range

    header = "CAST(try_element_at(filter(headers, h -> h.key = '{}'), 1).value AS STRING)"
    texts = (
        ("timestamp AS kafka_timestamp", "key", "value")
        if raw
        else (f"{KEY_TEXT} AS record_key", f"{VALUE_TEXT} AS record_value")
    )
    return read_kafka_range(spark, kafka_options, start, end).selectExpr(
        "topic AS kafka_topic",
        "partition AS kafka_partition",
        "offset AS kafka_offset",
        *texts,
        f"{header.format(MARKER_HEADER)} AS eo_marker",
        f"{header.format(BATCH_HEADER)} AS eo_batch",
    )


def scan(records) -> tuple[list[Marker], dict[tuple[str, str, int], int], list[tuple]]:
    """Return the markers, the data counts per (batch header, topic, partition) and a few unframed records.

    An unframed record (neither a marker nor a batch record) does not belong to any settlement batch.
    """
    from pyspark.sql import functions as F

    markers = [
        Marker.parse(r.kafka_topic, r.kafka_partition, r.kafka_offset, r.eo_marker, r.record_value)
        for r in records.filter(F.col("eo_marker").isNotNull()).collect()
    ]
    data = records.filter(F.col("eo_marker").isNull())
    counts = {
        (r.eo_batch, r.kafka_topic, r.kafka_partition): r["count"]
        for r in data.filter(F.col("eo_batch").isNotNull())
        .groupBy("eo_batch", "kafka_topic", "kafka_partition")
        .count()
        .collect()
    }
    unframed = [
        tuple(r)
        for r in data.filter(F.col("eo_batch").isNull())
        .select("kafka_topic", "kafka_partition", "kafka_offset")
        .limit(3)
        .collect()
    ]
    return markers, counts, unframed


WINDOW_OF_HEADER = r"^(.*)/v\d+$"  # the window id of an eo.batch header


def window_rows(records, publish: dict[str, int]):
    """Return the rows of the window versions in ``publish`` with the window-mode columns."""
    from pyspark.sql import functions as F

    headers = [batch_header(w, v) for w, v in publish.items()]
    version = F.regexp_extract("eo_batch", r"/v(\d+)$", 1).cast("bigint")
    window = F.regexp_extract("eo_batch", WINDOW_OF_HEADER, 1)
    return records.filter(F.col("eo_marker").isNull() & F.col("eo_batch").isin(headers)).select(
        window.alias("window_id"),
        version.alias("window_version"),
        "kafka_topic",
        "kafka_partition",
        "kafka_offset",
        "record_key",
        "record_value",
    )
