"""The Kafka -> sink job with ``--sink iceberg``, run in the session's Spark (no spark-submit).

Append mode: the checkpoint is lost between two runs; the second starts from the offsets in the table's newest
snapshot summary. Window mode: WatermarkExtractOperator publishes two settlement windows of a MariaDB table,
then a re-extracted v2 of the first; the job (tiny micro-batches, so a window is cut by a read) must leave one copy of each window at its
newest version, equal to the source table row by row, read by DuckDB's Iceberg reader and pyiceberg's scan. A
second re-extraction replaces only its window; a rerun with nothing new changes nothing. The append mode's
kills go through spark-submit in tests/faults/test_iceberg_kill.py.
"""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from collections import Counter
from dataclasses import replace

import pytest

from exactly_once_provider.sinks.iceberg import IcebergSink, catalog_settings
from tests import spark_job_support as jobs
from tests.integration.provider.sinks.test_iceberg import read_both
from tests.integration.spark_jobs.test_kafka_to_sink_window import Source, assert_windows, run_job
from tests.kafka_support import new_topic

WINDOW_READ = ("window_id", "window_version", "kafka_partition", "kafka_offset", "record_value")


def iceberg_args(stack, pipeline: str, topic: str, checkpoint, table: str, location: str, s3=None, **kwargs) -> list:
    """The job's arguments for the Iceberg sink: the catalog's settings join the 0600 secrets file."""
    args = jobs.job_args(
        stack, pipeline, topic, checkpoint, "iceberg", location, s3=s3.to_json() if s3 else None, **kwargs
    )
    secrets_file = args[args.index("--secrets-file") + 1]
    with open(secrets_file) as handle:
        secrets = json.load(handle)
    secrets["iceberg"] = catalog_settings("postgres_default")  # the catalog over TLS, as an operator passes it
    with open(secrets_file, "w") as handle:  # the file keeps its 0600 mode
        json.dump(secrets, handle)
    return [*args, "--table", table]


def drop(sink: IcebergSink) -> None:
    """Drop the test's table and its namespace from the catalog."""
    catalog = sink.catalog()
    if catalog.table_exists(sink.identifier):
        catalog.drop_table(sink.identifier)
    catalog.drop_namespace(sink.identifier.rsplit(".", 1)[0])


def test_window_versions_replace_whole_windows_in_an_iceberg_table(
    stack, airflow_connections, spark, tmp_path, capsys, caplog
):
    caplog.set_level(logging.INFO, logger="exactly_once_provider.kafka_to_sink")
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap, partitions=2)
    source = Source(stack, topic, f"ledger-{uuid.uuid4().hex[:8]}")
    pipeline, table = f"win-iceberg-{topic}", f"it_iceberg_{uuid.uuid4().hex[:10]}.settled"
    location = str(tmp_path / "settled")
    args = iceberg_args(stack, pipeline, topic, tmp_path / "checkpoint", table, location, max_offsets=10, mode="window")
    sink = IcebergSink(table, pipeline, catalog_settings("postgres_default"), location)
    try:
        source.insert("d1", 6)
        source.extract("d1")
        source.insert("d2", 4)
        source.extract("d2")
        source.update("d1", 2)  # the source changed after the settlement: re-extract d1 as v2
        assert source.extract("d1", reextract=True)["batch_version"] == 2
        w1, w2 = f"settle/{source.table}/d1", f"settle/{source.table}/d2"
        jobs.wait_for_committed_end(bootstrap, topic, 2)

        state = run_job(args, capsys)
        assert "incomplete in this read" in caplog.text, "max offsets per trigger should cut a batch"
        assert {w: (v["version"], v["rows"]) for w, v in state["windows"].items()} == {w1: (2, 6), w2: (1, 4)}
        assert state["rows_total"] == 10
        assert state["offsets"] == {topic: {str(p): o for p, o in jobs.end_offsets(bootstrap, topic, 2).items()}}
        assert_windows(read_both(sink, columns=WINDOW_READ), source.rows(), {w1: 2, w2: 1})

        source.update("d2", 3)  # d2 re-extracted: only it is replaced
        assert source.extract("d2", reextract=True)["batch_version"] == 2
        jobs.wait_for_committed_end(bootstrap, topic, 2)
        state2 = run_job(args, capsys)
        assert {w: v["version"] for w, v in state2["windows"].items()} == {w1: 2, w2: 2}
        assert_windows(read_both(sink, columns=WINDOW_READ), source.rows(), {w1: 2, w2: 2})

        assert run_job(args, capsys) == state2  # nothing new: a rerun changes nothing
        assert sink.committed().to_json() == state2
    finally:
        drop(sink)


