"""Dead letters: the records a sink cannot store, committed with the batch they came in (issue 41).

Policy (``on_bad_record`` of the Kafka -> sink job and its operator): ``"fail"`` (the default) stops the job at
the batch holding a bad record, before its commit (:mod:`~exactly_once_provider.sinks.poison`);
``"dead_letter"`` commits the batch's good records to the sink and its bad ones to the pipeline's dead-letter
store, in the same exactly-once step. Past :attr:`DeadLetterPolicy.max_letters` bad records in one batch (or
:attr:`DeadLetterPolicy.max_ratio` of its records) the batch fails as in ``"fail"``, with nothing of it committed
anywhere, and the error names the limit and the store. Bad records (:func:`rules`): a key or value that is not
valid UTF-8 (every sink), text holding a NUL character (PostgreSQL; in the current table's change records the
JSON escape ``\\u0000`` of a text value), and in the current table the typed conversion's kinds
(:mod:`~exactly_once_provider.sinks.bad_values`: a DECIMAL past its column, ``decimal_overflow``; a row image of a
schema version the table does not follow, ``schema_version``; rules passed in by the changes step, :func:`flag`'s
``extra``). Every mode; window mode into PostgreSQL and Delta (docs/dead-letters.md says what is not built yet).

In ``cdc`` and ``current`` mode a letter is a CHANGE of a key: the key is held back from the batch's changes only
when the letter is that key's newest version in the batch (:func:`held_back`, :func:`hold_back`): an older bad
version followed by a good newer one lets the good one apply (the bad one is still dead-lettered), while a bad
newest version keeps every change of its key in this batch out, so the table never shows a state older than
one the batch says came after it. A later batch's good change of the key applies as usual (it is newer than
the row). The key and version of a letter are read from its value's JSON (undecodable bytes replaced): a
letter whose key or version cannot be read holds nothing back.

Every dead letter keeps :data:`COLUMNS`: the pipeline, the batch (checkpoint id, batch id), the record's topic,
partition, offset and Kafka timestamp, its raw key and value bytes, the error class and message, and when it
was dead-lettered. A record is dead-lettered at most once per pipeline: (pipeline, topic, partition, offset) is
the store's key.

PostgreSQL: the store is a table (default ``<table>_dead_letters``, created if missing) written in the batch's
ONE transaction, after the rows and before the offsets (:meth:`~.postgres.PostgresSink.commit`): rows, letters and
offsets commit together or not at all; the primary key refuses a second copy.

Delta: two Delta tables cannot share one commit, so the store is a Delta table NEXT to the sink (default
``<path>_dead_letters``, a :class:`~.delta.DeltaSink` of its own) and the order and the fence make the pair
exact (:meth:`~.delta.DeltaSink.commit`):

1. the STORE commits first, then the SINK; the sink's commit (txn ``<pipeline>:<checkpoint id>`` / batch id, its
   marker's offsets) is the batch's commit, the only one that moves the pipeline on. The other order could lose
   letters: after a crash between them the sink holds the batch, so its replay is skipped whole and its
   letters would never be written.
2. the store carries its own marker with a WATERMARK: per partition, the offset below which it holds every
   letter (the end of the last batch it committed letters for, never lowered). A batch writes only its letters
   at or past the watermark and raises it to the batch's end, in one store commit, fenced like the sink's
   (the predecessor read, re-checked at the put-if-absent: a zombie driver's concurrent store commit fails
   this one; the store's txn is the batch's too).
3. a crash between the two commits leaves the store ahead of the sink: it holds the letters of a batch the
   sink does not hold yet. The replay of that batch (same checkpoint, same ids) finds them below the
   watermark and writes no letter again; the sink's commit then completes the batch. Because the watermark is
   by OFFSET, not by batch id, the same holds when the replay comes under another checkpoint (set aside,
   lost) with other batch bounds: a Kafka record at an offset never changes, nor does its verdict, so a letter
   below the watermark is the very letter this batch would write. Never twice (only letters past the
   watermark are written, and it moves past them in the same commit), never lost (the sink commits a batch
   only after the store holds every letter of it).

Window mode: a bad DATA record of a settlement window is dead-lettered when its window version is published, in
the same step (its markers must be whole: a bad marker still fails the batch). The window settles with the
letter: its record counts toward the markers' announced records, its row is not in the sink, and the sink's
window state counts it (``dead_letters``), so a report can say the window settled with N letters. A window
version that is not published (incomplete, stale) dead-letters nothing; it is read again. The Delta store's
watermark cannot tell which letters of a re-read range it holds (an incomplete window's carry keeps the read
before letters of a published one), so window mode writes the letters the store does not hold by offset,
read from the store itself under the same fence.

So a reader of the Delta store may see letters at offsets at or past the sink's committed offsets: those of the
batch in flight (or of one a crash interrupted), which the next run's commit of that batch completes.

Files sink: the letters are a Parquet file of the batch under ``<root>/dead_letters/<batch>/``, listed in the
batch's manifest (key ``dead_letters``, cumulative like ``files``): the manifest's put-if-absent publishes rows,
letters and offsets at once (:meth:`~.files.FilesSink.commit`); a crash before it leaves orphans only, removed at
the next start.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field
from typing import Any

from exactly_once_provider.sinks import poison
from exactly_once_provider.sinks.base import Offsets, offsets_to_json

POLICIES = ("fail", "dead_letter")
MODES = ("append", "cdc", "current", "window")  # the modes dead letters are built for
DEFAULT_MAX_LETTERS = 100
SUFFIX = "_dead_letters"
FILES_FOLDER = "dead_letters"  # the files sink's letters: <root>/dead_letters/<batch>/, listed by its manifest

# The columns of a dead letter, in every store.
COLUMNS = (
    "pipeline",
    "checkpoint_id",
    "batch_id",
    "kafka_topic",
    "kafka_partition",
    "kafka_offset",
    "kafka_timestamp",
    "record_key",
    "record_value",
    "error_class",
    "error_message",
    "dead_lettered_at",
)
SPARK_SCHEMA = (
    "pipeline STRING, checkpoint_id STRING, batch_id BIGINT, kafka_topic STRING, kafka_partition INT, "
    "kafka_offset BIGINT, kafka_timestamp TIMESTAMP, record_key BINARY, record_value BINARY, "
    "error_class STRING, error_message STRING, dead_lettered_at TIMESTAMP"
)
POSTGRES_DDL = (
    "CREATE TABLE IF NOT EXISTS {} (pipeline text NOT NULL, checkpoint_id text NOT NULL, batch_id bigint NOT NULL,"
    " kafka_topic text NOT NULL, kafka_partition integer NOT NULL, kafka_offset bigint NOT NULL,"
    " kafka_timestamp timestamptz, record_key bytea, record_value bytea, error_class text NOT NULL,"
    " error_message text NOT NULL, dead_lettered_at timestamptz NOT NULL,"
    " PRIMARY KEY (pipeline, kafka_topic, kafka_partition, kafka_offset))"
)

# A JSON string's escape of NUL, not preceded by an odd number of backslashes (``\\\\u0000`` is text, no NUL).
JSON_NUL = r"(^|[^\\])(\\\\)*\\u0000"

# The streaming query's projection in dead-letter mode: the raw bytes, classified per batch (:func:`split`).
RAW_SELECT = (
    "topic AS kafka_topic",
    "partition AS kafka_partition",
    "offset AS kafka_offset",
    "timestamp AS kafka_timestamp",
    "key",
    "value",
)


class DeadLetterLimitError(poison.PoisonRecordError):
    """Raise when a batch holds more bad records than the policy allows; nothing of the batch was committed."""


@dataclass(frozen=True)
class DeadLetterPolicy:
    """``on_bad_record="dead_letter"`` of one query.

    :param store: the dead-letter store: a PostgreSQL table or a Delta table's location.
    :param max_letters: bad records allowed in one batch; more fail the batch.
    :param max_ratio: share of a batch's records allowed to be bad (0 < r <= 1); None: no ratio limit.
    :param mode: the query's mode (``append``, ``cdc``, ``current``): which bad-record kinds apply (:func:`rules`).
    """

    store: str
    max_letters: int = DEFAULT_MAX_LETTERS
    max_ratio: float | None = None
    mode: str = "append"


@dataclass
class DeadLetters:
    """One batch's dead letters, collected on the driver (at most the policy's limit), for the sink's commit.

    :param store: where they go (the policy's store).
    :param rows: one dict per letter, keyed by :data:`COLUMNS`.
    """

    store: str
    rows: list[dict] = field(default_factory=list)
    written: int = 0  # set by the sink: letters this commit added (0 for a replay the store already held)

    def by_window(self) -> dict[str, int]:
        """Return window id -> letters of this batch (window mode: each letter keeps its ``window_id``)."""
        counts: dict[str, int] = {}
        for row in self.rows:
            counts[row["window_id"]] = counts.get(row["window_id"], 0) + 1
        return counts

    def by_class(self) -> dict[str, int]:
        """Return error class -> letters of this batch."""
        counts: dict[str, int] = {}
        for row in self.rows:
            counts[row["error_class"]] = counts.get(row["error_class"], 0) + 1
        return dict(sorted(counts.items()))


def default_store(sink: str, location: str) -> str:
    """Return the dead-letter store of a sink by default: ``<table>_dead_letters`` / ``<path>_dead_letters``; the
    files sink's is its own ``dead_letters/`` folder, published by its manifest (no other choice)."""
    if sink == "postgres":
        return location + SUFFIX
    if sink == "files":
        return f"{location.rstrip('/')}/{FILES_FOLDER}"
    return location.rstrip("/") + SUFFIX


def check_policy(
    on_bad_record: str,
    max_letters: Any,
    max_ratio: Any,
    store: str | None,
    sink: str,
    mode: str,
    delivery: str,
) -> None:
    """Raise ValueError naming the first dead-letter setting that is wrong (a StreamSpec's validation)."""
    if on_bad_record not in POLICIES:
        raise ValueError(f"on_bad_record must be one of {POLICIES}, got {on_bad_record!r}.")
    if on_bad_record == "fail":
        if max_letters is not None or max_ratio is not None or store:
            raise ValueError(
                "max_dead_letters, max_dead_letter_ratio and dead_letter_store apply with "
                "on_bad_record='dead_letter' only; on_bad_record='fail' stops at the first bad record."
            )
        return
    if sink == "files" and store:
        raise ValueError(
            "dead_letter_store: the files sink keeps its dead letters in its own manifest commit "
            f"(<sink_path>/{FILES_FOLDER}/); leave it unset."
        )
    if mode == "window" and sink == "files":
        raise ValueError(
            "on_bad_record='dead_letter' in mode='window' is built for the postgres and delta sinks, not yet for "
            "files (docs/dead-letters.md): use on_bad_record='fail'."
        )
    if mode not in MODES:
        raise ValueError(
            f"on_bad_record='dead_letter' is built for mode={' / '.join(repr(m) for m in MODES)}, not yet for "
            f"mode={mode!r} (docs/dead-letters.md): use on_bad_record='fail'."
        )
    if delivery != "exactly-once":
        raise ValueError(
            "on_bad_record='dead_letter' commits the letters with the batch: it needs delivery='exactly-once'."
        )
    if max_letters is not None and (
        isinstance(max_letters, bool) or not isinstance(max_letters, int) or max_letters < 1
    ):
        raise ValueError(f"max_dead_letters must be a whole number of at least 1, got {max_letters!r}.")
    if max_ratio is not None and (
        isinstance(max_ratio, bool) or not isinstance(max_ratio, int | float) or not 0 < max_ratio <= 1
    ):
        raise ValueError(f"max_dead_letter_ratio must be a number in (0, 1], got {max_ratio!r}.")
    if store is not None and not str(store).strip():
        raise ValueError("dead_letter_store is empty: name a table / location, or leave it unset for the default.")


def operator_settings(on_bad_record: str, max_letters: int | None, max_ratio: float | None) -> dict[str, Any]:
    """Return the Kafka -> sink operator's arguments of a template's policy ({} for ``"fail"``, the default).

    :raises ValueError: an unknown policy, or limits with ``"fail"`` (when the DAG is built, not when it runs).
    """
    if on_bad_record not in POLICIES:
        raise ValueError(f"on_bad_record must be one of {POLICIES}, got {on_bad_record!r}.")
    if on_bad_record == "fail":
        if max_letters is not None or max_ratio is not None:
            raise ValueError("max_dead_letters and max_dead_letter_ratio apply with on_bad_record='dead_letter' only.")
        return {}
    return {"on_bad_record": on_bad_record, "max_dead_letters": max_letters, "max_dead_letter_ratio": max_ratio}


def rules(sink_kind: str, mode: str = "append") -> list[tuple[Any, str, str]]:
    """Return ``(condition, error class, message)`` per bad-record kind the sink cannot store, in order.

    Conditions are Spark columns over the raw ``key``/``value`` bytes; the first that holds names the error.
    The PostgreSQL current table stores the change record's values, decoded from its JSON: a text value holding
    the escape ``\\u0000`` (not itself escaped) is a NUL character there.
    """
    from pyspark.sql import functions as F

    found = []
    for column in ("key", "value"):
        text = F.col(column).cast("string")
        found.append(
            (F.col(column).isNotNull() & ~F.is_valid_utf8(text), "invalid_utf8", f"the {column} is not valid UTF-8")
        )
    if sink_kind == "postgres":
        for column in ("key", "value"):
            text = F.col(column).cast("string")
            found.append(
                (
                    F.col(column).isNotNull() & F.is_valid_utf8(text) & (F.instr(text, "\x00") > 0),
                    "nul_character",
                    f"the {column} holds a NUL character (PostgreSQL text cannot store it)",
                )
            )
        if mode == "current":
            text = F.col("value").cast("string")
            found.append(
                (
                    F.col("value").isNotNull() & F.is_valid_utf8(text) & F.regexp(text, F.lit(JSON_NUL)),
                    "nul_character",
                    "a value of the change holds a NUL character (PostgreSQL text cannot store it)",
                )
            )
    return found


def flag(df, sink_kind: str, mode: str = "append", where: Any = None, extra: Any = ()):
    """Return ``df`` (raw ``key``/``value`` bytes) with ``_eo_error_class`` and ``_eo_error_message``: the first
    :func:`rules` kind a record is, NULL for a good one.

    :param where: only records where this Spark condition holds can be bad (window mode: the data records; a
        batch marker that is not UTF-8 still fails the batch).
    :param extra: more rules, after :func:`rules`' (their message may be a Spark column): the current table's
        typed kinds, ``schema_version`` and ``decimal_overflow``
        (:meth:`~exactly_once_provider.spark_jobs.current_changes.CurrentChanges.letter_rules`).
    """
    from pyspark.sql import functions as F

    error_class, message = F.lit(None).cast("string"), F.lit(None).cast("string")
    for condition, name, text in reversed([*rules(sink_kind, mode), *extra]):
        condition = condition if where is None else where & condition
        error_class = F.when(condition, F.lit(name)).otherwise(error_class)
        message = F.when(condition, F.lit(text) if isinstance(text, str) else text).otherwise(message)
    return df.withColumn("_eo_error_class", error_class).withColumn("_eo_error_message", message)


# The good records' text: decoded only where no rule held. The optimizer may evaluate it before the filter on the
# error class (a later filter on record_value, e.g. the current mode's, is pushed below the projection), and a
# letter must not fail it. A record the rules missed still fails the batch in validate_utf8.
GOOD_KEY = f"CASE WHEN _eo_error_class IS NULL THEN {poison.KEY_TEXT} END"
GOOD_VALUE = f"CASE WHEN _eo_error_class IS NULL THEN {poison.VALUE_TEXT} END"


def split(
    df,
    sink_kind: str,
    policy: DeadLetterPolicy,
    pipeline: str,
    checkpoint_id: str,
    batch_id: int,
    committed: Offsets | None,
    extra: Any = (),
):
    """Return ``(good records, dead letters)`` of a raw batch (:data:`RAW_SELECT` columns; persist it first).

    The good records have the columns every mode reads (``kafka_topic``, ``kafka_partition``,
    ``kafka_offset``, ``record_key``, ``record_value``), still through ``validate_utf8`` (a record the rules
    missed fails the batch, never lands changed). The letters are collected on the driver: at most the
    policy's limit, else :class:`DeadLetterLimitError` (nothing written yet).

    :param committed: the sink's committed offsets (named in the limit's message).
    :param extra: more rules (:func:`flag`).
    """
    from pyspark.sql import functions as F

    flagged = flag(df, sink_kind, policy.mode, extra=extra)
    good = flagged.filter(F.col("_eo_error_class").isNull()).selectExpr(
        "kafka_topic",
        "kafka_partition",
        "kafka_offset",
        f"{GOOD_KEY} AS record_key",
        f"{GOOD_VALUE} AS record_value",
    )
    bad = flagged.filter(F.col("_eo_error_class").isNotNull())
    return good, collect(bad, df, sink_kind, policy, pipeline, checkpoint_id, batch_id, committed)


def collect(
    bad,
    batch,
    sink_kind: str,
    policy: DeadLetterPolicy,
    pipeline: str,
    checkpoint_id: str,
    batch_id: int,
    committed: Offsets | None,
    extra: tuple[str, ...] = (),
) -> DeadLetters:
    """Return the letters of ``bad`` (the :func:`flag`-ged bad records of ``batch``), collected on the driver; past
    the policy's limit raise :class:`DeadLetterLimitError` (nothing written yet).

    :param extra: more columns of ``bad`` each letter keeps (not stored: e.g. its window, for the sink's count).
    """
    from pyspark.sql import functions as F

    count = bad.count()
    if not count:  # the usual batch: one Spark job over the cached batch, nothing to collect
        return DeadLetters(policy.store)
    total = batch.count() if policy.max_ratio is not None else None
    over_ratio = total is not None and count > policy.max_ratio * total
    if count > policy.max_letters or over_ratio:
        found = [
            (t, p, o, c, "")
            for t, p, o, c in bad.select("kafka_topic", "kafka_partition", "kafka_offset", "_eo_error_class")
            .orderBy("kafka_topic", "kafka_partition", "kafka_offset")
            .limit(5)
            .collect()
        ]
        limit = (
            f"{count} of its {total} records, more than max_dead_letter_ratio={policy.max_ratio}"
            if over_ratio
            else f"{count}, more than max_dead_letters={policy.max_letters}"
        )
        raise limit_error(found, limit, sink_kind, policy.store, batch_id, committed)
    now = datetime.datetime.now(datetime.UTC)
    rows = [
        {
            "pipeline": pipeline,
            "checkpoint_id": checkpoint_id,
            "batch_id": batch_id,
            "kafka_topic": r["kafka_topic"],
            "kafka_partition": r["kafka_partition"],
            "kafka_offset": r["kafka_offset"],
            "kafka_timestamp": _utc(r["ts_ms"]),
            "record_key": None if r["key"] is None else bytes(r["key"]),
            "record_value": None if r["value"] is None else bytes(r["value"]),
            "error_class": r["_eo_error_class"],
            "error_message": r["_eo_error_message"],
            "dead_lettered_at": now,
            **{c: r[c] for c in extra},
        }
        for r in bad.select(
            "kafka_topic",
            "kafka_partition",
            "kafka_offset",
            # epoch milliseconds: the session's time zone plays no part in the instant stored
            F.unix_millis("kafka_timestamp").alias("ts_ms"),
            "key",
            "value",
            "_eo_error_class",
            "_eo_error_message",
            *extra,
        )
        .orderBy("kafka_topic", "kafka_partition", "kafka_offset")
        .collect()
    ]
    return DeadLetters(policy.store, rows)


def _utc(millis: int | None) -> datetime.datetime | None:
    return None if millis is None else datetime.datetime.fromtimestamp(millis / 1000, datetime.UTC)


def limit_error(
    found: list[tuple], limit: str, sink_kind: str, store: str, batch_id: int, committed: Offsets | None
) -> DeadLetterLimitError:
    """Return the error that fails a batch holding more bad records than the policy allows (raise it)."""
    where = ", ".join(f"{t}/{p}@{o} ({c})" for t, p, o, c, _ in found)
    return DeadLetterLimitError(
        f"Batch {batch_id} holds bad records the {sink_kind} sink cannot store: {limit} "
        f"(on_bad_record='dead_letter'), e.g. at {where}. Nothing of this batch was committed, neither to the "
        f"sink nor to the dead-letter store {store}; the sink stays at offsets "
        f"{json.dumps(offsets_to_json(committed or {}))} and every rerun stops here. Fix the producer, or raise "
        "the limit to dead-letter them."
    )


def unheld(rows: list[dict], watermark: Offsets) -> list[dict]:
    """Return the letters at or past the store's watermark (the ones it does not hold yet)."""
    return [r for r in rows if r["kafka_offset"] >= watermark.get(r["kafka_topic"], {}).get(r["kafka_partition"], 0)]


def raised(watermark: Offsets, end: Offsets) -> Offsets:
    """Return the watermark moved to the batch's end where that is further (a watermark is never lowered)."""
    merged = {t: dict(parts) for t, parts in watermark.items()}
    for topic, parts in end.items():
        for partition, offset in parts.items():
            held = merged.setdefault(topic, {})
            held[partition] = max(held.get(partition, 0), offset)
    return merged


def insert_postgres(cur, table, letters: DeadLetters) -> int:
    """Insert the letters in the open transaction ``cur`` (the batch's); return how many.

    :param table: the store's ``psycopg2.sql`` identifier.
    """
    if not letters.rows:
        return 0
    import psycopg2
    from psycopg2 import sql
    from psycopg2.extras import execute_values

    binary = ("record_key", "record_value")
    values = [
        tuple(psycopg2.Binary(r[c]) if c in binary and r[c] is not None else r[c] for c in COLUMNS)
        for r in letters.rows
    ]
    statement = sql.SQL("INSERT INTO {} ({}) VALUES %s").format(table, sql.SQL(", ").join(map(sql.Identifier, COLUMNS)))
    execute_values(cur, statement.as_string(cur), values)
    return len(values)


def spark_frame(spark, rows: list[dict]):
    """Return the letters as a one-partition Spark DataFrame of :data:`SPARK_SCHEMA` (a Delta store's commit, a
    files sink's letters file): a batch's few letters in one file."""
    return spark.createDataFrame([tuple(r[c] for c in COLUMNS) for r in rows], SPARK_SCHEMA).coalesce(1)


@dataclass(frozen=True)
class ChangeKey:
    """Where a change record's value names its key and version (``cdc`` and ``current`` modes).

    :param parts: per key part, the JSON paths (each a tuple of field names) tried in order: the first present
        one is the part's value, as text (a JSON string's characters, any other value's JSON).
    :param version: the JSON path of the change's version (a whole number).
    """

    parts: tuple[tuple[tuple[str, ...], ...], ...]
    version: tuple[str, ...]

    @classmethod
    def cdc(cls, key_field: str, version_field: str) -> ChangeKey:
        """Return the key of the CDC mode's records: its ``key_field`` paths (comma-separated, dotted)."""
        paths = [p.strip() for p in key_field.split(",") if p.strip()]
        return cls(tuple((tuple(p.split(".")),) for p in paths), tuple(version_field.split(".")))

    @classmethod
    def current(cls, key: tuple[str, ...]) -> ChangeKey:
        """Return the key of the binlog capture's change records: the key columns of the ``after`` image, or
        of ``before`` (a delete)."""
        return cls(tuple((("after", k), ("before", k)) for k in key), ("version",))

    def columns(self, value: Any) -> tuple[list, Any]:
        """Return the Spark columns ``(key parts, version)`` over a record's value (a string column)."""
        from pyspark.sql import functions as F

        def at(path: tuple[str, ...]):
            return F.get_json_object(value, _json_path(path))

        parts = [F.coalesce(*[at(p) for p in alternatives]) for alternatives in self.parts]
        return parts, at(self.version).cast("bigint")

    def of_record(self, value: bytes | None) -> tuple[tuple[str, ...], int] | None:
        """Return ``(key, version)`` a letter's raw value names (undecodable bytes replaced), or None when it
        names no key or no whole-number version (such a letter holds nothing back)."""
        if value is None:
            return None
        try:
            record = json.loads(value.decode("utf-8", errors="replace"))
        except ValueError:
            return None
        parts = []
        for alternatives in self.parts:
            found = next((v for v in (json_at(record, p) for p in alternatives) if v is not None), None)
            if found is None:
                return None
            parts.append(_as_text(found))
        version = json_at(record, self.version)
        if isinstance(version, str) and version.lstrip("-").isdigit():
            version = int(version)
        if isinstance(version, bool) or not isinstance(version, int):
            return None
        return tuple(parts), version


def _json_path(path: tuple[str, ...]) -> str:
    """Return Spark's ``get_json_object`` path of the fields ``path`` (bracketed names: any column name)."""
    return "$" + "".join("['{}']".format(name.replace("\\", "\\\\").replace("'", "\\'")) for name in path)


def json_at(record: Any, path: tuple[str, ...]) -> Any:
    """Return the value at ``path`` (field names) of a parsed JSON record, None where there is none."""
    for name in path:
        if not isinstance(record, dict):
            return None
        record = record.get(name)
    return record


def _as_text(value: Any) -> str:
    """Return a JSON value as ``get_json_object`` gives it: a string's characters, else its compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def held_back(
    bad: dict[tuple[str, ...], tuple[int, int]], good: dict[tuple[str, ...], tuple[int, int]]
) -> set[tuple[str, ...]]:
    """Return the keys whose batch changes stay out of the table: those whose newest version in the batch is bad.

    :param bad: key -> the newest ``(version, offset)`` of its letters in the batch.
    :param good: key -> the newest ``(version, offset)`` of its good changes in the batch (keys of ``bad`` only).
    """
    return {key for key, newest in bad.items() if key not in good or newest > good[key]}


def hold_back(raw, good_df, letters: DeadLetters, change_key: ChangeKey):
    """Return ``(good records, keys held back)``: ``good_df`` without the records of keys whose newest version in
    this batch is a letter (:func:`held_back`); the keys in the letters' order, for the log.

    One small Spark job, only for a batch with letters: the good records of the letters' keys, read from the raw
    batch ``raw`` (:data:`RAW_SELECT` columns) with undecodable values as NULL, so no record can fail it (the good
    records' own decoding, ``validate_utf8``, may be evaluated before their filter); they are then left out of
    ``good_df`` by offset.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    bad: dict[tuple[str, ...], tuple[int, int]] = {}
    for row in letters.rows:
        found = change_key.of_record(row["record_value"])
        if found is not None:
            key, version = found
            bad[key] = max(bad.get(key, (version, row["kafka_offset"])), (version, row["kafka_offset"]))
    if not bad:
        return good_df, []
    spark = raw.sparkSession
    where = ["kafka_topic", "kafka_partition", "kafka_offset"]
    names = [f"_eo_key{i}" for i in range(len(change_key.parts))]
    parts, version = change_key.columns(F.try_validate_utf8(F.col("value").cast("string")))
    positions = StructType(
        [
            StructField("kafka_topic", StringType()),
            StructField("kafka_partition", IntegerType()),
            StructField("kafka_offset", LongType()),
        ]
    )
    dead = spark.createDataFrame([tuple(r[c] for c in where) for r in letters.rows], positions)
    wanted = spark.createDataFrame([list(k) for k in bad], StructType([StructField(n, StringType()) for n in names]))
    found = (
        raw.join(F.broadcast(dead), where, "left_anti")
        .select(*where, version.alias("_eo_version"), *[p.alias(n) for p, n in zip(parts, names, strict=True)])
        .join(F.broadcast(wanted), names)
        .collect()
    )
    good: dict[tuple[str, ...], tuple[int, int]] = {}
    for r in found:
        key = tuple(r[n] for n in names)
        if r["_eo_version"] is not None:
            good[key] = max(good.get(key, (r["_eo_version"], r["kafka_offset"])), (r["_eo_version"], r["kafka_offset"]))
    held = held_back(bad, good)
    if not held:
        return good_df, []
    drop = [tuple(r[c] for c in where) for r in found if tuple(r[n] for n in names) in held]
    if drop:
        good_df = good_df.join(F.broadcast(spark.createDataFrame(drop, positions)), where, "left_anti")
    return good_df, [k for k in bad if k in held]


def store_rows(
    kind: str,
    store: str,
    pipeline: str,
    columns: tuple[str, ...],
    pg_conn: Any = None,
    storage_options: dict | None = None,
) -> list[dict]:
    """Return ``columns`` of every open letter of ``pipeline`` in its store, as dicts ([] while there is no store yet).

    Read without the sink's bookkeeping: a PostgreSQL ``SELECT`` through ``pg_conn`` (its transaction rolled
    back), or the Delta table with delta-rs (a Delta store may hold letters of a batch the sink has not committed
    yet: the module docstring). The files sink's letters are in its manifest, not a store this reads.

    :param kind: ``postgres`` (``store`` is a table) or ``delta`` (``store`` is a location).
    """
    if kind == "postgres":
        from psycopg2 import sql

        with pg_conn.cursor() as cur:
            cur.execute("SELECT to_regclass(%s)", (store,))
            if cur.fetchone()[0] is None:
                pg_conn.rollback()
                return []
            # open letters only: a repaired one is closed (closed_at, added by the first repair: to_jsonb reads it
            # where it exists)
            cur.execute(
                sql.SQL("SELECT {} FROM {} AS s WHERE pipeline = %s AND (to_jsonb(s) ->> 'closed_at') IS NULL").format(
                    sql.SQL(", ").join(map(sql.Identifier, columns)), sql.Identifier(*store.split("."))
                ),
                (pipeline,),
            )
            rows = [
                {c: bytes(v) if isinstance(v, memoryview) else v for c, v in zip(columns, row, strict=True)}
                for row in cur.fetchall()
            ]
        pg_conn.rollback()
        return rows
    if kind != "delta":
        raise ValueError(f"a dead-letter store is a postgres table or a delta location, not {kind!r}.")
    import pyarrow.compute as pc
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(store.replace("s3a://", "s3://", 1), storage_options=storage_options)
    except TableNotFoundError:
        return []
    # filtered here: to_pyarrow_table(filters=[("pipeline", "=", ...)]) returned no rows (deltalake 1.6.6)
    found = table.to_pyarrow_table(columns=list(dict.fromkeys(("pipeline", *columns))))
    return found.filter(pc.equal(found["pipeline"], pipeline)).select(list(columns)).to_pylist()
