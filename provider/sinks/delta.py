"""Delta Lake sink: each micro-batch is ONE Delta commit carrying its BatchCommit marker and Delta txn id.

Append mode commits through :func:`exactly_once_provider.sinks.delta_commit.append_with_marker` with
``txnAppId = "<pipeline>:<checkpoint id>"`` and ``txnVersion = <batch id>``: Spark writes the batch as Parquet
and this process commits those files through delta-rs (no Delta state reconstruction per batch); a replayed batch
is recognised by its txn and skipped, also when a zombie driver races the commit. ``commit_with="delta"`` (job
option ``--delta-commit delta``) commits through Delta's own writer instead
(:func:`~exactly_once_provider.sinks.delta_commit.commit_with_marker`, same txn id and marker), and so does a table
with a feature the own commit does not write (logged). The marker lives under the key
``eo_stream:<pipeline>`` in ``commitInfo.userMetadata``; it is read back without Spark.

CDC mode (``mode="cdc"``) keeps Delta's writer: it MERGEs each batch's newest change per key through
:func:`~exactly_once_provider.sinks.delta_commit.merge_with_marker` (same txn id and marker): a change applies only
if its ``source_version`` is newer than the row's. Deletes are kept as tombstones (``deleted = true``) so an
older change replayed after the delete cannot bring the row back; readers filter ``NOT deleted``.

Current mode (``mode="current"``, :mod:`~exactly_once_provider.sinks.current_table`) MERGEs each batch's newest
change per key into the full load's own table, typed like its rows, on the source key: a change applies only if
its ``_eo_version`` is newer than the row's; deletes are tombstones (``_eo_deleted``). Same txn id and marker.
The provider rewrites the files and delta-rs commits them (:func:`~exactly_once_provider.sinks.delta_merge.merge_newer`:
only the files holding a batch's keys rewritten, no Delta state reconstruction); Delta's MERGE writes it with
``commit_with="delta"`` and for the batch that evolves the table's schema. The batch after a followed
widening (``INT`` -> ``BIGINT``, a larger ``DECIMAL``, ``FLOAT`` -> ``DOUBLE``, key columns included) rewrites the
table in the wider types in its one commit (:func:`~exactly_once_provider.sinks.delta_merge.merge_widening`), or,
on a table with ``delta.enableTypeWidening``, widens in Delta's MERGE without rewriting (docs/schema-changes.md).

Window mode (``mode="window"``, :mod:`~exactly_once_provider.spark_jobs.settlement`) keeps Delta's writer too: it
replaces the rows of the
published windows with ``replaceWhere window_id IN (...)`` in the same single commit (same txn id); the
marker carries the cumulative ``windows`` map (window id -> version, rows) the version check reads.

Dead letters (``dead_letter_store``; append, cdc and current modes): the batch's records the table cannot store go to a Delta
table next to it, committed BEFORE the sink's commit under an offset watermark, so a replay writes them neither
twice nor never (the order and the fence: :mod:`exactly_once_provider.sinks.dead_letters`).

The marker also carries ``rows_before`` (this pipeline's rows before the commit), so :meth:`committed`
reads ONE commit file (the newest with the marker) instead of summing the whole log.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

from exactly_once_provider import faults
from exactly_once_provider.sinks import current_table, dead_letters, delta_commit, delta_log, delta_merge, version_rule
from exactly_once_provider.sinks.base import (
    UNCHECKED,
    BatchCommit,
    SchemaChange,
    StaleBatchError,
    require_newer_windows,
    require_predecessor,
)


def _sql_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _output_rows(info: dict) -> int:
    # A MERGE counts its changes (Delta's, and the own rewrite's that delta-rs records as a WRITE), a write its rows.
    metrics = info.get("operationMetrics", {})
    return int(metrics.get("numSourceRows", metrics.get("numOutputRows", 0)))


class DeltaSink:
    """Append a pipeline's batches to the Delta table at ``path``.

    :param path: the Delta table's location: a local path, ``file://``, or ``s3://``/``s3a://`` (the log read and
        the commits written through the storage layer, the rows by Spark through s3a).
    :param pipeline: the pipeline's stable name.
    :param mode: ``append`` (records) or ``cdc`` (changes by ``pk``, newer ``source_version`` wins).
    :param commit_with: append mode: ``own`` (the provider writes the Delta commit) or ``delta`` (Delta's writer).
    :param key: ``current`` mode: the source table's primary key columns.
    :param s3: an ``s3://`` path: its :class:`~exactly_once_provider.storage.s3.S3Settings` (default: those the
        process registered, as a Spark driver does from its secrets file).
    :param dead_letter_store: ``on_bad_record="dead_letter"`` (append, cdc, current): the dead-letter Delta table's
        location (next to the sink), committed before each batch's sink commit.
    """

    kind = "delta"
    # Current mode: the rows a schema change fills are merged with the batch (CurrentChanges adds them).
    fills_in_place = False

    def __init__(
        self,
        path: str,
        pipeline: str,
        mode: str = "append",
        commit_with: str = "own",
        key: tuple[str, ...] = (),
        s3: object = None,
        dead_letter_store: str | None = None,
    ) -> None:
        if commit_with not in ("own", "delta"):
            raise ValueError(f"commit_with must be 'own' or 'delta', got {commit_with!r}.")
        if mode == "current" and not key:
            raise ValueError("mode='current' needs the source table's key columns.")
        self.key_columns = tuple(key)
        self.path = path
        # what every log read and commit goes through: the location (the process's settings) or its storage
        self.table = path
        if s3 is not None:
            from exactly_once_provider.storage import open_storage

            self.table = open_storage(path, s3)
        self.pipeline = pipeline
        self.mode = mode
        self.commit_with = commit_with
        # the store is a Delta table with a marker of its own (its watermark): a sink of this class
        self.letter_store = DeltaSink(dead_letter_store, pipeline, s3=s3) if dead_letter_store else None
        self.key = f"eo_stream:{pipeline}"

    def _latest(self) -> tuple[dict, dict, int] | None:
        """Return ``(marker body, commitInfo, table version)`` of the newest commit with this pipeline's marker."""
        for version, actions in delta_commit.commits(self.table):
            info = actions.get("commitInfo", {})
            raw = info.get("userMetadata")
            if raw:
                marker = json.loads(raw)
                if isinstance(marker, dict) and self.key in marker:
                    return marker[self.key], info, version
        return None

    def _full_load_pointer(self) -> dict:
        """Return the pointer to the table's newest full-load commit, reading only the commits since this
        pipeline's last one (which carries the pointer it built on); the first commit scans back once."""
        found = self._latest()
        held = found[0].get(current_table.POINTER) if found else None
        for version, actions in delta_commit.commits(self.table):
            if held is not None and version <= found[2]:
                return held
            raw = actions.get("commitInfo", {}).get("userMetadata")
            marker = json.loads(raw) if raw else None
            if isinstance(marker, dict) and current_table.FULL_LOAD_MARKER in marker:
                return current_table.full_load_pointer(version, marker)
        raise delta_commit.CommitMarkerError(
            f"{self.path} has no full-load commit: the current table is created by the full load; run it first."
        )

    def _widened(self, df) -> dict[str, tuple[str, str]]:
        """Return the columns the batch holds in a wider type than the table (a followed widening ``ALTER``)."""
        state = delta_log.table_state(self.table)
        return delta_merge.widened_columns(json.loads(state.metadata["schemaString"]), df.schema) if state else {}

    def commit_location(self) -> str:
        """Return ``Delta version <n>`` of the newest commit carrying this pipeline's marker ("" before it)."""
        found = self._latest()
        return f"Delta version {found[2]}" if found else ""

    def prepare(self) -> None:
        """Nothing to prepare: the first commit creates the table."""

    def committed(self) -> BatchCommit | None:
        """Return the newest batch this pipeline committed, with ``rows_total`` (read from one commit)."""
        found = self._latest()
        if found is None:
            return None
        body, info, _ = found
        if "windows" in body:  # window mode: the marker holds the table's state
            return BatchCommit.from_json(body)
        if "rows_before" in body:
            rows = int(body["rows_before"]) + int(body.get("rows_merged", _output_rows(info)))
        else:  # markers written before rows_before existed: sum the log once
            rows = 0
            for _, actions in delta_commit.commits(self.table):
                raw = actions.get("commitInfo", {}).get("userMetadata")
                if raw and self.key in json.loads(raw):
                    rows += _output_rows(actions["commitInfo"])
        extra = {k: v for k, v in body.items() if k not in ("rows_before", "rows_merged")}
        return BatchCommit.from_json(dict(extra, rows_total=rows))

    def published_windows(self) -> dict[str, int]:
        """Return window id -> version published in the table (window mode)."""
        found = self._latest()
        windows = found[0].get("windows", {}) if found else {}
        return {w: int(v["version"]) for w, v in windows.items()}

    def _planned_on(self, commit: BatchCommit, expected: object) -> tuple[BatchCommit | None, tuple[str, int]]:
        """Return the pipeline's newest commit, failing unless it is ``expected``, and the fence for the commit.

        The fence is ``(marker key, the table version read before that check)``: the own append commit
        re-checks every commit after it up to the one it commits (:func:`delta_commit.append_with_files`), so
        a commit of this pipeline by another driver in between fails this one. Delta's own writer (MERGE,
        window replace, tables the own commit does not write) gets the check before the write only; MERGE by
        source version and the window replace rewrite the same rows if a zombie commits them again.
        """
        read_version = delta_commit.newest_version(self.table)
        previous = self.committed()
        require_predecessor(previous, expected, commit, self.kind)
        return previous, (self.key, read_version)

    @contextmanager
    def _fenced(self, commit: BatchCommit) -> Iterator[None]:
        """Turn a commit of this pipeline by another driver, found at the own commit's put, into a stale batch."""
        try:
            yield
        except delta_commit.ForeignProgressError as err:
            raise StaleBatchError(
                f"{err} Batch {commit.batch_id} of checkpoint {commit.checkpoint_id} (pipeline "
                f"{self.pipeline!r}) was not committed and the sink is exact as it is; stop the other "
                "driver (a zombie of an earlier run, or two jobs on one pipeline)."
            ) from None

    def commit(
        self,
        df,
        commit: BatchCommit,
        expected: object = UNCHECKED,
        letters: dead_letters.DeadLetters | None = None,
        schema: SchemaChange | None = None,
    ) -> bool:
        """Write the batch and its marker in one Delta commit; return False if it was already committed.

        A replay is recognised by the Delta txn ``(app id, batch id)`` (:func:`~.base.replayed`'s rule as Delta
        enforces it), here and again by Delta's writer / the own commit on the snapshot it commits on.

        :param expected: the sink's commit the batch was planned on; another one fails the batch.
        :param letters: the batch's dead letters (``on_bad_record="dead_letter"``): committed to the
            ``dead_letter_store`` table first (:meth:`_commit_letters`); ``letters.written`` is set to the
            number that commit added.
        :param schema: current mode: the columns the commit records in its marker; a batch that follows a schema
            change evolves the table in its one commit, and carries the older rows its fills change (re-applied
            at an equal version).
        """
        app_id = f"{self.pipeline}:{commit.checkpoint_id}"
        if delta_commit.find_commit(self.table, app_id, commit.batch_id) is not None:
            return False
        previous, fence = self._planned_on(commit, expected)
        if letters is not None:
            letters.written = self._commit_letters(df.sparkSession, letters, commit)
            # EO_FAULT_AT=sink_written_<batch>: the letters committed, the sink's commit not yet
            faults.fault_point(f"sink_written_{commit.batch_id}")
        marker = {self.key: dict(commit.to_json(), rows_before=previous.rows_total if previous else 0)}
        fence = None if expected is UNCHECKED else fence
        if self.mode == "append" and self.commit_with == "own":
            with self._fenced(commit):
                delta_commit.append_with_marker(df, self.table, marker, app_id, commit.batch_id, fence=fence)
            return True
        if self.mode == "append":
            delta_commit.commit_with_marker(df, self.table, marker, app_id, commit.batch_id, mode="append")
            return True
        if self.mode == "current":  # the full load created the table; a change merges only if it is newer
            marker[self.key][current_table.POINTER] = self._full_load_pointer()
            if schema is not None:
                marker[self.key]["schema"] = schema.state
            changed, fills = (schema.changed, list(schema.new_fills)) if schema is not None else (False, [])
            on, newer = current_table.merge_condition(self.key_columns, replace_equal=bool(fills))
            df = current_table.as_converted(df, fills)
            widened = self._widened(df) if changed else {}
            if widened and not delta_merge.widens_in_place(delta_log.table_state(self.table), widened):
                # Delta's MERGE would cast the batch to the old types: the table is rewritten in the wider ones
                # (the new schema, every row and the offsets in one commit), and the marker counts the batch's
                # changes (the overwrite's metrics count every row of the table).
                df = df.persist()
                try:
                    marker[self.key]["rows_merged"] = df.count()
                    faults.fault_point("current_schema_changed")  # EO_FAULT_AT=current_schema_changed[:n]
                    delta_merge.merge_widening(
                        df,
                        self.table,
                        self.key_columns,
                        marker,
                        app_id,
                        commit.batch_id,
                        replace_equal=bool(fills),
                    )
                finally:
                    df.unpersist()
                return True
            if changed:  # the new columns and the filled rows land in this one commit, or nothing
                faults.fault_point("current_schema_changed")  # EO_FAULT_AT=current_schema_changed[:n]
            if self.commit_with == "own" and not changed:
                with self._fenced(commit):
                    delta_merge.merge_newer(
                        df,
                        self.table,
                        self.key_columns,
                        marker,
                        app_id,
                        commit.batch_id,
                        replace_equal=bool(fills),
                        fence=fence,
                    )
            else:  # Delta's MERGE: the table's schema evolves in the same commit
                delta_commit.merge_with_marker(
                    df,
                    self.table,
                    on,
                    marker,
                    app_id,
                    commit.batch_id,
                    update_when=newer,
                    evolve_schema=changed,
                )
            return True
        if next(delta_commit.commits(self.table), None) is None:
            # MERGE needs a table: create it empty (no marker; a crash here is harmless, the next try reuses it).
            df.limit(0).write.format("delta").mode("append").save(delta_commit.spark_path(self.table))
        delta_commit.merge_with_marker(
            df,
            self.table,
            "t.pk = s.pk",
            marker,
            app_id,
            commit.batch_id,
            update_when=version_rule.sql_condition("source_version"),
        )
        return True

    def _commit_letters(
        self, spark, letters: dead_letters.DeadLetters, commit: BatchCommit, by_offset: bool = False
    ) -> int:
        """Commit the letters the store does not hold yet, raising its watermark to the batch's end; return
        how many (0: the store holds them all, e.g. a replay after a crash between the two commits).

        ``by_offset`` (window mode, whose read can start before letters it committed): the letters the store
        holds are read from the store instead of judged by the watermark; the store's commit is fenced on the
        store commit read before (a later one, another driver's, fails it).

        The store's own commit: txn ``<pipeline>:<checkpoint id>`` / batch id like the sink's, its marker's
        offsets the watermark, fenced on the store's newest commit read here (a zombie's concurrent store commit
        fails this batch; see :mod:`~exactly_once_provider.sinks.dead_letters`).
        """
        store = self.letter_store
        if store is None:
            raise ValueError("letters to commit, but the Delta sink was opened without a dead_letter_store.")
        held = store.committed()
        watermark = held.offsets if held else {}
        if by_offset:
            fresh = self._not_in_store(spark, letters.rows, held)
        else:
            fresh = dead_letters.unheld(letters.rows, watermark)
        if not fresh:  # every letter of the batch is below the watermark: held already (or the batch has none)
            return 0
        mark = BatchCommit(
            self.pipeline, commit.checkpoint_id, commit.batch_id, dead_letters.raised(watermark, commit.offsets)
        )
        if not store.commit(dead_letters.spark_frame(spark, fresh), mark, expected=held):
            raise delta_commit.CommitMarkerError(
                f"The dead-letter store {store.path} holds the txn of batch {commit.batch_id} of checkpoint "
                f"{commit.checkpoint_id} but its watermark {watermark} is below letters of that batch."
            )
        return len(fresh)

    def _not_in_store(self, spark, rows: list[dict], held: BatchCommit | None) -> list[dict]:
        """Return the letters of ``rows`` the store does not hold (by pipeline, topic, partition, offset)."""
        if held is None or not rows:
            return list(rows)
        from pyspark.sql import functions as F

        where = ("kafka_topic", "kafka_partition", "kafka_offset")
        found = (
            spark.read.format("delta")
            .load(delta_commit.spark_path(self.letter_store.table))
            .where((F.col("pipeline") == self.pipeline) & F.col("kafka_offset").isin([r["kafka_offset"] for r in rows]))
            .select(*where)
            .collect()
        )
        stored = {tuple(r) for r in found}
        return [r for r in rows if tuple(r[c] for c in where) not in stored]

    def commit_windows(
        self,
        df,
        windows: dict[str, int],
        rows: dict[str, int],
        commit: BatchCommit,
        expected: object = UNCHECKED,
        letters: dead_letters.DeadLetters | None = None,
    ) -> bool:
        """Replace the rows of ``windows`` by ``df`` and commit the offsets in ONE Delta commit.

        :param df: the rows of the published window versions (window-mode columns).
        :param windows: window id -> version published by this commit (may be empty: offsets only).
        :param rows: window id -> rows of that version.
        :param commit: the batch identity and the offsets the next read starts from.
        :param expected: the sink's commit the batch was planned on; another one fails the batch.
        :param letters: the published windows' dead letters (each with its ``window_id``): committed to the store
            first (those it does not hold by offset: :meth:`_commit_letters`), each window's count recorded in its
            state (``dead_letters``).
        :return: False if the batch was already committed.
        """
        app_id = f"{self.pipeline}:{commit.checkpoint_id}"
        if delta_commit.find_commit(self.table, app_id, commit.batch_id) is not None:
            return False
        previous, _ = self._planned_on(commit, expected)  # window mode: its marker holds the table's windows
        counted = letters.by_window() if letters is not None else {}
        if letters is not None:
            letters.written = self._commit_letters(df.sparkSession, letters, commit, by_offset=True)
            # EO_FAULT_AT=sink_written_<batch>: the letters committed, the sink's commit not yet
            faults.fault_point(f"sink_written_{commit.batch_id}")
        state = dict(previous.extra.get("windows", {})) if previous else {}
        require_newer_windows(windows, {w: int(v["version"]) for w, v in state.items()})
        for window, version in windows.items():
            state[window] = {"version": version, "rows": rows[window]}
            if counted.get(window):
                state[window]["dead_letters"] = counted[window]
        body = dict(commit.to_json(), rows_total=sum(w["rows"] for w in state.values()), windows=state)
        marker = {self.key: body}
        if windows:
            where = "window_id IN ({})".format(", ".join(_sql_string(w) for w in sorted(windows)))
            delta_commit.commit_with_marker(
                df, self.table, marker, app_id, commit.batch_id, mode="overwrite", replace_where=where
            )
        else:  # nothing to publish, the offsets move on (e.g. past stale versions): an empty commit
            delta_commit.commit_with_marker(df.limit(0), self.table, marker, app_id, commit.batch_id, mode="append")
        return True

    def append(self, df) -> None:
        """At-least-once baseline: a plain Delta append, no marker, no txn id."""
        df.write.format("delta").mode("append").save(delta_commit.spark_path(self.table))