def test_append_resumes_from_the_tables_offsets_after_a_lost_checkpoint(
    stack, airflow_connections, spark, tmp_path, caplog
):
    """Append mode: the checkpoint is deleted between two runs; the second run starts from the offsets in the newest
    snapshot's summary, and the table holds every committed record once (read by both readers)."""
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap, partitions=2)
    pipeline, table = f"it-iceberg-{topic}", f"it_iceberg_{uuid.uuid4().hex[:10]}.records"
    location, checkpoint = str(tmp_path / "records"), tmp_path / "checkpoint"
    args = iceberg_args(stack, pipeline, topic, checkpoint, table, location, max_offsets=60)
    sink = IcebergSink(table, pipeline, catalog_settings("postgres_default"), location)
    try:
        committed = jobs.produce_interleaved(bootstrap, topic, transactions=4, per_transaction=30, partitions=2)
        state, _ = jobs.run_in_session(args, caplog)
        assert state["batch_id"] >= 1 and state["rows_total"] == len(committed)

        shutil.rmtree(checkpoint)
        committed += jobs.produce_interleaved(
            bootstrap, topic, transactions=3, per_transaction=30, partitions=2, tag="s"
        )
        state2, logged = jobs.run_in_session(args, caplog)
        assert "starting from the sink's committed offsets" in logged
        assert state2["checkpoint_id"] != state["checkpoint_id"]
        assert state2["offsets"] == {topic: {str(p): o for p, o in jobs.end_offsets(bootstrap, topic, 2).items()}}
        assert state2["rows_total"] == len(committed)
        jobs.assert_exactly(read_both(sink), committed)
    finally:
        drop(sink)


CURRENT_ROWS = 120


