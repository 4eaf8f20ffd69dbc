"""The sink contract: the :class:`Sink` protocol, :func:`open_sink`, and the rules every sink commits by.

A sink commits its rows and a :class:`BatchCommit` in ONE atomic step (its own transaction, manifest or Delta
commit). Inside that step it applies the three rules of this module, each written once here:

* :func:`replayed`: a batch the sink already holds is skipped (a replay after a crash);
* :func:`require_predecessor`: a batch planned on another newest commit than the sink holds at commit time is
  refused with :class:`StaleBatchError` (a zombie driver, a lost race);
* :func:`require_newer_windows`: in window mode a window version replaces the sink's only if it is newer.

A :class:`Sink` has a READER side (what is committed; plain Python, no Spark: the operator, the lag trigger,
the status page and reconciliation read through it) and a WRITER side (the Spark job's batch commit; pyspark is
imported inside those methods only). :func:`open_sink` is the one place that maps a sink kind to its class.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

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
            "pipeline": self.pipeline,
            "checkpoint_id": self.checkpoint_id,
            "batch_id": self.batch_id,
            "offsets": offsets_to_json(self.offsets),
            "rows_total": self.rows_total,
            **self.extra,
        }

    @classmethod
    def from_json(cls, data: dict) -> BatchCommit:
        known = {"pipeline", "checkpoint_id", "batch_id", "offsets", "rows_total"}
        return cls(
            data["pipeline"],
            data["checkpoint_id"],
            int(data["batch_id"]),
            offsets_from_json(data["offsets"]),
            int(data.get("rows_total", 0)),
            {k: v for k, v in data.items() if k not in known},
        )


@dataclass(frozen=True)
class SchemaChange:
    """The columns a current-mode batch commits in, passed with the batch to :meth:`Sink.commit`.

    Decided per batch by :class:`~exactly_once_provider.spark_jobs.current_changes.CurrentChanges` from the state
    the sink's last commit recorded and the schema records the batch follows.

    :param state: the schema state the commit records (``load_id``, ``columns``, ``fills``, ``applied``): the
        next batch starts from it.
    :param changed: the batch follows a schema change: its commit evolves the table's columns with its rows.
    :param new_fills: the :class:`~exactly_once_provider.spark_jobs.schema_change.Fill` of the statements this batch
        follows first: the rows written before them take these values (a sink that does not fill in place gets
        them with the batch, at their own version, and replaces a row by a change of an equal version).
    """

    state: dict
    changed: bool = False
    new_fills: tuple = ()


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
        "and the sink is exact as it is; stop the other driver."
    )


def replayed(found: BatchCommit | None, commit: BatchCommit) -> bool:
    """Return whether the sink's newest commit ``found`` already holds ``commit``: a replayed batch, to skip.

    Spark replays the last planned batch after a crash between the sink commit and its checkpoint commit;
    batch ids are per checkpoint, so the batch is held when the sink's newest commit is of the same checkpoint
    and at or after it. THE authoritative check is the one each sink makes inside its atomic step (under the
    PostgreSQL advisory lock; on the manifest the files sink publishes on top of with put-if-absent), because
    only there no other driver can commit in between; the Delta sink makes the same decision through Delta's
    txn rule (app id ``<pipeline>:<checkpoint id>``, version = batch id, a version at or below the app's newest
    is committed). The driver asks the same question earlier only to skip the batch's work and log the replay.

    :param found: the sink's newest commit of the pipeline (None before the first).
    :param commit: the batch about to be committed.
    """
    return found is not None and found.checkpoint_id == commit.checkpoint_id and found.batch_id >= commit.batch_id


def newer_version(version: int, held: int | None) -> bool:
    """Return whether window ``version`` wins over the version the sink holds (``None``: none held)."""
    return version > (held or 0)


def require_newer_windows(windows: dict[str, int], held: dict[str, int], holder: str = "the table's") -> None:
    """Raise ValueError unless every window version in ``windows`` is newer than the one the sink holds.

    "Newer window version wins": the settlement plan (:func:`~exactly_once_provider.spark_jobs.settlement.plan_windows`)
    skips versions at or below what the sink held when the batch was planned; THIS check, made by each sink
    inside its atomic step on what it holds at commit time, is the authoritative one: a version published by
    another writer in between fails the batch (nothing committed) instead of being replaced by an older one.

    :param windows: window id -> version about to be published.
    :param held: window id -> version the sink holds.
    :param holder: who holds ``held``, for the message.
    """
    for window, version in sorted(windows.items()):
        if not newer_version(version, held.get(window)):
            raise ValueError(
                f"window {window} v{version} is not newer than {holder} v{held.get(window, 0)}: "
                "another writer publishes this pipeline; run one job per pipeline."
            )


def offsets_to_json(offsets: Offsets) -> dict:
    return {topic: {str(p): int(o) for p, o in sorted(parts.items())} for topic, parts in sorted(offsets.items())}


def offsets_from_json(data: dict) -> Offsets:
    return {topic: {int(p): int(o) for p, o in parts.items()} for topic, parts in data.items()}


# The columns of a settlement window row (window mode); every sink stores them as they are.
WINDOW_COLUMNS = (
    "window_id",
    "window_version",
    "kafka_topic",
    "kafka_partition",
    "kafka_offset",
    "record_key",
    "record_value",
)


SINK_KINDS = ("delta", "postgres", "files", "iceberg")


@runtime_checkable
class Sink(Protocol):
    """A pipeline's sink: rows and progress committed together, read back without Spark.

    Reader side (no Spark, no pyspark import; cheap enough for the status page and the triggerer):
    :meth:`committed`, :meth:`published_windows`, :meth:`commit_location`.
    Writer side (the Spark job; DataFrames in, pyspark imported inside): :meth:`prepare`, :meth:`commit`,
    :meth:`commit_windows`, :meth:`append`.
    """

    kind: str
    pipeline: str

    # -- reader side
    def committed(self) -> BatchCommit | None:
        """Return the pipeline's newest commit (window mode: with ``extra["windows"]``); None before the first."""

    def published_windows(self) -> dict[str, int]:
        """Return window id -> version the sink holds (window mode)."""

    def commit_location(self) -> str:
        """Return where the commits are, for people (``Delta version 7``, ``manifest 3, 2 files``, the table)."""

    # -- writer side
    def prepare(self) -> None:
        """Make the sink ready for the job's first batch (create tables, remove a crash's unpublished files)."""

    def commit(
        self, df: Any, commit: BatchCommit, expected: object = UNCHECKED, schema: SchemaChange | None = None
    ) -> bool:
        """Commit ``df`` and ``commit`` in one atomic step; return False if the batch was already committed.

        ``schema``: current mode (Delta, PostgreSQL, Iceberg), the batch's columns (:class:`SchemaChange`),
        committed with it; the files sink has no current mode and refuses one. The PostgreSQL, Delta and files
        sinks also take ``letters``, the batch's dead letters, committed with it
        (:mod:`~exactly_once_provider.sinks.dead_letters`).
        """

    def commit_windows(
        self, df: Any, windows: dict[str, int], rows: dict[str, int], commit: BatchCommit, expected: object = UNCHECKED
    ) -> bool:
        """Replace the rows of ``windows`` by ``df`` and commit versions and offsets in one atomic step."""

    def append(self, df: Any) -> None:
        """Append ``df`` without progress (the at-least-once baseline)."""


