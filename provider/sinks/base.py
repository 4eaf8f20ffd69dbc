"""What every sink commits with a batch, and the one check that refuses a stale commit.

A sink commits its rows and a :class:`BatchCommit` in ONE atomic step (its own transaction, manifest or Delta
commit). Before that step it calls :func:`require_predecessor`: a batch planned on another newest commit
than the sink holds at commit time is refused with :class:`StaleBatchError` (a zombie driver, a lost race).
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


# The columns of a settlement window row (window mode); every sink stores them as they are.
WINDOW_COLUMNS = ("window_id", "window_version", "kafka_topic", "kafka_partition", "kafka_offset", "record_key",
                  "record_value")