@pytest.mark.parametrize("where", ["local", "s3"])
def test_the_iceberg_current_table_is_built_from_the_full_load_and_follows_every_change(
    stack, spark, airflow_connections, tmp_path, caplog, monkeypatch, where
):
    """mode="current": the table is built from the Delta full load in one snapshot (locally: after a crash between
    the build's files and its snapshot), then every change of every
    column type (updates, deletes as tombstones, inserts, a key change, a delete then re-insert of one key) merges in
    by key, in several micro-batches and two runs; both readers equal the source row by row, each key once. A rerun
    with nothing new (locally: its checkpoint lost) commits nothing, and the build is not repeated; a full reload
    (locally) builds the table again from the new load, the stream going on from its offsets. A schema change (not followed yet) fails its
    batch with nothing committed."""
    from exactly_once_provider.full_load.job import FullLoadRequest, run_full_load
    from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
    from exactly_once_provider.operators.binlog_capture import BinlogCaptureOperator
    from exactly_once_provider.operators.reconcile import ReconcileOperator
    from exactly_once_provider.sinks.current_table import DELETED_COLUMN
    from exactly_once_provider.sinks.iceberg_current import current_location
    from exactly_once_provider.storage import open_storage
    from exactly_once_provider.storage.s3 import register_settings, registered_settings
    from tests.integration.spark_jobs.test_kafka_to_sink_current import _change_the_source
    from tests.mysql_support import (
        ALL_TYPES,
        ALL_TYPES_COLUMNS,
        all_types_rows,
        assert_same_rows,
        connect,
        normalise,
        source_rows,
        unique_name,
    )

    source, pipeline = unique_name("icecur"), unique_name("icecur")
    table = f"it_iceberg_{uuid.uuid4().hex[:10]}.{source.lower()}"
    s3, before = (stack.minio_settings() if where == "s3" else None), registered_settings()
    if s3 is not None:  # the full load and the table on MinIO (the full load stages locally)
        register_settings(s3)
        prefix = f"s3://{stack.MINIO_BUCKETS[0]}/it-iceberg-current/{uuid.uuid4().hex}"
        path, checkpoint = f"{prefix}/current", f"{prefix}/checkpoint"
    else:
        path, checkpoint = str(tmp_path / "current"), tmp_path / "checkpoint"
    conn = connect(stack)
    cur = conn.cursor()
    sink = IcebergSink(table, f"{pipeline}-ice", catalog_settings("postgres_default"), s3=s3)
    try:
        cur.execute(f"CREATE TABLE `{source}` {ALL_TYPES}")
        cur.executemany(f"INSERT INTO `{source}` VALUES (" + ", ".join(["%s"] * 20) + ")", all_types_rows(CURRENT_ROWS))
        request = FullLoadRequest(
            schema=stack.DB_NAME, table=source, sink_path=path, staging_path=str(tmp_path / "staging")
        )
        run_full_load(spark, MySqlSourceHook(), request)

        def capture() -> str:
            operator = BinlogCaptureOperator(
                task_id="capture", tables=[source], pipeline=pipeline, full_load_paths={source: path}
            )
            return operator.execute({})["topics"][f"{stack.DB_NAME}.{source}"]

        def assert_current() -> None:
            columns = (*ALL_TYPES_COLUMNS, DELETED_COLUMN)
            rows = read_both(sink, s3, columns)
            assert len({r[0] for r in rows}) == len(rows), "a key is in the Iceberg current table twice"
            live = Counter(tuple(normalise(v) for v in r[:-1]) for r in rows if not r[-1])
            assert_same_rows(live, source_rows(stack, source, ALL_TYPES_COLUMNS), ALL_TYPES_COLUMNS)

        topic = capture()  # nothing changed yet: the first run only builds the table
        args = iceberg_args(
            stack, f"{pipeline}-ice", topic, checkpoint, table, path, s3, max_offsets=60, mode="current"
        )
        if where == "local":  # a crash between the build's files and its snapshot (as a SIGKILL there leaves it)
            from exactly_once_provider import faults

            def crash(step: str) -> None:
                if step == "iceberg_current_built":
                    raise RuntimeError("crashed after the build's files were written")

            monkeypatch.setattr(faults, "fault_point", crash)
            with pytest.raises(RuntimeError, match="crashed after the build"):
                jobs.run_in_session(args, caplog)
            monkeypatch.undo()
            assert sink.commit_location() == "", "no snapshot lists the crashed build's files"
        state, logged = jobs.run_in_session(args, caplog)
        assert "built from full load" in logged
        assert sink.catalog().load_table(table).location() == (
            current_location(path) if s3 else "file://" + current_location(path)
        )
        assert_current()

        _change_the_source(cur, source)
        capture()
        jobs.wait_for_committed_end(f"{stack.HOST}:{stack.KAFKA_PORT}", topic, 1)
        state, logged = jobs.run_in_session(args, caplog)
        assert state["batch_id"] >= 2, "the changes should take several micro-batches"
        assert "built from full load" not in logged, "a restarted job built the table again"
        end = jobs.end_offsets(f"{stack.HOST}:{stack.KAFKA_PORT}", topic, 1)
        assert state["offsets"] == {topic: {str(p): o for p, o in end.items()}}
        assert_current()
        deleted = sink.catalog().load_table(table).scan(row_filter=f"{DELETED_COLUMN} = true").to_arrow()
        assert set(deleted.column("id").to_pylist()) == set(range(51, 81)) | {100}
        # the reconciliation reads the table with pyiceberg (tombstones out) and finds it equal to the source
        reconciled = ReconcileOperator(
            task_id="reconcile",
            name=f"{pipeline}-ice",
            table=f"{stack.DB_NAME}.{source}",
            sink="iceberg",
            sink_table=table,
            sink_path=current_location(path),
            sink_deleted_column=DELETED_COLUMN,
            columns=[c for c in ALL_TYPES_COLUMNS if c not in ("t", "j", "f", "db")],  # TIME, ...: no canonical text
            store_result=False,
        ).execute({})
        assert reconciled["clean"] and reconciled["source_rows"] == len(source_rows(stack, source, ("id",)))
        snapshot = sink.commit_location()
        if where == "local":  # a lost checkpoint: the rerun starts from the offsets in the newest snapshot summary
            shutil.rmtree(checkpoint)
        rerun, logged = jobs.run_in_session(args, caplog)
        assert rerun == state  # nothing new: nothing committed
        assert sink.commit_location() == snapshot
        if where == "local":
            assert "starting from the sink's committed offsets" in logged
        if where == "local":  # a full reload: the table is built again from the new load in one snapshot
            cur.execute(f"UPDATE `{source}` SET s = 'before the reload' WHERE id = 2")
            capture()
            reload = run_full_load(spark, MySqlSourceHook(), replace(request, full_reload=True)).handoff
            cur.execute(f"UPDATE `{source}` SET s = 'after the reload' WHERE id = 3")
            capture()
            reloaded, logged = jobs.run_in_session(args, caplog)
            assert f"built from full load {reload.load_id}" in logged
            end = jobs.end_offsets(f"{stack.HOST}:{stack.KAFKA_PORT}", topic, 1)
            assert reloaded["offsets"] == {topic: {str(p): o for p, o in end.items()}}
            assert reloaded["schema"]["load_id"] == reload.load_id
            assert_current()
            live = [t.file.file_path for t in sink.catalog().load_table(table).scan().plan_files()]
            assert not any(f"/data/load-{reload.load_id}" not in f and "/data/load-" in f for f in live), (
                "a file of the older load is still in the table"
            )
            snapshot = sink.commit_location()
        if where == "local":  # a schema change is not followed yet: its batch fails, nothing of it committed
            cur.execute(f"ALTER TABLE `{source}` ADD COLUMN extra INT NOT NULL DEFAULT 7")
            cur.execute(f"UPDATE `{source}` SET s = 'after the change' WHERE id = 1")
            capture()
            with pytest.raises(Exception, match="does not follow schema changes yet"):
                jobs.run_in_session(args, caplog)
            assert sink.commit_location() == snapshot
    finally:
        cur.execute(f"DROP TABLE IF EXISTS `{source}`")
        conn.close()
        drop(sink)
        if s3 is not None:
            open_storage(prefix, s3).delete_prefix("")
        register_settings(before)
