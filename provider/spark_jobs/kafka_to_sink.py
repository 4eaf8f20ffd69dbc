"""Streaming job: Kafka (read_committed) -> Delta table | PostgreSQL table | Parquet files | Iceberg table, exactly once.

Submitted as a file: ``spark-submit .../kafka_to_sink.py --spec <job spec>`` (the operator; the request is a
:class:`~exactly_once_provider.spark_jobs.stream_spec.StreamSpec`) or ``... --pipeline ...`` (see ``--help``).

Where the guarantees live:

* progress is committed by the SINK, in the same atomic step as the rows (:meth:`commit` of
  ``sink_delta``/``sink_postgres``/``sink_files``), as a :class:`~.batch.BatchCommit`;
* a replayed batch (same checkpoint id and batch id, e.g. after a crash between the sink commit and the
  checkpoint commit) is recognised by the sink and skipped: :func:`process_batch`;
* rows below the sink's committed offsets are dropped before writing, so a checkpoint that lags the sink can
  never write a row twice: :func:`process_batch`;
* at start, a checkpoint that does not match the sink (missing, behind or ahead) is set aside and the query
  starts from the sink's offsets: :func:`reconcile_start`;
* ``on_bad_record="dead_letter"``: a batch's records the sink cannot store are committed to the dead-letter
  store in the same exactly-once step as its good ones, up to a limit: :func:`process_batch` and
  :mod:`~exactly_once_provider.sinks.dead_letters`;
* window mode (settlement batches replace their window whole, newer versions win, incomplete batches wait):
  :func:`process_window_batch` and :mod:`~exactly_once_provider.spark_jobs.settlement`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from exactly_once_provider.connections import read_secret_file
from exactly_once_provider.kafka_config import admin_config, spark_kafka_options
from exactly_once_provider.sinks import dead_letters, poison
from exactly_once_provider.sinks.base import BatchCommit, Offsets, Sink, open_sink, replayed
from exactly_once_provider.sinks.iceberg_current import current_location
from exactly_once_provider.spark_jobs.batch import (
    checkpoint_id,
    checkpoint_positions,
    checkpoint_storage,
    fault_point,
    read_kafka_range,
    wal_offsets,
)
from exactly_once_provider.spark_jobs.current_changes import DDL_PREFIX, CurrentChanges, schema_change_ahead
from exactly_once_provider.spark_jobs.driver import exit_with_the_jvm, run_job
from exactly_once_provider.spark_jobs.session import limit_snapshot_partitions, register_storage, with_storage_conf
from exactly_once_provider.spark_jobs.spec import JobSpec, report_started
from exactly_once_provider.spark_jobs.stream_spec import Route, StreamSpec, split_topics

log = logging.getLogger("exactly_once_provider.kafka_to_sink")
JOB = "kafka_to_sink"
SELECT = (
    "topic AS kafka_topic",
    "partition AS kafka_partition",
    "offset AS kafka_offset",
    f"{poison.KEY_TEXT} AS record_key",
    f"{poison.VALUE_TEXT} AS record_value",
)


def parse_args(argv: list[str]) -> StreamSpec:
    parser = argparse.ArgumentParser(prog="kafka_to_sink", description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", required=True, help="stable pipeline name (part of every sink commit)")
    parser.add_argument(
        "--secrets-file",
        required=True,
        help='0600 JSON file: {"kafka": the kafka connection\'s confluent-kafka settings, "libpq": '
        "PG* variables of the postgres sink} (secrets never travel on the command line)",
    )
    parser.add_argument("--topics", default="", help="comma-separated topic names")
    parser.add_argument("--checkpoint", default="", help="this pipeline's checkpoint directory")
    parser.add_argument(
        "--routes",
        default=None,
        help="several queries in one application, instead of --topics/--checkpoint/--path/--table: "
        'JSON [{"topics": [...], "checkpoint": ..., "path": ... | "table": ...}, ...]',
    )
    parser.add_argument("--sink", required=True, choices=("delta", "postgres", "files", "iceberg"))
    parser.add_argument("--path", help="Delta table or files sink directory; iceberg: the table's location")
    parser.add_argument(
        "--table",
        help="PostgreSQL table (connection: the secrets file's libpq PG* variables); iceberg: namespace.table "
        "in the catalog of the secrets file's 'iceberg' settings",
    )
    parser.add_argument("--trigger", default="available-now", choices=("available-now", "processing-time"))
    parser.add_argument("--interval", default="10 seconds", help="processing-time trigger interval")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=None)
    parser.add_argument(
        "--max-runtime", type=float, default=None, help="processing-time: seconds after which the stream stops cleanly"
    )
    parser.add_argument(
        "--mode",
        default="append",
        choices=("append", "cdc", "current", "window"),
        help="append records, apply CDC changes by primary key into a changes table (cdc) or "
        "into the full load's table (current) (newer source version wins), or replace "
        "settlement windows whole (newer batch version wins)",
    )
    parser.add_argument(
        "--key-field",
        default="pk",
        help="CDC: JSON field of the record value holding the key, or several, comma-separated "
        "(e.g. source.schema,source.table,pk)",
    )
    parser.add_argument("--version-field", default="version", help="CDC: JSON field holding the source version")
    parser.add_argument("--op-field", default="op", help="CDC: JSON field holding the operation ('d' = delete)")
    parser.add_argument(
        "--delta-commit",
        default="own",
        choices=("own", "delta"),
        help="Delta append mode: the provider writes each batch's Delta commit itself (own) or "
        "Delta's writer does (delta: rebuilds the table state per commit, slower)",
    )
    parser.add_argument(
        "--delivery",
        default="exactly-once",
        choices=("exactly-once", "at-least-once"),
        help="at-least-once = plain append, no sink-side progress (benchmark baseline only)",
    )
    parser.add_argument(
        "--on-bad-record",
        default="fail",
        choices=dead_letters.POLICIES,
        help="a record the sink cannot store: stop the job before its batch commits (fail), or commit it to "
        "the dead-letter store with its batch (dead_letter; append, cdc and current modes)",
    )
    parser.add_argument("--max-dead-letters", type=int, default=None, help="dead_letter: bad records allowed per batch")
    parser.add_argument(
        "--max-dead-letter-ratio", type=float, default=None, help="dead_letter: share of a batch allowed to be bad"
    )
    parser.add_argument(
        "--dead-letter-store",
        default=None,
        help="dead_letter: the PostgreSQL table / Delta location (default <table>_dead_letters / <path>_dead_letters)",
    )
    args = parser.parse_args(argv)
    try:  # the same rules the operator checks: one StreamSpec, one validation
        return StreamSpec(
            pipeline=args.pipeline,
            topics=split_topics(args.topics),
            checkpoint=args.checkpoint,
            sink=args.sink,
            path=args.path,
            table=args.table,
            trigger=args.trigger,
            interval=args.interval,
            max_offsets_per_trigger=args.max_offsets_per_trigger,
            max_runtime=args.max_runtime,
            mode=args.mode,
            key_field=args.key_field,
            version_field=args.version_field,
            op_field=args.op_field,
            delta_commit=args.delta_commit,
            delivery=args.delivery,
            secrets_file=args.secrets_file,
            on_bad_record=args.on_bad_record,
            max_dead_letters=args.max_dead_letters,
            max_dead_letter_ratio=args.max_dead_letter_ratio,
            dead_letter_store=args.dead_letter_store,
            routes=tuple(Route.from_json(r) for r in json.loads(args.routes)) if args.routes else (),
        ).validate()
    except ValueError as err:
        parser.error(str(err))


def make_sink(args: StreamSpec, source: Any = None) -> Sink:
    """Open the job's sink (PostgreSQL from the libpq ``PG*`` environment) and prepare it for the first batch.

    :param source: ``current`` mode: the handoff of the full load the current table builds on.
    """
    policy = args.dead_letter_policy()
    sink = open_sink(
        args.sink,
        args.table if args.sink in ("postgres", "iceberg") else args.path,
        args.pipeline,
        mode=args.mode,
        commit_with=args.delta_commit,
        key=source.key if source else (),
        topics=args.topics,
        dead_letter_store=policy.store if policy else None,
        # current mode: the path is the Delta full load the Iceberg table is built from, beside it
        iceberg_location=current_location(args.path) if source is not None else args.path,
    )
    if source is not None and args.sink in ("postgres", "iceberg"):  # built from the Delta full load: delta-rs reads it
        from exactly_once_provider.sinks.delta_log import table_storage

        storage = table_storage(args.path.removeprefix("file://"))
        settings = getattr(storage, "settings", None)
        sink.builds_on(source, storage.uri(), settings.delta_rs_options() if settings is not None else None)
    sink.prepare()
    return sink


def topic_partitions(kafka_config: dict, topics: list[str], wait: float = 0) -> dict[str, list[int]]:
    """Return every partition of ``topics`` (startingOffsets JSON must name all of them).

    :param wait: seconds to wait for missing topics (a long-running stream started beside the capture that
        creates them); then a missing topic is an error.
    """
    from confluent_kafka.admin import AdminClient

    from exactly_once_provider.kafka.topics import partitions_of

    bootstrap = kafka_config["bootstrap.servers"]
    admin = AdminClient(admin_config(kafka_config))
    deadline = time.monotonic() + wait
    while True:
        found = partitions_of(admin, topics)
        missing = [t for t in topics if found[t] is None]
        if not missing:
            return {t: found[t] for t in topics}
        if time.monotonic() >= deadline:
            raise ValueError(f"Kafka topic {missing[0]!r} does not exist on {bootstrap}.")
        log.info("waiting for topics %s to be created (%.0fs left)", missing, deadline - time.monotonic())
        time.sleep(2)


def reconcile_start(checkpoint: str, sink_offsets: Offsets | None, partitions: dict[str, list[int]]) -> str:
    """Return ``startingOffsets`` for the query; set aside a checkpoint that disagrees with the sink.

    The checkpoint is kept when the sink holds exactly the end of its last committed batch (normal restart)
    or of its last planned batch (crash after the sink commit, before the checkpoint commit: Spark replays
    that batch and the sink skips it). Anything else means the checkpoint is missing, behind or ahead of the
    sink, and the sink wins. ``startingOffsets`` only applies to a query without a checkpoint.
    A checkpoint whose offsets name a topic the query does not read was planned for another mapping (e.g. a
    corrected ``streams`` with the same checkpoint directories) and is set aside even when the sink has no
    commit yet.

    The checkpoint may be on S3 (``s3://``/``s3a://``): it is read through the storage layer and set aside by
    copying its objects to the ``.stale-<time>`` sibling, then deleting them (no rename on object stores; a
    crash in between leaves a partial copy beside a checkpoint that is set aside again next time).
    """
    storage = checkpoint_storage(checkpoint)
    if storage.list():
        committed, planned = checkpoint_positions(checkpoint)
        foreign = sorted({t for offsets in (committed, planned) if offsets for t in offsets} - set(partitions))
        if foreign:
            log.warning("checkpoint %s holds offsets of topics this query does not read: %s", checkpoint, foreign)
        elif sink_offsets in (committed, planned) and not (sink_offsets is None and committed is not None):
            log.info("checkpoint %s agrees with the sink (%s): resuming from it", checkpoint, sink_offsets)
            return "earliest"
        aside = f"{checkpoint.rstrip('/')}.stale-{int(time.time())}"
        log.warning(
            "checkpoint %s (committed %s, planned %s) disagrees with the sink (%s): moved to %s; "
            "starting from the sink's offsets",
            checkpoint,
            committed,
            planned,
            sink_offsets,
            aside,
        )
        _set_aside(checkpoint, aside)
    if sink_offsets is None:
        return "earliest"
    start = {t: {str(p): sink_offsets.get(t, {}).get(p, -2) for p in parts} for t, parts in partitions.items()}
    log.info("starting from the sink's committed offsets %s", start)
    return json.dumps(start)


def reconcile_shared_start(
    checkpoint: str, sinks: list[tuple[tuple[str, ...], Offsets | None]], partitions: dict[str, list[int]]
) -> str:
    """Return ``startingOffsets`` for a query shared by several sinks; set aside a checkpoint any sink disagrees with.

    :func:`reconcile_start`'s rule, per sink over its own topics: its offsets must be the checkpoint's last
    committed or last planned batch's end on those topics. A sink untouched by the last batches holds an older
    batch's end, equal on its topics; a sink that never committed holds offset 0 everywhere. Setting the
    checkpoint aside is always safe: every sink then resumes from its own offsets.

    :param sinks: each sink's topics and its committed offsets (None: no commit yet).
    """
    storage = checkpoint_storage(checkpoint)
    if storage.list():
        committed, planned = checkpoint_positions(checkpoint)
        foreign = sorted({t for offsets in (committed, planned) if offsets for t in offsets} - set(partitions))
        behind = [
            ",".join(topics)
            for topics, held in sinks
            if _nonzero(held, topics) not in (_nonzero(committed, topics), _nonzero(planned, topics))
        ]
        if not foreign and not behind:
            log.info("checkpoint %s agrees with the %d sinks: resuming from it", checkpoint, len(sinks))
            return "earliest"
        aside = f"{checkpoint.rstrip('/')}.stale-{int(time.time())}"
        log.warning(
            "checkpoint %s disagrees with the sinks (%s): moved to %s; each sink starts from its own offsets",
            checkpoint,
            f"topics it does not read: {foreign}" if foreign else f"the sinks of {behind} hold other offsets",
            aside,
        )
        _set_aside(checkpoint, aside)
    held = {t: parts for _, offsets in sinks for t, parts in (offsets or {}).items()}
    if not held:
        return "earliest"
    start = {t: {str(p): held.get(t, {}).get(p, -2) for p in parts} for t, parts in partitions.items()}
    log.info("starting from the sinks' committed offsets %s", start)
    return json.dumps(start)


def _nonzero(offsets: Offsets | None, topics: tuple[str, ...]) -> dict[tuple[str, int], int]:
    """Return the positions past 0 of ``topics`` in ``offsets`` (a partition at 0 holds nothing, like a missing one)."""
    return {(t, p): o for t in topics for p, o in (offsets or {}).get(t, {}).items() if o}


def _set_aside(checkpoint: str, aside: str) -> None:
    """Move a checkpoint out of the query's way: a rename locally, copy + delete on S3."""
    from exactly_once_provider.storage import is_s3

    if not is_s3(checkpoint):
        shutil.move(checkpoint.removeprefix("file://"), aside.removeprefix("file://"))
        return
    source, target = checkpoint_storage(checkpoint), checkpoint_storage(aside)
    for key in source.list():
        target.put(key, source.read(key) or b"")
    source.delete_prefix("")


def _not_yet_committed(df, offsets: Offsets):
    """Keep only rows at or after the sink's committed offsets (guards a checkpoint that lags the sink)."""
    from pyspark.sql import functions as F

    done = None
    for topic, parts in offsets.items():
        for partition, offset in parts.items():
            cond = (
                (F.col("kafka_topic") == topic)
                & (F.col("kafka_partition") == partition)
                & (F.col("kafka_offset") < offset)
            )
            done = cond if done is None else done | cond
    return df if done is None else df.filter(~done)


# The Java consumer's fetch.max.wait.ms (default 500): how long the broker holds a fetch that finds nothing.
# A micro-batch reads up to the last stable offset, and a read_committed range ends at a transaction marker the
# client never returns: unless a newer transaction commits meanwhile, the last fetch of each batch waits this
# long (measured: ~430 of a 550-ms read with the capture committing every second).
FETCH_MAX_WAIT_MS = "100"

TABLE_IDENTITY = ("source.schema", "source.table")  # where a binlog change record names its table
# Tables of one shared micro-batch committed at once (:func:`_side_by_side`).
TABLE_THREADS = 4


def key_paths(key_field: str) -> tuple[str, ...]:
    """Return the JSON paths of a CDC key: one field, or several separated by commas (``source.table,pk``)."""
    return tuple(p.strip() for p in key_field.split(",") if p.strip())


def cdc_changes(df, key_field: str, version_field: str, op_field: str):
    """Turn records into the newest change per key of this batch: ``pk, source_version, deleted, ...``.

    A record without the key or the version is bad input: the batch fails before anything is committed. So is
    a batch holding change records of two source tables when the key does not name the table
    (:func:`refuse_mixed_tables`).

    :param key_field: the JSON field holding the key, or several, comma-separated: then ``pk`` is the JSON
        array of their values (e.g. ``source.schema,source.table,pk`` keys the binlog capture's records by
        table and primary key).
    """
    from pyspark.sql import functions as F

    paths = key_paths(key_field)
    parts = [F.get_json_object("record_value", f"$.{p}") for p in paths]
    key = (
        parts[0]
        if len(parts) == 1
        else F.when(sum((part.isNull().cast("int") for part in parts), F.lit(0)) == 0, F.to_json(F.array(*parts)))
    )
    # The capture's schema records (ALTER TABLE) are no change: the raw-record CDC table has nothing to evolve.
    records = df.filter(~F.col("record_value").startswith(DDL_PREFIX))
    if not set(TABLE_IDENTITY) <= set(paths):
        refuse_mixed_tables(records, key_field)
    parsed = records.select(
        key.alias("pk"),
        F.get_json_object("record_value", f"$.{version_field}").cast("bigint").alias("source_version"),
        F.coalesce(F.get_json_object("record_value", f"$.{op_field}").isin("d", "delete"), F.lit(False)).alias(
            "deleted"
        ),
        "record_value",
        "kafka_topic",
        "kafka_partition",
        "kafka_offset",
    )
    bad = (
        parsed.filter(F.col("pk").isNull() | F.col("source_version").isNull())
        .select("kafka_topic", "kafka_partition", "kafka_offset")
        .limit(3)
        .collect()
    )
    if bad:
        raise ValueError(
            f"CDC records without '{key_field}' or a numeric '{version_field}' in their JSON value, "
            f"e.g. at {[tuple(r) for r in bad]}; fix the producer or the --key-field/--version-field."
        )
    cols = parsed.columns
    return (
        parsed.groupBy("pk")
        .agg(F.max_by(F.struct(*cols), F.struct("source_version", "kafka_offset")).alias("c"))
        .select("c.*")
    )


def refuse_mixed_tables(records, key_field: str) -> None:
    """Fail the batch if it holds change records of more than one source table (their keys would collide).

    Two tables keyed ``{"id": 1}`` are one key to a sink merged on the primary key alone: a change of one would
    overwrite the other's row. Records that name no table (another producer's) are not counted.
    """
    from pyspark.sql import functions as F

    identity = F.concat_ws(".", *[F.get_json_object("record_value", f"$.{p}") for p in TABLE_IDENTITY])
    found = records.select(identity.alias("t")).filter(F.col("t").contains(".")).distinct().limit(2).collect()
    if len(found) > 1:
        first, second = sorted(row[0] for row in found)
        raise ValueError(
            f"One CDC sink is fed change records of two source tables, {first} and {second}, merged on the key "
            f"{key_field!r} alone: rows of both with equal keys would overwrite each other. Give each table its "
            "own sink (the operator's streams: one query per table, one application), or make the table part "
            f"of the key: key_field='source.schema,source.table,{key_field}'. Nothing of this batch was committed."
        )


def current_table_source(path: str):
    """Return the handoff of the full load that created the current table at ``path`` (its key and columns)."""
    from exactly_once_provider.full_load.handoff import read_handoff

    found = read_handoff(path.removeprefix("file://"))
    if not found.columns:
        raise ValueError(
            f"The full load in {path} was published by an older version of this provider (its handoff "
            "names no columns and its rows carry no source version): run it again with "
            "full_reload=True before merging changes into it."
        )
    return found


def _covered(end: Offsets, committed: Offsets) -> bool:
    """Whether the sink holds every offset up to ``end`` (a partition it never committed holds nothing: 0)."""
    return all(committed.get(t, {}).get(p, 0) >= o for t, parts in end.items() for p, o in parts.items())


@contextmanager
def _stop_at_poison(
    sink, spark, kafka_options: dict[str, str] | None, previous: BatchCommit | None, end: Offsets, batch_id: int
):
    """Turn Spark's ``validate_utf8`` failure inside a batch into a clear error naming the records."""
    try:
        yield
    except poison.PoisonRecordError:
        raise
    except Exception as err:
        if not poison.is_invalid_utf8(err) or kafka_options is None:
            raise
        start = previous.offsets if previous else {}
        found = poison.locate(read_kafka_range(spark, kafka_options, start, end))
        raise poison.refuse(found, "key or value is not valid UTF-8", sink.kind, batch_id, start) from err


def process_batch(
    sink,
    pipeline: str,
    checkpoint: str,
    df,
    batch_id: int,
    exactly_once: bool,
    to_changes=None,
    kafka_options: dict[str, str] | None = None,
    topics: tuple[str, ...] | None = None,
    batch_end: Offsets | None = None,
    policy: dead_letters.DeadLetterPolicy | None = None,
) -> None:
    """Commit one micro-batch to the sink exactly once (or append it, for the at-least-once baseline).

    ``to_changes`` turns the batch's records into changes (``--mode cdc``, ``current``) and returns them with the
    :class:`~exactly_once_provider.sinks.base.SchemaChange` the sink commits with them (current mode; else None);
    None appends records.
    ``topics``: the sink's topics when the query reads more (a shared query, :func:`process_routes`: ``df`` holds
    only their records, and the sink commits only their offsets); ``batch_end``: the batch's planned end offsets
    when the caller has read them already (default: read from the checkpoint's offsets log).
    ``policy``: ``on_bad_record="dead_letter"`` (``df`` then holds the raw :data:`~.dead_letters.RAW_SELECT`
    columns): the batch is split into good records and dead letters (:func:`~.dead_letters.split`, which fails
    the batch past the limit, before anything is written), and the sink commits both in its one step.
    """
    started = time.monotonic()
    changes = to_changes or _records
    if not exactly_once:
        sink.append(changes(df)[0])
        log.info("batch %d appended (at-least-once) in %.1fs", batch_id, time.monotonic() - started)
        return
    end = wal_offsets(checkpoint, batch_id) if batch_end is None else batch_end
    if topics is not None:  # one table of a shared query: its topics' part of the batch
        end = {t: end[t] for t in topics if t in end}
    commit = BatchCommit(pipeline, checkpoint_id(checkpoint), batch_id, end)
    previous = sink.committed()
    if previous is not None and replayed(previous, commit):  # early out only: the sink's commit checks again
        log.info("batch %d already committed to the %s sink (replay after a crash): skipped", batch_id, sink.kind)
        return
    if _covered(end, previous.offsets if previous else {}):  # an empty topic is covered by a sink without commits
        log.info("batch %d ends at %s, the sink already holds it: skipped", batch_id, end)
        return
    if previous is not None:
        df = _not_yet_committed(df, previous.offsets)
    letters = raw = None
    held: list = []
    if policy is not None:  # one read of Kafka for the letters and the good records
        raw = df.persist()
    try:
        if raw is not None:
            # current mode: the typed conversion's kinds too (a DECIMAL past its column, an unknown schema version)
            typed_rules = getattr(to_changes, "letter_rules", None)
            df, letters = dead_letters.split(
                raw,
                sink.kind,
                policy,
                pipeline,
                commit.checkpoint_id,
                batch_id,
                previous.offsets if previous else None,
                typed_rules(raw) if typed_rules is not None else (),
            )
            change_key = getattr(to_changes, "change_key", None)
            if letters.rows and change_key is not None:  # cdc / current: a bad newest version holds its key back
                df, held = dead_letters.hold_back(raw, df, letters, change_key)
        with _stop_at_poison(sink, df.sparkSession, kafka_options, previous, end, batch_id):
            changed, schema = changes(df)
            planned = time.monotonic()
            fault_point("before_sink_commit", batch_id)
            with_letters = {"letters": letters} if letters is not None else {}
            try:
                # only if the sink still holds previous
                written = sink.commit(changed, commit, expected=previous, schema=schema, **with_letters)
            except Exception as err:
                if not schema_change_ahead(err):
                    raise
                # Rare: the batch holds a schema change (current mode plans a batch without reading its schema
                # records). Nothing of it was written: plan it again, following the change.
                log.info("batch %d holds a schema change: planned again with it", batch_id)
                changed, schema = changes(df, schema_records=True)
                written = sink.commit(changed, commit, expected=previous, schema=schema, **with_letters)
    finally:
        if raw is not None:
            raw.unpersist()
    fault_point("after_sink_commit", batch_id)
    if letters is not None and letters.rows and written:
        _log_letters(batch_id, letters)
    if held and written:
        # A key whose newest change of the batch is a letter keeps its row as it was (docs/dead-letters.md).
        log.info(
            "batch %d: %d keys held back (their newest change is a dead letter): %s",
            batch_id,
            len(held),
            ", ".join(json.dumps(list(k)) for k in held[:20]) + (" ..." if len(held) > 20 else ""),
        )
    state = sink.committed()
    # Where a batch's time goes (planning: the changes step's own reads; commit: the sink's write) is what a
    # user tuning the trigger interval needs.
    log.info(
        "batch %d %s to the %s sink in %.2fs (planning %.2fs, commit %.2fs): offsets %s, %d rows in total",
        batch_id,
        "committed" if written else "was already committed",
        sink.kind,
        time.monotonic() - started,
        planned - started,
        time.monotonic() - planned,
        json.dumps(commit.to_json()["offsets"]),
        state.rows_total if state else 0,
    )


def _records(frame, schema_records: bool = False) -> tuple:
    """The change step of the append mode: the records as they are, no schema change."""
    return frame, None


def process_window_batch(
    sink,
    pipeline: str,
    checkpoint: str,
    kafka_options: dict[str, str],
    spark,
    batch_id: int,
    policy: dead_letters.DeadLetterPolicy | None = None,
) -> None:
    """Settle the window versions completed by this micro-batch (window mode; see ``settlement``).

    The records are read again from Kafka from the sink's committed offsets to the micro-batch's end, so a
    batch cut by an earlier micro-batch is read whole; the streaming DataFrame itself is never scanned.

    ``policy`` (``on_bad_record="dead_letter"``): a bad data record of a window version published now is a dead
    letter, committed with the window; the window settles without its row, and the sink's window state counts
    it (:func:`_window_letters`).
    """
    from pyspark.sql import functions as F

    from exactly_once_provider.spark_jobs import settlement

    started = time.monotonic()
    end = wal_offsets(checkpoint, batch_id)
    commit_id = checkpoint_id(checkpoint)
    previous = sink.committed()
    if replayed(previous, BatchCommit(pipeline, commit_id, batch_id, end)):  # early out, as in process_batch
        log.info("batch %d already committed to the %s sink (replay after a crash): skipped", batch_id, sink.kind)
        return
    start = previous.offsets if previous else {}
    if _covered(end, start):
        log.info("batch %d ends at %s, the sink already holds %s: skipped", batch_id, end, start)
        return
    read = settlement.read_range(spark, kafka_options, start, end, raw=policy is not None)
    if policy is not None:  # the data records' bad kinds flagged once, in the cached read
        read = dead_letters.flag(read, sink.kind, policy.mode, where=F.col("eo_marker").isNull())
    read = read.persist()
    records = read
    if policy is not None:
        records = read.selectExpr(
            "kafka_topic",
            "kafka_partition",
            "kafka_offset",
            f"{dead_letters.GOOD_KEY} AS record_key",
            f"{dead_letters.GOOD_VALUE} AS record_value",
            "eo_marker",
            "eo_batch",
            "_eo_error_class",
        )
    try:
        with _stop_at_poison(sink, spark, kafka_options, previous, end, batch_id):
            markers, counts, unframed = settlement.scan(records)
        if unframed:
            raise settlement.WindowIntegrityError(
                f"records outside any settlement batch (no {settlement.BATCH_HEADER} header, no marker) at "
                f"{unframed} (topic, partition, offset): window mode reads topics written only by "
                "WatermarkExtractOperator. Nothing was committed past offsets "
                + json.dumps({t: {str(p): o for p, o in parts.items()} for t, parts in start.items()})
                + "."
            )
        published = sink.published_windows()
        plan = settlement.plan_windows(markers, counts, start, end, published)
        for label in plan.incomplete:
            log.info(
                "window %s is incomplete in this read (no end marker yet): not published, read again "
                "from its begin marker next time",
                label,
            )
        for label in plan.stale:
            log.info("window %s is not newer than the published version: skipped", label)
        if not plan.publish and plan.carry == start:
            log.info("batch %d: nothing to settle (%d markers read)", batch_id, len(markers))
            return
        commit = BatchCommit(pipeline, commit_id, batch_id, plan.carry)
        letters, with_letters = None, {}
        if policy is not None:
            letters = _window_letters(read, plan, policy, sink.kind, pipeline, commit_id, batch_id, start)
            records = records.filter(F.col("_eo_error_class").isNull()).drop("_eo_error_class")
            with_letters = {"letters": letters}
        fault_point("before_sink_commit", batch_id)
        written = sink.commit_windows(
            settlement.window_rows(records, plan.publish),
            plan.publish,
            plan.rows,
            commit,
            expected=previous,
            **with_letters,
        )
        fault_point("after_sink_commit", batch_id)
    finally:
        read.unpersist()
    if letters is not None and letters.rows and written:
        _log_letters(batch_id, letters, windows=True)
    for window, version in sorted(plan.publish.items()):
        log.info(
            "window %s v%d published (%d rows, replacing v%s)",
            window,
            version,
            plan.rows[window],
            published.get(window, "-"),
        )
    log.info(
        "batch %d %s to the %s sink in %.1fs: offsets %s",
        batch_id,
        "committed" if written else "was already committed",
        sink.kind,
        time.monotonic() - started,
        json.dumps(commit.to_json()["offsets"]),
    )


def _log_letters(batch_id: int, letters: dead_letters.DeadLetters, windows: bool = False) -> None:
    """Log a committed batch's letters: the count per batch is what a user watching the task log needs (the letters
    themselves are in the store); window mode names their windows."""
    log.info(
        "batch %d: %d dead letters %s%s committed with it to %s (%d held there already: a replay)",
        batch_id,
        len(letters.rows),
        json.dumps(letters.by_class()),
        f" of windows {json.dumps(letters.by_window(), sort_keys=True)}" if windows else "",
        letters.store,
        len(letters.rows) - letters.written,
    )


def _window_letters(read, plan, policy, sink_kind: str, pipeline: str, commit_id: str, batch_id: int, start: Offsets):
    """Return the dead letters of the window versions ``plan`` publishes (each with its ``window_id``) and take them
    out of ``plan.rows`` (the rows each window publishes); the window versions not published dead-letter nothing:
    they are read again."""
    from pyspark.sql import functions as F

    from exactly_once_provider.spark_jobs import settlement

    headers = [settlement.batch_header(w, v) for w, v in plan.publish.items()]
    published = read.filter(F.col("eo_marker").isNull() & F.col("eo_batch").isin(headers))
    bad = published.filter(F.col("_eo_error_class").isNotNull()).withColumn(
        "window_id", F.regexp_extract("eo_batch", settlement.WINDOW_OF_HEADER, 1)
    )
    letters = dead_letters.collect(
        bad, published, sink_kind, policy, pipeline, commit_id, batch_id, start, extra=("window_id",)
    )
    for window, count in letters.by_window().items():
        plan.rows[window] -= count
    return letters


def build_session(args: StreamSpec, job: JobSpec | None = None):
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(f"eo-{args.pipeline}")
    if args.sink == "delta":
        builder = builder.config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension").config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
    spark = with_storage_conf(builder).getOrCreate()
    # The submit operator turns this line into the task's "Spark UI" extra link (plugins/links.py).
    log.info("Spark UI at %s", spark.sparkContext.uiWebUrl)
    if job is not None:
        report_started(job, spark.sparkContext.uiWebUrl)
    if args.sink == "delta":  # the table state (for the txn ids) is rebuilt on every commit
        limit_snapshot_partitions(spark)
    return spark


def run(args: StreamSpec, secrets: dict | None = None, job: JobSpec | None = None) -> dict | None:
    """Run the stream until its trigger ends it; return the sink's committed state (exactly once) or None.

    A spec with routes runs one query per route in this one application (:func:`await_queries`) and returns
    ``{"routes": {sink location: committed state}}``.

    :param args: the validated request.
    :param secrets: the connections' settings; default: read from ``args.secrets_file``.
    :param job: the job spec of a submitted run (its started file is written once the session runs).
    """
    if secrets is None:
        secrets = read_secret_file(args.secrets_file)
    os.environ.update(secrets.get("libpq", {}))  # the postgres sink connects with the libpq environment
    register_storage(secrets)  # an s3:// sink location: its settings, for the sink and for Spark's s3a
    if args.sink == "iceberg":  # the catalog's settings, for the Iceberg sink's commits
        from exactly_once_provider.sinks.iceberg import register_catalog

        register_catalog(secrets.get("iceberg"))
    kafka_config = secrets["kafka"]
    # Every sink is prepared and every start position settled before the session starts the first query.
    if args.shared:
        prepared = _prepare_shared(args, kafka_config)
    else:
        prepared = [_prepare_query(query, kafka_config) for query in args.queries()]
    spark = build_session(args, job)
    kafka_options = spark_kafka_options(kafka_config)  # the Java client's names for the same settings
    started = time.monotonic()
    if args.shared:
        queries = [_start_shared_query(spark, args, prepared, kafka_options)]
    else:
        queries = [
            _start_query(spark, query, sink, to_changes, starting, kafka_options, named=bool(args.routes))
            for query, sink, to_changes, starting in prepared
        ]
    await_queries(queries, args.pipeline, args.max_runtime)
    # Processing time without JVM start-up: what the benchmark compares between delivery modes.
    print(f"EO_TIMING {time.monotonic() - started:.3f}", flush=True)
    states = {
        query.path or query.table: sink.committed() if query.delivery == "exactly-once" else None
        for query, sink, _, _ in prepared
    }
    result = {where: state.to_json() if state else None for where, state in states.items()}
    if not args.routes:
        result = next(iter(result.values()))
    else:
        result = {"routes": result}
    print("EO_RESULT " + json.dumps(result), flush=True)
    return result


def _prepare_query(args: StreamSpec, kafka_config: dict) -> tuple[StreamSpec, Sink, Any, str]:
    """Open one query's sink and settle where it starts: ``(spec, sink, batch -> changes step, startingOffsets)``."""
    sink, to_changes = _open_route(args)
    starting = "earliest"
    if args.delivery == "exactly-once":
        partitions = topic_partitions(kafka_config, list(args.topics), _topic_wait(args))
        starting = reconcile_start(args.checkpoint, _sink_offsets(sink, args.topics), partitions)
    return args, sink, to_changes, starting


def _prepare_shared(args: StreamSpec, kafka_config: dict) -> list[tuple[StreamSpec, Sink, Any, str]]:
    """Open every route's sink and settle where the query they share starts (every route: the same start)."""
    routes = [(route, *_open_route(route)) for route in args.queries()]
    starting = "earliest"
    if args.delivery == "exactly-once":
        topics = [t for route in routes for t in route[0].topics]
        held = [(route.topics, _sink_offsets(sink, route.topics)) for route, sink, _ in routes]
        starting = reconcile_shared_start(
            args.checkpoint, held, topic_partitions(kafka_config, topics, _topic_wait(args))
        )
    return [(route, sink, to_changes, starting) for route, sink, to_changes in routes]


def _topic_wait(args: StreamSpec) -> float:
    """Seconds to wait for missing topics: a long-running stream may start beside the capture that creates them."""
    return 300 if args.trigger == "processing-time" else 0


def _sink_offsets(sink: Sink, topics: tuple[str, ...]) -> Offsets | None:
    """Return the sink's committed offsets of ``topics`` (it may still hold topics the pipeline dropped), or None."""
    previous = sink.committed()
    held = {t: o for t, o in previous.offsets.items() if t in topics} if previous else {}
    return held or None


def _open_route(args: StreamSpec) -> tuple[Sink, Any]:
    """Open one table's sink: ``(sink, batch -> changes step)`` (None: the records are appended as they are)."""
    source = current_table_source(args.path) if args.mode == "current" else None
    sink = make_sink(args, source)
    to_changes = None
    if args.mode == "cdc":

        def to_changes(df, schema_records: bool = False):
            return cdc_changes(df, args.key_field, args.version_field, args.op_field), None

        to_changes.change_key = dead_letters.ChangeKey.cdc(args.key_field, args.version_field)
    elif source is not None:
        to_changes = CurrentChanges(source, sink)
    return sink, to_changes


def _start_query(
    spark, args: StreamSpec, sink: Sink, to_changes, starting: str, kafka_options: dict[str, str], named: bool = False
):
    """Start one streaming query of ``args.topics`` into ``sink``, committing each micro-batch exactly once."""
    exactly_once = args.delivery == "exactly-once"

    def each_batch(df, batch_id: int) -> None:
        if args.mode == "window":
            process_window_batch(
                sink, args.pipeline, args.checkpoint, kafka_options, spark, batch_id, args.dead_letter_policy()
            )
        else:
            process_batch(
                sink,
                args.pipeline,
                args.checkpoint,
                df,
                batch_id,
                exactly_once,
                to_changes,
                kafka_options,
                policy=args.dead_letter_policy(),
            )

    # Query names are unique within a session: a routed query is named after its topics too.
    name = f"{args.pipeline}[{','.join(args.topics)}]" if named else args.pipeline
    return _start(spark, args, args.topics, starting, kafka_options, name, each_batch)


def _start_shared_query(spark, args: StreamSpec, prepared: list, kafka_options: dict[str, str]):
    """Start ONE streaming query over every route's topics; each micro-batch is split per table
    (:func:`process_routes`)."""
    routes = [(route, sink, to_changes) for route, sink, to_changes, _ in prepared]
    exactly_once = args.delivery == "exactly-once"

    def each_batch(df, batch_id: int) -> None:
        process_routes(routes, args.pipeline, args.checkpoint, df, batch_id, exactly_once, kafka_options)

    topics = tuple(t for route, _, _ in routes for t in route.topics)
    return _start(spark, args, topics, prepared[0][3], kafka_options, args.pipeline, each_batch)


def _start(spark, args: StreamSpec, topics, starting: str, kafka_options: dict[str, str], name: str, each_batch):
    """Start a streaming query of ``topics`` (read_committed) that hands each micro-batch to ``each_batch``."""
    reader = (
        spark.readStream.format("kafka")
        .options(**kafka_options)
        .option("subscribe", ",".join(topics))
        .option("kafka.isolation.level", "read_committed")
        .option("startingOffsets", starting)
        .option("failOnDataLoss", "true")
        .option("kafka.fetch.max.wait.ms", FETCH_MAX_WAIT_MS)
    )
    if args.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger))
    # dead_letter: the raw bytes, split per batch into records and letters (process_batch)
    frame = reader.load().selectExpr(*(dead_letters.RAW_SELECT if args.on_bad_record == "dead_letter" else SELECT))
    writer = (
        frame.writeStream.queryName(name)
        .option("checkpointLocation", checkpoint_storage(args.checkpoint).spark_uri())
        .foreachBatch(each_batch)
    )
    if args.trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=args.interval)
    return writer.start()


