"""SIGKILL the Kafka -> Iceberg job's driver between its steps, then rerun it: the table ends exact.

Two kill points, one spark-submit each: after Spark wrote batch 1's data files and before its snapshot commit
(``sink_written_1``: the files stay unreferenced, the rerun writes the batch again), and after the snapshot commit
of batch 1 and before Spark's checkpoint commit of it (``after_sink_commit_1``: Spark replays batch 1 and the sink
finds it in its newest snapshot's summary and skips it). The rerun runs in the test's Spark session. The table is
read back by DuckDB's Iceberg reader and pyiceberg's scan; both must hold every committed record once, no aborted
one, and the summary's offsets must be the topic's end. One kill on local disk, the other on the stack's MinIO. The same two kills in cdc mode (changes by key, deletes
as tombstones, a late older change, aborted transactions; each batch ONE overwrite snapshot rewriting the files
that hold its keys): the table ends with the newest committed change of each key, once.
"""

from __future__ import annotations

import re
import uuid

import pytest

from exactly_once_provider.sinks.iceberg import IcebergSink, catalog_settings
from exactly_once_provider.storage import open_storage
from tests import spark_job_support as jobs
from tests.fault_support import check
from tests.integration.provider.sinks.test_iceberg import CDC_READ, read_both
from tests.integration.spark_jobs.test_kafka_to_sink import checkpoint_has
from tests.integration.spark_jobs.test_kafka_to_sink_cdc import produce_changes
from tests.integration.spark_jobs.test_kafka_to_sink_iceberg import drop, iceberg_args
from tests.kafka_support import new_topic

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "point,where,mode",
    [
        ("sink_written", "local", "append"),
        ("after_sink_commit", "s3", "append"),
        ("sink_written", "s3", "cdc"),
        ("after_sink_commit", "local", "cdc"),
    ],
)
def test_driver_sigkilled_between_steps_then_rerun_gives_the_exact_table(
    stack, spark, airflow_connections, tmp_path, caplog, fault_outcome, point, where, mode
):
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap, partitions=2)
    pipeline = f"fault-iceberg-{topic}"
    table = f"fault_iceberg_{uuid.uuid4().hex[:10]}.events"
    s3 = stack.minio_settings() if where == "s3" else None
    location = f"s3://{stack.MINIO_BUCKETS[0]}/it-iceberg/{topic}" if s3 else str(tmp_path / "events")
    checkpoint = tmp_path / "checkpoint"
    if mode == "cdc":  # the keyed commit: the batch's files rewritten with its changes, one overwrite snapshot
        args = iceberg_args(stack, pipeline, topic, checkpoint, table, location, s3, max_offsets=70, mode="cdc")
        sink = IcebergSink(table, pipeline, catalog_settings("postgres_default"), location, s3, mode="cdc")
        try:
            _cdc_killed_then_rerun(stack, sink, args, bootstrap, topic, checkpoint, caplog, fault_outcome, point, s3)
        finally:
            drop(sink)
            if s3 is not None:
                open_storage(location, s3).delete_prefix("")
        return
    args = iceberg_args(stack, pipeline, topic, checkpoint, table, location, s3, max_offsets=40)
    sink = IcebergSink(table, pipeline, catalog_settings("postgres_default"), location, s3)
    committed = jobs.produce_interleaved(bootstrap, topic, transactions=6, per_transaction=20, partitions=2)
    try:
        run = jobs.run_job(stack, args, jobs.kill_driver_at(point, 1), log_file=tmp_path / "job.log")
        assert run.returncode in (-9, 137), f"expected a SIGKILL, got {run.returncode}:\n{run.stdout[-3000:]}"
        state = sink.committed()
        if point == "sink_written":  # batch 1's files are written, but no snapshot names them
            assert state.batch_id == 0
            folders = {key.split("/")[1] for key in sink.storage().list("data/")}
            assert any(re.search(r"-1-[0-9a-f]{8}$", folder) for folder in folders), folders
        else:  # the snapshot of batch 1 is committed, Spark's checkpoint commit of it is not
            assert state.batch_id == 1
            assert checkpoint_has(checkpoint, "offsets/1") and not checkpoint_has(checkpoint, "commits/1")

        final, logged = jobs.run_in_session(args, caplog)
        if point == "after_sink_commit":
            assert re.search(r"batch 1 already committed to the iceberg sink \(replay after a crash\)", logged)
        end = {topic: {str(p): o for p, o in jobs.end_offsets(bootstrap, topic, 2).items()}}
        assert final["offsets"] == end
        assert final["rows_total"] == len(committed)
        rows = read_both(sink, s3)
        check(fault_outcome, committed, [(key, value) for _, _, key, value in rows], "records")
        jobs.assert_exactly(rows, committed)
    finally:
        drop(sink)
        if s3 is not None:
            open_storage(location, s3).delete_prefix("")


def _cdc_killed_then_rerun(stack, sink, args, bootstrap, topic, checkpoint, caplog, fault_outcome, point, s3) -> None:
    """cdc mode: changes with deletes, aborted transactions and a late older change; the driver killed at ``point``
    of batch 1, then rerun: the table holds the newest committed change of each key, once."""
    expected = produce_changes(bootstrap, topic)
    run = jobs.run_job(stack, args, jobs.kill_driver_at(point, 1))
    assert run.returncode in (-9, 137), f"expected a SIGKILL, got {run.returncode}:\n{run.stdout[-3000:]}"
    killed_at = sink.commit_location()
    assert sink.committed().batch_id == (0 if point == "sink_written" else 1)
    if point == "after_sink_commit":
        assert checkpoint_has(checkpoint, "offsets/1") and not checkpoint_has(checkpoint, "commits/1")

    final, logged = jobs.run_in_session(args, caplog)
    if point == "after_sink_commit":
        assert re.search(r"batch 1 already committed to the iceberg sink \(replay after a crash\)", logged)
    assert sink.commit_location() != killed_at
    assert final["offsets"] == {topic: {str(p): o for p, o in jobs.end_offsets(bootstrap, topic, 2).items()}}
    # row by row: a key lost, in twice, or at an older or aborted version fails
    check(fault_outcome, [(pk, *state) for pk, state in expected.items()], read_both(sink, s3, CDC_READ), "keys")
    assert final["rows_total"] == len(expected)
