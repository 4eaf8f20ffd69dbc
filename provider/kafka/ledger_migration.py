"""Move an offsets ledger into a new, partitioned topic without losing or repeating a resume point.

A ledger's partition count never changes in place (a key would move partition and its reader would miss its
last record), so a single-partition ledger made before partitioning keeps working as it is. To get the
partitioned read, :func:`migrate_ledger` copies it, in ONE Kafka transaction:

* the latest committed record of every key, byte for byte, into the new topic (its pipeline's partition);
* a *moved* record ``{"schema_version": 1, "moved_to": "<new topic>"}`` for every key into the old topic, so a
  writer still pointed at the old topic refuses to start (:class:`~exactly_once_provider.kafka.offsets.LedgerMovedError`)
  instead of resuming from a copy that no longer moves.

Both land together or not at all: a crash before the commit leaves the old ledger as it was (the next run's
``init_transactions`` of the same transactional id aborts the leftovers); a crash after it leaves a finished
migration, and running it again only verifies it. Writers must be stopped first (pause the DAGs): the
migration refuses a ledger that changed in the last ``quiet_s`` seconds or during the copy.

Command line: ``python -m exactly_once_provider.kafka.ledger_migration --bootstrap-servers HOST:PORT OLD NEW``
(a local broker without credentials; with credentials call :func:`migrate_ledger` with the connection's
client configuration). It runs without Airflow: a refused migration raises
:class:`~exactly_once_provider.errors.PipelineError` (a writer running, a partly migrated ledger) or
``ValueError`` (topics named wrong).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from typing import Any

from confluent_kafka import Consumer, Producer

from exactly_once_provider.errors import PipelineError
from exactly_once_provider.faults import fault_point
from exactly_once_provider.kafka.offsets import (
    OFFSETS_SCHEMA_VERSION,
    ensure_offsets_topic,
    latest_raw_values,
    ledger_partition,
    moved_to,
    topic_end_offsets,
)
from exactly_once_provider.kafka.topic_reader import read_until
from exactly_once_provider.kafka.writer import MODE_SETTINGS
from exactly_once_provider.kafka_config import consumer_config, producer_config

log = logging.getLogger(__name__)


def migrate_ledger(
    client_config: dict[str, Any], source: str, target: str, quiet_s: float = 60, timeout: float = 120
) -> int:
    """
    Copy every key's latest committed record of ledger ``source`` into the new ledger ``target``; return how
    many keys the target holds. Idempotent: a finished migration is verified, not repeated.

    :param client_config: confluent-kafka configuration (at least ``bootstrap.servers``).
    :param source: the existing offsets topic.
    :param target: the new offsets topic (created with the current partition count if missing; must hold no
        committed record unless it is the result of this same migration).
    :param quiet_s: refuse if ``source`` received a record in the last ``quiet_s`` seconds (writers running).
    :param timeout: seconds for each read and for the transaction.
    """
    if source == target:
        raise ValueError(f"Migrating ledger {source!r} onto itself: name a new topic.")
    partitions = ensure_offsets_topic(client_config, target, timeout=timeout)
    producer = Producer(
        producer_config(
            client_config,
            {
                **MODE_SETTINGS["exactly_once"],
                "transactional.id": f"eo-ledger-migration/{source}",
                "transaction.timeout.ms": int(timeout * 1000),
            },
        )
    )
    # First: aborts what a killed earlier attempt left open, which the reads below would otherwise wait for.
    producer.init_transactions(timeout)
    ends = topic_end_offsets(client_config, source)
    latest = latest_raw_values(client_config, source, timeout, None)
    copied = latest_raw_values(client_config, target, timeout, None)
    moved = {key for key, value in latest.items() if moved_to(value) is not None}
    if moved:
        return _verify_finished(source, target, latest, copied, moved)
    if copied:
        raise ValueError(f"Ledger {target!r} already holds {len(copied)} committed key(s); migrate into a new topic.")
    _refuse_recent_writes(client_config, source, ends, quiet_s, timeout)
    producer.begin_transaction()
    marker = json.dumps(
        {"schema_version": OFFSETS_SCHEMA_VERSION, "moved_to": target}, sort_keys=True, separators=(",", ":")
    ).encode()
    for key, value in latest.items():
        pipeline = key.split(b"/", 1)[0].decode()
        producer.produce(target, value, key, partition=ledger_partition(pipeline, partitions))
    producer.flush(timeout)
    fault_point("migration_copied")
    if topic_end_offsets(client_config, source) != ends:
        producer.abort_transaction(timeout)
        raise PipelineError(
            f"Ledger {source!r} changed during the migration: a writer is running. Nothing "
            "was migrated; stop the pipelines' DAGs and run it again."
        )
    for key in latest:
        pipeline = key.split(b"/", 1)[0].decode()
        producer.produce(source, marker, key, partition=ledger_partition(pipeline, len(ends)))
    producer.flush(timeout)
    fault_point("migration_before_commit")
    producer.commit_transaction(timeout)
    fault_point("migration_committed")
    log.info(
        "Migrated %d key(s) of ledger %s into %s (%d partitions); point offsets_topic at %s",
        len(latest),
        source,
        target,
        partitions,
        target,
    )
    return len(latest)


def _verify_finished(
    source: str, target: str, latest: dict[bytes, bytes], copied: dict[bytes, bytes], moved: set[bytes]
) -> int:
    """Check a migration that already committed: every key moved to ``target`` and present there."""
    elsewhere = {moved_to(latest[k]) for k in moved} - {target}
    if elsewhere or len(moved) != len(latest) or not moved <= set(copied):
        raise PipelineError(
            f"Ledger {source!r} is partly migrated (moved to {sorted(elsewhere | {target})}, "
            f"{len(latest) - len(moved)} key(s) written after the move, {len(moved - set(copied))} missing in "
            f"{target!r}): a writer kept using the old ledger. Compare both ledgers before resuming."
        )
    log.info("Ledger %s was already migrated into %s (%d keys)", source, target, len(copied))
    return len(copied)


def _refuse_recent_writes(
    config: dict[str, Any], topic: str, ends: dict[int, int], quiet_s: float, timeout: float
) -> None:
    """Raise if the last record of a partition of ``topic`` is younger than ``quiet_s`` seconds."""
    consumer = Consumer(
        consumer_config(
            config,
            f"eo-ledger-migration-{time.time_ns()}",
            settings={"enable.partition.eof": True, "auto.offset.reset": "earliest"},
        )
    )
    try:
        # read_committed: an aborted attempt of this migration is no writer; an open transaction is waited for
        # and then counts. The last offsets may be transaction markers, which no consumer receives: read the
        # last 100.
        starts = {partition: max(0, end - 100) for partition, end in ends.items()}
        newest = 0
        for message in read_until(consumer, topic, starts, ends, timeout):
            newest = max(newest, message.timestamp()[1])
        age = time.time() - newest / 1000
        if newest and age < quiet_s:
            raise PipelineError(
                f"Ledger {topic!r} received a record {age:.0f}s ago: a writer is running. Pause the "
                f"pipelines' DAGs, wait {quiet_s:.0f}s and migrate again."
            )
    finally:
        consumer.close()


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: migrate one ledger into a new topic on a broker without credentials."""
    parser = argparse.ArgumentParser(description="Copy an offsets ledger into a new partitioned topic.")
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--quiet-seconds", type=float, default=60)
    parser.add_argument("source")
    parser.add_argument("target")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    migrate_ledger({"bootstrap.servers": args.bootstrap_servers}, args.source, args.target, args.quiet_seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