def process_routes(
    routes: list, pipeline: str, checkpoint: str, df, batch_id: int, exactly_once: bool, kafka_options=None
) -> None:
    """Commit one micro-batch of a shared query: each table it touches gets its part, in its own sink commit.

    A table is touched when the batch moved one of its topics' offsets past the previous batch's end (the
    offsets log holds both): an untouched table costs nothing (no read, no commit), so a batch costs what
    the tables it touches cost. Each touched table's part commits exactly as a one-table query's batch
    (:func:`process_batch`, fenced by the batch's identity and the sink's own offsets); a crash between two
    tables' commits replays the batch, and the tables that committed it skip it.

    :param routes: ``(route spec, sink, batch -> changes step)`` per table.
    """
    from pyspark.sql import functions as F

    end = wal_offsets(checkpoint, batch_id)
    start = _previous_end(checkpoint, batch_id)
    touched = [route for route in routes if start is None or any(end.get(t) != start.get(t) for t in route[0].topics)]
    if not touched:
        return
    started = time.monotonic()

    def commit_table(route) -> None:
        spec, sink, to_changes = route
        part = df.filter(F.col("kafka_topic").isin(*spec.topics))
        process_batch(
            sink,
            pipeline,
            checkpoint,
            part,
            batch_id,
            exactly_once,
            to_changes,
            kafka_options,
            spec.topics,
            end,
            policy=spec.dead_letter_policy(),
        )

    if len(touched) == 1:
        commit_table(touched[0])
    else:
        df = df.persist()  # one read of Kafka for every table's part
        try:
            _side_by_side(commit_table, touched)
        finally:
            df.unpersist()
    log.info(
        "batch %d: %d of %d tables touched, committed in %.2fs",
        batch_id,
        len(touched),
        len(routes),
        time.monotonic() - started,
    )