def open_sink(
    kind: str,
    location: str,
    pipeline: str,
    *,
    postgres_connect: dict | Callable[[], dict] | None = None,
    postgres_conn_id: str | None = None,
    mode: str = "append",
    commit_with: str = "own",
    key: tuple[str, ...] = (),
    s3: Any = None,
    topics: Sequence[str] = (),
    dead_letter_store: str | None = None,
    iceberg_catalog: dict | Callable[[], dict] | None = None,
    iceberg_location: str | None = None,
) -> Sink:
    """Return the sink of ``kind`` at ``location`` for ``pipeline``: THE dispatch on the sink kind.

    Opening reads nothing and needs no Spark; only the writer methods use Spark.

    :param kind: ``delta``, ``postgres``, ``files`` or ``iceberg``.
    :param location: the Delta table / files directory (local path or ``file://``; files also ``s3://``), or
        the PostgreSQL table (``schema.table`` allowed; empty: only the offsets table is read), or the Iceberg
        table (``namespace.table`` in its catalog).
    :param pipeline: the pipeline's stable name.
    :param postgres_connect: ``postgres``: psycopg2 connection arguments, or a function returning them (called
        only for this kind); None = the libpq ``PG*`` environment (the Spark job).
    :param postgres_conn_id: ``postgres``: the Airflow connection's id, named in :meth:`Sink.commit_location`.
    :param mode: ``append``, ``cdc``, ``current`` or ``window`` (the writer side's mode).
    :param commit_with: Delta append mode: ``own`` or ``delta`` (see :class:`~.delta.DeltaSink`).
    :param key: ``current`` mode (Delta, Iceberg): the source table's primary key columns.
    :param s3: ``files``/``delta`` on ``s3://``: the :class:`~exactly_once_provider.storage.s3.S3Settings` (default: those
        the process registered).
    :param topics: ``postgres``: the topics the writer reads (its state is theirs; see
        :class:`~.postgres.PostgresSink`); empty for a reader.
    :param dead_letter_store: ``postgres``/``delta`` append mode with ``on_bad_record="dead_letter"``: the
        dead-letter table / Delta location its commits write the batch's letters to
        (:mod:`~exactly_once_provider.sinks.dead_letters`).
    :param iceberg_catalog: ``iceberg``: the catalog's settings (:func:`~.iceberg.catalog_settings`) or a function
        returning them (called only when the catalog is first used); None = the SQL catalog ``eo`` in the database
        of ``postgres_connect`` (a reader: the lag sensor, Asset events), else the one the process registered.
    :param iceberg_location: ``iceberg`` writer: the table's location (local path or ``s3://``), where it is created
        and Spark writes its data files; a reader needs only the catalog.
    """
    if kind == "iceberg":
        from functools import partial

        from exactly_once_provider.sinks.iceberg import IcebergSink, sql_catalog

        catalog = iceberg_catalog
        if catalog is None and postgres_connect:  # resolved when the catalog is first used, as for postgres
            catalog = partial(sql_catalog, postgres_connect)
        return IcebergSink(location, pipeline, catalog, iceberg_location, s3, mode, key)
    if kind == "delta":
        from exactly_once_provider.sinks.delta import DeltaSink

        return DeltaSink(
            location, pipeline, mode, commit_with=commit_with, key=key, s3=s3, dead_letter_store=dead_letter_store
        )
    if kind == "files":
        from exactly_once_provider.sinks.files import FilesSink
        from exactly_once_provider.storage import open_storage

        return FilesSink(location, pipeline, open_storage(location, s3))
    if kind == "postgres":
        from exactly_once_provider.sinks.postgres import OFFSETS_TABLE, PostgresSink

        connect = postgres_connect() if callable(postgres_connect) else postgres_connect
        return PostgresSink(
            location or OFFSETS_TABLE,
            pipeline,
            connect,
            mode=mode,
            conn_id=postgres_conn_id,
            topics=topics,
            dead_letter_store=dead_letter_store,
        )
    raise ValueError(f"sink must be one of {', '.join(SINK_KINDS)}, got {kind!r}.")
