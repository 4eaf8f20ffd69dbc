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
