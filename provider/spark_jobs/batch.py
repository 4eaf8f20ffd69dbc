"""What one micro-batch commits, and where it is read from: the checkpoint's write-ahead log.

A batch is identified by ``(pipeline, checkpoint id, batch id)``. The checkpoint id is the streaming query's
id from ``<checkpoint>/metadata``: stable across restarts of one checkpoint, new when the checkpoint is
deleted, so batch ids that restart at 0 under a new checkpoint never collide with committed ones.

The batch's Kafka end offsets come from ``<checkpoint>/offsets/<batch id>``, which Spark writes BEFORE the
batch runs, so they are exact even when the batch's last records are transaction markers (read_committed
skips them, and ``max(offset) + 1`` of the rows would lag behind).

The checkpoint is read through the storage layer: a local path or an ``s3://``/``s3a://`` URI (the driver's
registered S3 settings), where Spark keeps it through s3a.
"""

from __future__ import annotations

import json

from exactly_once_provider import faults
from exactly_once_provider.sinks.base import (
    Offsets,
    offsets_from_json,
)


def checkpoint_storage(checkpoint: str):
    """Return the storage rooted at a query's checkpoint location (local path, ``file://``, ``s3://``/``s3a://``)."""
    from exactly_once_provider.sinks.delta_log import table_storage

    return table_storage(checkpoint)  # S3: one client per location, not one per micro-batch


def _read(checkpoint: str, key: str) -> str:
    data = checkpoint_storage(checkpoint).read(key)
    if data is None:
        raise FileNotFoundError(f"{checkpoint_storage(checkpoint).uri(key)} does not exist.")
    return data.decode()


def checkpoint_id(checkpoint: str) -> str:
    """Return the streaming query id stored in ``<checkpoint>/metadata`` (written when the query starts)."""
    return json.loads(_read(checkpoint, "metadata").splitlines()[0])["id"]


def _log_entries(storage, folder: str) -> list[int]:
    names = (key[len(folder) + 1 :] for key in storage.list(folder + "/"))
    return sorted(int(name) for name in names if name.isdigit())


def wal_offsets(checkpoint: str, batch_id: int) -> Offsets:
    """Return the end offsets Spark planned for ``batch_id`` (its offsets-log entry; one Kafka source).

    :param checkpoint: the query's checkpoint location (local path, ``file://``, ``s3://``/``s3a://``).
    :param batch_id: the micro-batch id.
    """
    entry = f"offsets/{batch_id}"
    lines = _read(checkpoint, entry).splitlines()
    # line 0: log version, line 1: batch metadata, then one line per source.
    sources = [line for line in lines[2:] if line.strip()]
    if len(sources) != 1:
        raise ValueError(f"{checkpoint}/{entry}: expected exactly one Kafka source, found {len(sources)}.")
    return offsets_from_json(json.loads(sources[0]))


def checkpoint_positions(checkpoint: str) -> tuple[Offsets | None, Offsets | None]:
    """Return ``(end offsets of the last committed batch, end offsets of the last planned batch)``.

    Either is None when the checkpoint has no such batch (missing checkpoint: ``(None, None)``).
    """
    storage = checkpoint_storage(checkpoint)
    planned = _log_entries(storage, "offsets")
    committed = _log_entries(storage, "commits")
    last_committed = wal_offsets(checkpoint, committed[-1]) if committed else None
    last_planned = wal_offsets(checkpoint, planned[-1]) if planned else None
    return last_committed, last_planned


def read_kafka_range(spark, kafka_options: dict[str, str], start: Offsets, end: Offsets):
    """Return the committed records of ``[start, end)`` as a Kafka batch read (raw columns, with headers).

    ``kafka_options``: the connection's ``kafka.*`` options
    (:func:`~exactly_once_provider.kafka_config.spark_kafka_options`).

    Partitions missing from ``start`` start at the earliest offset; a partition whose start is past its end
    reads nothing.
    """
    assign = {t: sorted(parts) for t, parts in end.items()}
    starting = {t: {str(p): start.get(t, {}).get(p, -2) for p in parts} for t, parts in end.items()}
    ending = {t: {str(p): max(o, start.get(t, {}).get(p, 0)) for p, o in parts.items()} for t, parts in end.items()}
    return (
        spark.read.format("kafka")
        .options(**kafka_options)
        .option("assign", json.dumps(assign))
        .option("startingOffsets", json.dumps(starting))
        .option("endingOffsets", json.dumps(ending))
        .option("kafka.isolation.level", "read_committed")
        .option("includeHeaders", "true")
        .option("failOnDataLoss", "true")
        .load()
    )


def fault_point(step: str, batch_id: int) -> None:
    """The fault point ``<step>_<batch id>`` of a micro-batch (:mod:`exactly_once_provider.faults`, tests only).

    ``EO_FAULT_ACTION=kill-group`` kills the driver with its JVM and spark-submit; ``pause:<s>`` makes a zombie.
    """
    faults.fault_point(f"{step}_{batch_id}")
