"""PostgreSQL sink: a batch's rows and its offsets rows are written in ONE database transaction.

The driver (inside ``foreachBatch``) pulls the batch as Arrow, streams it with ``COPY`` and upserts the
pipeline's rows of the offsets table, then commits. A transaction-scoped advisory lock on the pipeline
serialises writers, and the replay check runs inside the transaction after the lock, so a zombie driver that
wakes up after a newer one committed the same batch writes nothing. That step lives in ONE place,
:meth:`PostgresSink._batch_transaction`; ``commit`` (records, CDC) and ``commit_windows`` only write inside it.

Offsets table (one row per pipeline and Kafka partition)::

    eo_stream_offsets(pipeline text, topic text, kafka_partition int, next_offset bigint,
                      checkpoint_id text, batch_id bigint, rows_total bigint, committed_at timestamptz,
                      PRIMARY KEY (pipeline, topic, kafka_partition))

A writer that knows its topics (``topics``) reads its state from the rows of those topics only: the queries
of one Spark application (``routes``) share the pipeline, each into its own table from its own topics, and
each must see its own newest commit, not the one another query made a moment ago.

CDC mode (``mode="cdc"``) copies the batch's newest change per key into a temporary table and upserts it
into ``table`` (primary key ``pk``) only where the change's ``source_version`` is newer than the row's, in the
same transaction. Deletes are kept as tombstones (``deleted = true``) so an older change replayed after the
delete cannot bring the row back; readers filter ``NOT deleted``.

Dead letters (``dead_letter_store``; append, cdc and current modes): the batch's records the table cannot store go to the
store table in the SAME transaction, after the rows and before the offsets
(:mod:`exactly_once_provider.sinks.dead_letters`).

Current mode (``mode="current"``) keeps the typed current table of one source table, built on the Delta full
load and following its schema changes: :mod:`exactly_once_provider.sinks.postgres_current`.

Connection settings come from the libpq environment (``PGHOST``, ``PGPORT``, ``PGDATABASE``, ``PGUSER``,
``PGPASSWORD``) that the submit operator fills from the Airflow connection, so no credential is on a
command line or in a log line.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg2
from psycopg2 import sql

from exactly_once_provider import faults
from exactly_once_provider.sinks import current_table, dead_letters, poison, version_rule
from exactly_once_provider.sinks.base import (
    UNCHECKED,
    WINDOW_COLUMNS,
    BatchCommit,
    SchemaChange,
    replayed,
    require_newer_windows,
    require_predecessor,
)
from exactly_once_provider.sinks.postgres_current import CurrentTable

OFFSETS_TABLE = "eo_stream_offsets"
COLUMNS = ("kafka_topic", "kafka_partition", "kafka_offset", "record_key", "record_value")
CDC_COLUMNS = ("pk", "source_version", "deleted", "record_value", "kafka_topic", "kafka_partition", "kafka_offset")
WINDOWS_TABLE = "eo_stream_windows"

_DDL_OFFSETS = f"""
CREATE TABLE IF NOT EXISTS {OFFSETS_TABLE} (
    pipeline text NOT NULL, topic text NOT NULL, kafka_partition integer NOT NULL,
    next_offset bigint NOT NULL, checkpoint_id text NOT NULL, batch_id bigint NOT NULL,
    rows_total bigint NOT NULL, committed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, topic, kafka_partition))
"""
_DDL_WINDOWS = f"""
CREATE TABLE IF NOT EXISTS {WINDOWS_TABLE} (
    pipeline text NOT NULL, window_id text NOT NULL, version bigint NOT NULL, rows bigint NOT NULL,
    committed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (pipeline, window_id))
"""


@dataclass
class _Batch:
    """One batch's open transaction (see :meth:`PostgresSink._batch_transaction`)."""

    cur: Any
    done: bool  # the sink already holds this batch: write nothing
    rows_before: int  # the pipeline's rows_total before this batch
    rows_total: int | None = None  # set by the writer: the pipeline's rows_total after this batch


