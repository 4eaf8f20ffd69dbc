"""What one micro-batch commits, and where it is read from: the checkpoint's write-ahead log.

A batch is identified by ``(pipeline, checkpoint id, batch id)``. The checkpoint id is the streaming query's
id from ``<checkpoint>/metadata``: stable across restarts of one checkpoint, new when the checkpoint is
deleted, so batch ids that restart at 0 under a new checkpoint never collide with committed ones.

The batch's Kafka end offsets come from ``<checkpoint>/offsets/<batch id>``, which Spark writes BEFORE the
batch runs, so they are exact even when the batch's last records are transaction markers (read_committed
skips them, and ``max(offset) + 1`` of the rows would lag behind).
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from exactly_once_provider import faults

# {topic: {partition (int): next offset to read}}
Offsets = dict[str, dict[int, int]]


@dataclass(frozen=True)
class BatchCommit:
    """The progress marker a sink commits atomically with a batch's rows.

    :param pipeline: the pipeline's stable name.
    :param checkpoint_id: the streaming query id of the checkpoint that produced the batch.
    :param batch_id: Spark's micro-batch id within that checkpoint.
    :param offsets: Kafka end offsets (exclusive) of the batch: where the next batch starts.
    :param rows_total: rows in the sink from this pipeline after the commit (this batch included).
    """

    pipeline: str
    checkpoint_id: str
    batch_id: int
    offsets: Offsets
    rows_total: int = 0
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "pipeline": self.pipeline, "checkpoint_id": self.checkpoint_id, "batch_id": self.batch_id,
            "offsets": offsets_to_json(self.offsets), "rows_total": self.rows_total, **self.extra,
        }

    @classmethod
    def from_json(cls, data: dict) -> BatchCommit:
        known = {"pipeline", "checkpoint_id", "batch_id", "offsets", "rows_total"}
        return cls(data["pipeline"], data["checkpoint_id"], int(data["batch_id"]),
                   offsets_from_json(data["offsets"]), int(data.get("rows_total", 0)),
                   {k: v for k, v in data.items() if k not in known})


class StaleBatchError(RuntimeError):
    """The sink moved on after the batch was planned: another driver commits the same pipeline."""


# ``expected`` of a sink's commit when the caller did not plan the batch on a read of the sink (tests, tools).
UNCHECKED = object()


def _identity(commit: BatchCommit | None) -> tuple | None:
    return None if commit is None else (commit.checkpoint_id, commit.batch_id, offsets_to_json(commit.offsets))


def _describe(commit: BatchCommit | None) -> str:
    if commit is None:
        return "nothing"
    return f"batch {commit.batch_id} of checkpoint {commit.checkpoint_id} (offsets {offsets_to_json(commit.offsets)})"


def require_predecessor(found: BatchCommit | None, expected: object, commit: BatchCommit, sink: str) -> None:
    """Raise :class:`StaleBatchError` unless the sink's newest commit is still the one the batch was planned on.

    The fence against a driver of an OLDER checkpoint (a zombie of an earlier run whose checkpoint was set
    aside): its batch ids and txn app id are its own, so only this compare-and-set of the predecessor tells
    that the offsets it is about to commit were committed meanwhile. Each sink calls it inside its atomic step.

    :param found: the sink's newest commit of the pipeline, read inside the atomic step.
    :param expected: the commit the batch was planned on (read before the batch's rows were filtered), or
        :data:`UNCHECKED`.
    :param commit: the batch about to be committed.
    :param sink: the sink's kind, for the message.
    """
    if expected is UNCHECKED or _identity(found) == _identity(expected):
        return
    raise StaleBatchError(
        f"Batch {commit.batch_id} of checkpoint {commit.checkpoint_id} (pipeline {commit.pipeline!r}) was planned on "
        f"{_describe(expected)}, but the {sink} sink now holds {_describe(found)}: another driver commits this "
        "pipeline (a zombie of an earlier run, or two jobs on one pipeline). Nothing of this batch was committed "
        "and the sink is exact as it is; stop the other driver.")


def offsets_to_json(offsets: Offsets) -> dict:
    return {topic: {str(p): int(o) for p, o in sorted(parts.items())} for topic, parts in sorted(offsets.items())}


def offsets_from_json(data: dict) -> Offsets:
    return {topic: {int(p): int(o) for p, o in parts.items()} for topic, parts in data.items()}


def _local(path: str) -> Path:
    return Path(path.removeprefix("file://"))


def checkpoint_id(checkpoint: str) -> str:
    """Return the streaming query id stored in ``<checkpoint>/metadata`` (written when the query starts)."""
    return json.loads((_local(checkpoint) / "metadata").read_text().splitlines()[0])["id"]


def _log_entries(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(int(f.name) for f in directory.iterdir() if f.name.isdigit())


def wal_offsets(checkpoint: str, batch_id: int) -> Offsets:
    """Return the end offsets Spark planned for ``batch_id`` (its offsets-log entry; one Kafka source).

    :param checkpoint: the query's checkpoint location (local path or ``file://``).
    :param batch_id: the micro-batch id.
    """
    entry = _local(checkpoint) / "offsets" / str(batch_id)
    lines = entry.read_text().splitlines()
    # line 0: log version, line 1: batch metadata, then one line per source.
    sources = [line for line in lines[2:] if line.strip()]
    if len(sources) != 1:
        raise ValueError(f"{entry}: expected exactly one Kafka source, found {len(sources)}.")
    return offsets_from_json(json.loads(sources[0]))


def checkpoint_positions(checkpoint: str) -> tuple[Offsets | None, Offsets | None]:
    """Return ``(end offsets of the last committed batch, end offsets of the last planned batch)``.

    Either is None when the checkpoint has no such batch (missing checkpoint: ``(None, None)``).
    """
    root = _local(checkpoint)
    planned = _log_entries(root / "offsets")
    committed = _log_entries(root / "commits")
    last_committed = wal_offsets(checkpoint, committed[-1]) if committed else None
    last_planned = wal_offsets(checkpoint, planned[-1]) if planned else None
    return last_committed, last_planned


def read_kafka_range(spark, bootstrap: str, start: Offsets, end: Offsets):
    """Return the committed records of ``[start, end)`` as a Kafka batch read (raw columns, with headers).

    Partitions missing from ``start`` start at the earliest offset; a partition whose start is past its end
    reads nothing.
    """
    assign = {t: sorted(parts) for t, parts in end.items()}
    starting = {t: {str(p): start.get(t, {}).get(p, -2) for p in parts} for t, parts in end.items()}
    ending = {t: {str(p): max(o, start.get(t, {}).get(p, 0)) for p, o in parts.items()} for t, parts in end.items()}
    return (spark.read.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("assign", json.dumps(assign))
            .option("startingOffsets", json.dumps(starting))
            .option("endingOffsets", json.dumps(ending))
            .option("kafka.isolation.level", "read_committed")
            .option("includeHeaders", "true")
            .option("failOnDataLoss", "true")
            .load())


FAULT_ENV = "EO_FAULT_KILL_AT"


def fault_point(step: str, batch_id: int) -> None:
    """Die like a SIGKILLed driver when ``EO_FAULT_KILL_AT=<step>:<batch id>`` names this point (tests only).

    The whole process group gets SIGKILL, i.e. the JVM driver and spark-submit too, with no cleanup. The
    point is also the generic fault point ``<step>_<batch id>`` (:mod:`exactly_once_provider.faults`), which
    can pause the driver there: a zombie for the tests.
    """
    wanted = os.environ.get(FAULT_ENV, "")
    if wanted and wanted == f"{step}:{batch_id}":
        os.killpg(os.getpgrp(), signal.SIGKILL)
    faults.fault_point(f"{step}_{batch_id}")
