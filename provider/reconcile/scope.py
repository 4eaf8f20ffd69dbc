"""The scope of an incremental reconciliation: the keys a CDC sink may have changed since the last clean one.

A clean reconciliation verified every key but its in-flight ones at the sink's Kafka offsets ``O``. Afterwards
the sink changes only through records at or after ``O``, so the keys to check next are the keys of the change
records from ``O`` to the sink's offsets now, plus the previous in-flight keys. Reading those records costs as
much as the changes, not the table. What this scope cannot see — a change the capture never wrote to Kafka, or a
sink row altered behind the pipeline's back — the full reconciliation on its own schedule finds.

The result row of a reconciliation keeps what the next one needs in its ``position``: ``sink_offsets`` (``O``)
and ``in_flight`` (the keys).
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from exactly_once_provider.kafka_config import consumer_config
from exactly_once_provider.reconcile.engine import Ranges
from exactly_once_provider.reconcile.keys import Key

log = logging.getLogger(__name__)

# Ranges are cheap: single keys become one IN list on every side (split_ranges). Closing gaps to reach a small
# count made 1,000 random changes of a 1M-row table cover ~110k rows (512 ranges; make bench-increment).
MAX_RANGES = 4096


def changed_keys(
    client_config: dict[str, Any],
    start: dict[str, dict[int, int]],
    end: dict[str, dict[int, int]],
    key: Key,
    timeout: float = 300,
) -> set[int] | None:
    """Return the keys of the change records between ``start`` and ``end`` (read_committed), as the integers the
    engine bisects (:meth:`Key.of_record_key`: the key itself, or a composite/text key's hash); None when a
    schema record (``ALTER TABLE``) is among them: the current table's apply may have rewritten every older row
    with the statement's fill (docs/schema-changes.md), which no key of a change record names, so the whole
    table is compared.

    :param client_config: confluent-kafka settings.
    :param start: per topic and partition, the offset to start at (a partition missing here: its beginning).
    :param end: per topic and partition, the exclusive end offset.
    :param key: the key; its columns are in the record key's JSON (``{"id": 42}``).
    :param timeout: seconds for each topic's read.
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer

    from exactly_once_provider.kafka.topic_reader import read_until

    keys: set[int] = set()
    consumer = Consumer(
        consumer_config(
            client_config, f"eo-reconcile-scope-{uuid.uuid4().hex}", settings={"enable.partition.eof": True}
        )
    )
    try:
        for topic, ends in end.items():
            starts = {p: start.get(topic, {}).get(p, OFFSET_BEGINNING) for p in ends}
            for message in read_until(consumer, topic, starts, ends, timeout):
                if message.key() is None:  # a schema record (ALTER TABLE, capture.change_record.schema_record)
                    return None
                try:
                    keys.add(key.of_record_key(json.loads(message.key())))
                except (TypeError, ValueError, KeyError) as err:
                    raise ValueError(
                        f"Record at {topic}/{message.partition()}@{message.offset()} has no key {key.names} in its "
                        f"JSON key ({err!r}): the incremental reconciliation reads the binlog capture's change "
                        "records; use scope='full' for other topics."
                    ) from None
    finally:
        consumer.close()
    return keys


def key_ranges(keys: set[int] | list[int], max_ranges: int = MAX_RANGES) -> Ranges:
    """Return half-open ranges covering ``keys``: runs of consecutive keys joined, then the smallest gaps closed
    until at most ``max_ranges`` remain (a wider range reads a few more rows; fewer ranges keep the queries short).

    :param keys: the keys.
    :param max_ranges: the most ranges returned.
    """
    ordered = sorted(set(keys))
    if not ordered:
        return []
    ranges: list[list[int]] = [[ordered[0], ordered[0] + 1]]
    for key in ordered[1:]:
        if key == ranges[-1][1]:
            ranges[-1][1] = key + 1
        else:
            ranges.append([key, key + 1])
    if len(ranges) > max_ranges:
        gaps = sorted(range(len(ranges) - 1), key=lambda i: ranges[i + 1][0] - ranges[i][1])
        close = set(gaps[: len(ranges) - max_ranges])
        merged = [ranges[0]]
        for i in range(1, len(ranges)):
            if i - 1 in close:
                merged[-1][1] = ranges[i][1]
            else:
                merged.append(ranges[i])
        ranges = merged
    return [(lo, hi) for lo, hi in ranges]


def changed_scope(
    store: Any, name: str, kafka: dict[str, Any], sink_offsets: dict[str, dict[int, int]], key: Key
) -> Ranges | None:
    """Return the key ranges a ``changed`` reconciliation compares, or None to compare the whole table.

    The keys are those of the change records the sink applied since the last clean result of ``name`` (its stored
    sink offsets), plus the keys that were in flight then. The whole table when there is no clean result to start
    from, or when an ``ALTER TABLE`` was applied since (its fill may rewrite every older row).

    :param store: a psycopg2 connection to the results' database.
    :param name: the reconciliation.
    :param kafka: the ``kafka`` connection's client settings.
    :param sink_offsets: the Kafka offsets the sink has applied now.
    :param key: the table's key.
    """
    from exactly_once_provider.reconcile.results import latest_clean
    from exactly_once_provider.sinks.base import offsets_from_json

    last = latest_clean(store, name)
    since = (last or {}).get("position") or {}
    if "sink_offsets" not in since:
        log.info("scope=changed: no clean reconciliation of %s to start from: comparing the whole table", name)
        return None
    keys = changed_keys(kafka, offsets_from_json(since["sink_offsets"]), sink_offsets, key)
    if keys is None:
        log.info(
            "scope=changed: an ALTER TABLE was applied since the clean reconciliation %s (its fill "
            "may rewrite every older row): comparing the whole table",
            last["id"],
        )
        return None
    keys |= set(since.get("in_flight", ()))
    ranges = key_ranges(keys)
    log.info(
        "scope=changed: %d keys changed since the clean reconciliation %s (sink offsets %s): %d key ranges",
        len(keys),
        last["id"],
        since["sink_offsets"],
        len(ranges),
    )
    return ranges