def upsert_newer_changes(cur, table: sql.Identifier, staged: sql.Identifier, returning: bool = False) -> list[str]:
    """Write the changes staged in ``staged`` (:data:`CDC_COLUMNS`, one per key) into the CDC table ``table``: a
    change replaces a key's row only if its ``source_version`` is newer. The stream's batches and the dead-letter
    repair both write through here.

    :param returning: return the keys written (a change older than its row is not); else [].
    """
    columns = sql.SQL(", ").join(map(sql.Identifier, CDC_COLUMNS))
    updates = sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in CDC_COLUMNS[1:])
    cur.execute(
        sql.SQL("INSERT INTO {t} ({c}) SELECT {c} FROM {s} ON CONFLICT (pk) DO UPDATE SET {u} WHERE {newer}").format(
            t=table, c=columns, s=staged, u=updates, newer=version_rule.postgres_condition(table, "source_version")
        )
        + (sql.SQL(" RETURNING {t}.pk").format(t=table) if returning else sql.SQL(""))
    )
    return [row[0] for row in cur.fetchall()] if returning else []


class PostgresSink:
    """Append a pipeline's batches to ``table`` with the offsets in the same transaction.

    :param table: target table, optionally ``schema.table``; created if missing.
    :param pipeline: the pipeline's stable name.
    :param connect_kwargs: psycopg2 connection arguments; empty = the libpq ``PG*`` environment (the job).
    :param mode: ``append`` (records), ``cdc`` (changes by ``pk``, newer ``source_version`` wins), ``current``
        (the typed current table: :mod:`~exactly_once_provider.sinks.postgres_current`) or ``window``
        (settlement windows replaced whole; versions in ``eo_stream_windows``, same transaction).
    :param conn_id: the Airflow connection ``connect_kwargs`` came from, named by :meth:`commit_location`.
    :param topics: the topics this writer reads (the job's query): its state is the pipeline's rows of these
        topics, so the queries of one application (routes, disjoint topics) each commit their own batches.
        Empty: every topic of the pipeline (a reader: the status page, the lag trigger).
    :param dead_letter_store: ``on_bad_record="dead_letter"`` (append, cdc, current): the dead-letter table
        (``schema.table`` allowed), created if missing; its letters commit in each batch's transaction.
    """

    kind = "postgres"
    # Current mode: the rows a schema change fills are updated in place (CurrentTable.apply), not merged.
    fills_in_place = True

    def __init__(
        self,
        table: str,
        pipeline: str,
        connect_kwargs: dict | None = None,
        mode: str = "append",
        conn_id: str | None = None,
        topics: Sequence[str] = (),
        dead_letter_store: str | None = None,
    ) -> None:
        self.table = sql.Identifier(*table.split("."))
        self.dead_letter_store = dead_letter_store
        self.pipeline = pipeline
        self.topics = list(topics)
        self.connect_kwargs = connect_kwargs or {}
        self.mode = mode
        self.columns = {"cdc": CDC_COLUMNS, "window": WINDOW_COLUMNS}.get(mode, COLUMNS)
        self.conn_id = conn_id
        self.current = CurrentTable(self.table, pipeline) if mode == "current" else None
        # Current mode: the full load the table builds on (builds_on).
        self.full_load: tuple[Any, Any, dict | None] | None = None

    def builds_on(self, handoff: Any, delta_location: str, storage_options: dict | None = None) -> None:
        """Name the full load the current table is built from (current mode; read by :meth:`prepare`).

        :param handoff: the full load's handoff (:func:`~exactly_once_provider.full_load.handoff.read_handoff`).
        :param delta_location: the Delta table it was published to (a location delta-rs opens).
        :param storage_options: delta-rs storage options (object storage).
        """
        self.full_load = (handoff, delta_location, storage_options)

    def commit_location(self) -> str:
        """Return the offsets table (and the connection) holding the commits."""
        return f"{OFFSETS_TABLE} ({self.conn_id})" if self.conn_id else OFFSETS_TABLE

    def prepare(self) -> None:
        """Create the table, the offsets table and (window mode) the windows table if missing; in current mode
        build the table from its full load unless it holds that load (one transaction, under the pipeline's lock)."""
        self.ensure_tables()
        if self.current is None:
            return
        if self.full_load is None:
            raise ValueError("mode='current' builds on a full load: call builds_on() before prepare().")
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                self._lock(cur)
                self.current.build(cur, *self.full_load, streamed=self._read_state(cur) is not None)
            conn.commit()
        finally:
            conn.close()

    def _connect(self):
        return psycopg2.connect(**self.connect_kwargs)

    def _lock(self, cur) -> None:
        """Take the pipeline's transaction-scoped advisory lock: one writer of its tables at a time."""
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"eo_stream:{self.pipeline}",))

    def ensure_tables(self) -> None:
        with self._connect() as conn, conn.cursor() as cur:
            cur.execute(_DDL_OFFSETS)
            if self.mode == "window":
                cur.execute(_DDL_WINDOWS)
                cur.execute(
                    sql.SQL(
                        "CREATE TABLE IF NOT EXISTS {} (window_id text NOT NULL, window_version bigint NOT NULL,"
                        " kafka_topic text NOT NULL, kafka_partition integer NOT NULL, kafka_offset bigint NOT NULL,"
                        " record_key text, record_value text)"
                    ).format(self.table)
                )
                index = sql.Identifier(f"{self.table.strings[-1]}_window_id_idx"[:63])
                cur.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (window_id)").format(index, self.table))
            elif self.mode == "current":
                CurrentTable.ensure_state_table(cur)
            elif self.mode == "cdc":
                cur.execute(
                    sql.SQL(
                        "CREATE TABLE IF NOT EXISTS {} (pk text PRIMARY KEY, source_version bigint NOT NULL,"
                        " deleted boolean NOT NULL, record_value text, kafka_topic text NOT NULL,"
                        " kafka_partition integer NOT NULL, kafka_offset bigint NOT NULL)"
                    ).format(self.table)
                )
            else:
                cur.execute(
                    sql.SQL(
                        "CREATE TABLE IF NOT EXISTS {} (kafka_topic text NOT NULL, kafka_partition integer NOT NULL,"
                        " kafka_offset bigint NOT NULL, record_key text, record_value text)"
                    ).format(self.table)
                )
            if self.dead_letter_store:
                cur.execute(sql.SQL(dead_letters.POSTGRES_DDL).format(self._store()))
                if self.mode == "window":  # each window's letters, counted with its version (tables of 0.x lack it)
                    cur.execute(
                        f"ALTER TABLE {WINDOWS_TABLE} ADD COLUMN IF NOT EXISTS dead_letters bigint NOT NULL DEFAULT 0"
                    )
        conn.close()

    def _read_state(self, cur) -> BatchCommit | None:
        """Return the pipeline's newest commit (of this writer's topics, when it names them)."""
        where, params = "pipeline = %s", [self.pipeline]
        if self.topics:
            where, params = f"{where} AND topic = ANY(%s)", [*params, self.topics]
        cur.execute(
            f"SELECT topic, kafka_partition, next_offset, checkpoint_id, batch_id, rows_total"
            f" FROM {OFFSETS_TABLE} WHERE {where} ORDER BY committed_at DESC, batch_id DESC",
            params,
        )
        rows = cur.fetchall()
        if not rows:
            return None
        offsets: dict[str, dict[int, int]] = {}
        for topic, partition, offset, *_ in rows:
            offsets.setdefault(topic, {})[partition] = offset
        # Rows of topics the pipeline no longer reads keep their old batch; the newest commit is the identity.
        _, _, _, checkpoint_id, batch_id, rows_total = rows[0]
        return BatchCommit(self.pipeline, checkpoint_id, batch_id, offsets, rows_total)

    def committed(self) -> BatchCommit | None:
        """Return the newest batch this pipeline committed (None before the first)."""
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT to_regclass(%s)", (OFFSETS_TABLE,))
                if cur.fetchone()[0] is None:
                    return None
                state = self._read_state(cur)
                if state is not None and self.current is not None:
                    schema = self.current.schema_state(cur)
                    if schema is not None:
                        state.extra["schema"] = schema
                cur.execute("SELECT to_regclass(%s)", (WINDOWS_TABLE,))
                if state is not None and cur.fetchone()[0] is not None:
                    # to_jsonb: the dead_letters column exists only where a pipeline dead-letters (NULL elsewhere)
                    cur.execute(
                        f"SELECT window_id, version, rows, (to_jsonb(w) ->> 'dead_letters')::bigint"
                        f" FROM {WINDOWS_TABLE} w WHERE pipeline = %s",
                        (self.pipeline,),
                    )
                    windows = {
                        w: {"version": v, "rows": n, **({"dead_letters": d} if d else {})}
                        for w, v, n, d in cur.fetchall()
                    }
                    if windows:
                        state.extra["windows"] = windows
                return state
        finally:
            conn.close()

    def _copy(self, cur, df) -> int:
        table = df.select(*self.columns).toArrow()
        if table.num_rows == 0:
            return 0
        self._refuse_nul(table)
        import pyarrow.csv as pacsv

        buffer = io.BytesIO()
        pacsv.write_csv(table, buffer, pacsv.WriteOptions(include_header=False))
        buffer.seek(0)
        target = self.table
        if self.mode == "cdc":
            target = sql.Identifier("eo_changes")
            cur.execute(sql.SQL("CREATE TEMP TABLE eo_changes (LIKE {}) ON COMMIT DROP").format(self.table))
        columns = sql.SQL(", ").join(map(sql.Identifier, self.columns))
        cur.copy_expert(
            sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT csv)").format(target, columns).as_string(cur), buffer
        )
        if self.mode == "cdc":
            upsert_newer_changes(cur, self.table, target)
        return table.num_rows

    def _refuse_nul(self, table) -> None:
        """PostgreSQL text cannot hold NUL: stop before the COPY, naming the records (nothing committed)."""
        import pyarrow.compute as pc

        for column in ("record_key", "record_value"):
            if column not in table.column_names:
                continue
            bad = table.filter(pc.fill_null(pc.match_substring(table[column], "\x00"), False))
            if bad.num_rows:
                found = [
                    (r["kafka_topic"], r["kafka_partition"], r["kafka_offset"], column, "")
                    for r in bad.slice(0, 5).to_pylist()
                ]
                state = self.committed()
                raise poison.refuse(
                    found,
                    "text with a NUL character (PostgreSQL text cannot store it)",
                    self.kind,
                    None,
                    state.offsets if state else None,
                )

    @contextmanager
    def _batch_transaction(self, commit: BatchCommit, expected: object = UNCHECKED) -> Iterator[_Batch]:
        """Open the ONE transaction of a batch: THE exactly-once step of this sink.

        Takes the pipeline's transaction-scoped advisory lock, then reads the committed state (after the lock,
        so a zombie writer sees the newer commit) and yields a :class:`_Batch`. A state that is not
        ``expected`` (the commit the batch was planned on) fails the batch before anything is written
        (:func:`~exactly_once_provider.sinks.base.require_predecessor`). If ``batch.done`` the batch is
        already committed: the body writes nothing and the transaction rolls back. Otherwise the body writes
        the rows with ``batch.cur`` and sets ``batch.rows_total``; on leaving, the offsets rows are written and
        data + offsets commit together. An exception rolls everything back.
        """
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                self._lock(cur)
                previous = self._read_state(cur)
                done = replayed(previous, commit)  # under the lock: no other driver commits in between
                if not done:
                    require_predecessor(previous, expected, commit, self.kind)
                batch = _Batch(cur, done, previous.rows_total if previous else 0)
                yield batch
                if done:
                    conn.rollback()
                    return
                if batch.rows_total is None:
                    raise RuntimeError("a batch transaction must set rows_total before it commits")
                self._write_offsets(cur, commit, batch.rows_total)
            conn.commit()
        finally:
            conn.close()

    def _store(self) -> sql.Identifier:
        return sql.Identifier(*self.dead_letter_store.split("."))

    def commit(
        self,
        df,
        commit: BatchCommit,
        expected: object = UNCHECKED,
        letters: dead_letters.DeadLetters | None = None,
        schema: SchemaChange | None = None,
    ) -> bool:
        """Write rows (+ dead letters) + offsets in one transaction; return False if the batch was already committed.

        :param expected: the sink's commit the batch was planned on; another one fails the batch.
        :param letters: the batch's dead letters (``on_bad_record="dead_letter"``), inserted into the
            ``dead_letter_store`` table in the same transaction; ``letters.written`` is set to their number.
        :param schema: current mode (required there): the columns the batch commits in; a schema change's new
            columns and fills are applied in the batch's transaction (:meth:`~.postgres_current.CurrentTable.apply`).
        """
        if self.current is not None:
            if schema is None:
                raise ValueError("A batch of the PostgreSQL current table needs its schema (SchemaChange).")
            return self._commit_current(df, commit, expected, schema, letters)
        with self._batch_transaction(commit, expected) as batch:
            if batch.done:
                return False
            batch.rows_total = batch.rows_before + self._copy(batch.cur, df)
            if letters is not None:
                letters.written = dead_letters.insert_postgres(batch.cur, self._store(), letters)
            # EO_FAULT_AT=sink_written_<batch>: rows (and letters) written in the open transaction, not committed
            faults.fault_point(f"sink_written_{commit.batch_id}")
        return True

    def _commit_current(
        self,
        df,
        commit: BatchCommit,
        expected: object,
        schema: SchemaChange,
        letters: dead_letters.DeadLetters | None = None,
    ) -> bool:
        # before the transaction: a batch that fails to plan has written nothing
        fills = list(schema.new_fills)
        changes = current_table.as_converted(df, fills).toArrow()
        with self._batch_transaction(commit, expected) as batch:
            if batch.done:
                return False
            written = self.current.apply(batch.cur, changes, schema.state, fills, schema.changed, self.full_load[0].key)
            batch.rows_total = batch.rows_before + written
            if letters is not None:
                letters.written = dead_letters.insert_postgres(batch.cur, self._store(), letters)
            # EO_FAULT_AT=sink_written_<batch>: changes (and letters) written in the open transaction, not committed
            faults.fault_point(f"sink_written_{commit.batch_id}")
        return True

    def _write_offsets(self, cur, commit: BatchCommit, rows_total: int) -> None:
        for topic, parts in commit.offsets.items():
            for partition, offset in parts.items():
                cur.execute(
                    f"INSERT INTO {OFFSETS_TABLE} (pipeline, topic, kafka_partition, next_offset,"
                    " checkpoint_id, batch_id, rows_total) VALUES (%s, %s, %s, %s, %s, %s, %s)"
                    " ON CONFLICT (pipeline, topic, kafka_partition) DO UPDATE SET"
                    " next_offset = EXCLUDED.next_offset, checkpoint_id = EXCLUDED.checkpoint_id,"
                    " batch_id = EXCLUDED.batch_id, rows_total = EXCLUDED.rows_total,"
                    " committed_at = now()",
                    (self.pipeline, topic, partition, offset, commit.checkpoint_id, commit.batch_id, rows_total),
                )

    def published_windows(self) -> dict[str, int]:
        """Return window id -> version published in the table (window mode)."""
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT window_id, version FROM {WINDOWS_TABLE} WHERE pipeline = %s", (self.pipeline,))
                return dict(cur.fetchall())
        finally:
            conn.close()

    def commit_windows(
        self,
        df,
        windows: dict[str, int],
        rows: dict[str, int],
        commit: BatchCommit,
        expected: object = UNCHECKED,
        letters: dead_letters.DeadLetters | None = None,
    ) -> bool:
        """Delete the rows of ``windows``, insert ``df``, record the versions and the offsets: ONE transaction.

        :param df: the rows of the published window versions (window-mode columns).
        :param windows: window id -> version published by this commit (may be empty: offsets only).
        :param rows: window id -> rows of that version.
        :param commit: the batch identity and the offsets the next read starts from.
        :param expected: the sink's commit the batch was planned on; another one fails the batch.
        :param letters: the published windows' dead letters (each with its ``window_id``): inserted into the
            store in the same transaction, and each window's count recorded with its version.
        :return: False if the batch was already committed.
        """
        counted = letters.by_window() if letters is not None else {}
        with self._batch_transaction(commit, expected) as batch:
            if batch.done:
                return False
            cur = batch.cur
            cur.execute(
                f"SELECT window_id, version FROM {WINDOWS_TABLE} WHERE pipeline = %s AND window_id = ANY(%s)",
                (self.pipeline, list(windows)),
            )
            require_newer_windows(windows, dict(cur.fetchall()))
            if windows:
                cur.execute(sql.SQL("DELETE FROM {} WHERE window_id = ANY(%s)").format(self.table), (list(windows),))
                self._copy(cur, df)
            for window, version in windows.items():
                cur.execute(
                    f"INSERT INTO {WINDOWS_TABLE} (pipeline, window_id, version, rows) VALUES (%s, %s, %s, %s)"
                    " ON CONFLICT (pipeline, window_id) DO UPDATE SET version = EXCLUDED.version,"
                    " rows = EXCLUDED.rows, committed_at = now()",
                    (self.pipeline, window, version, rows[window]),
                )
                if letters is not None:
                    cur.execute(
                        f"UPDATE {WINDOWS_TABLE} SET dead_letters = %s WHERE pipeline = %s AND window_id = %s",
                        (counted.get(window, 0), self.pipeline, window),
                    )
            if letters is not None:
                letters.written = dead_letters.insert_postgres(cur, self._store(), letters)
                # EO_FAULT_AT=sink_written_<batch>: windows and letters written in the open transaction
                faults.fault_point(f"sink_written_{commit.batch_id}")
            cur.execute(f"SELECT coalesce(sum(rows), 0) FROM {WINDOWS_TABLE} WHERE pipeline = %s", (self.pipeline,))
            batch.rows_total = int(cur.fetchone()[0])
        return True

    def append(self, df) -> None:
        """At-least-once baseline: the same COPY, committed without any offsets bookkeeping."""
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                self._copy(cur, df)
            conn.commit()
        finally:
            conn.close()