def _side_by_side(commit_table, routes: list) -> None:
    """Run ``commit_table`` for each route in :data:`TABLE_THREADS` threads; raise the first route's error (in
    ``routes`` order) once every started commit has ended.

    Side by side because a table's commit is mostly Spark jobs (the JVM's threads): one table's planning and
    commit overlap another's jobs (4 tables, 500 changes/s, 2 cores: see docs/benchmarks.md). Each table's commit
    is fenced on its own, so a failure of one leaves the others' commits exact; the batch fails and is replayed,
    and the tables that committed it skip it.
    """
    with ThreadPoolExecutor(max_workers=min(TABLE_THREADS, len(routes)), thread_name_prefix="eo-table") as pool:
        futures = [pool.submit(commit_table, route) for route in routes]
    for future in futures:
        future.result()


def _previous_end(checkpoint: str, batch_id: int) -> Offsets | None:
    """Return where ``batch_id`` starts (the previous batch's planned end), or None when the log does not say."""
    if batch_id == 0:
        return None
    try:
        return wal_offsets(checkpoint, batch_id - 1)
    except FileNotFoundError:
        return None


def await_queries(queries: list, pipeline: str, max_runtime: float | None, poll: float = 1.0) -> None:
    """Wait until every query has ended (or ``max_runtime`` has passed: then stop them all cleanly).

    The first query that fails stops the others and its error ends the application: the tables whose queries
    were stopped keep what they committed (each batch commit is atomic) and the next run resumes each from
    its own sink.
    """
    if len(queries) == 1:  # one query: Spark's own wait, its error raised as it always was
        query = queries[0]
        if max_runtime is None:
            query.awaitTermination()
        elif not query.awaitTermination(max_runtime):
            # Stopping interrupts at most a batch in flight: its sink commit is atomic, and the next run resumes
            # from what the sink holds.
            log.info("stream %s ran for %.0fs (max_runtime): stopping", pipeline, max_runtime)
            query.stop()
        return
    deadline = None if max_runtime is None else time.monotonic() + max_runtime
    while True:
        failed = next((q for q in queries if not q.isActive and q.exception() is not None), None)
        if failed is not None:
            log.error("query %s failed: stopping the other %d queries", failed.name, len(queries) - 1)
            for query in queries:
                query.stop()
            failed.awaitTermination()  # raises the failed query's error, as a one-query run does
        active = [q for q in queries if q.isActive]
        if not active:
            return
        if deadline is not None and time.monotonic() >= deadline:
            log.info(
                "stream %s ran for %.0fs (max_runtime): stopping its %d queries", pipeline, max_runtime, len(active)
            )
            for query in active:
                query.stop()
            return
        active[0].awaitTermination(poll)


def _submitted(job: JobSpec, secrets: dict) -> dict | None:
    return run(StreamSpec.from_json(job.params).validate(), secrets, job)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--spec"]:  # submitted by SparkKafkaToSinkOperator
        return run_job(JOB, _submitted, argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    exit_with_the_jvm()
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
