"""The packaged Kafka -> sink job, submitted with spark-submit, writes exactly the committed input.

Per sink: interleaved committed/aborted transactions on two partitions; several micro-batches; the sink must
hold each committed record once, no aborted record, and offsets equal to the topic's end. Then the checkpoint
is deleted and more input arrives: the restarted job takes its start from the sink (no duplicate, no loss).
A rerun with nothing new changes nothing. ``files-s3`` is the files sink on the stack's MinIO (through s3a, its
settings from the ``aws`` connection via the job's secrets file); ``delta-s3`` the Delta sink there, with the
streaming checkpoint on MinIO as well (the lost checkpoint is deleted from the bucket).
"""

from __future__ import annotations

import shutil
import uuid

import pytest

from exactly_once_provider.sinks import delta_commit
from exactly_once_provider.sinks.delta import DeltaSink
from exactly_once_provider.sinks.files import FilesSink, sink_storage
from exactly_once_provider.sinks.postgres import PostgresSink
from exactly_once_provider.storage import open_storage
from exactly_once_provider.storage.s3 import S3Settings
from tests import spark_job_support as jobs
from tests.kafka_support import new_topic

SINKS = ("delta", "postgres", "files")
# The files and Delta sinks on the stack's MinIO as well (the fault tests, which import SINKS, run on local disk
# so far).
LOCATIONS = (*SINKS, "files-s3", "delta-s3")


def target_for(sink: str, tmp_path, topic: str, stack=None) -> str:
    if sink.endswith("-s3"):
        return f"s3://{stack.MINIO_BUCKETS[0]}/it-{sink}/{topic}-{uuid.uuid4().hex[:8]}"
    return f"eo_it_{topic.replace('-', '_')}" if sink == "postgres" else str(tmp_path / f"{sink}-sink")


def s3_settings_for(sink: str):
    """The S3 settings of a ``*-s3`` variant (the ``aws_default`` connection: the stack's MinIO), else None."""
    return S3Settings.from_connection("aws_default") if sink.endswith("-s3") else None


def checkpoint_for(sink: str, tmp_path, topic: str, stack, name: str = "checkpoint"):
    """The job's checkpoint: a local directory, or for ``delta-s3`` a prefix in the bucket (reached through s3a)."""
    if sink == "delta-s3":
        return f"s3a://{stack.MINIO_BUCKETS[0]}/it-checkpoints/{topic}-{name}-{uuid.uuid4().hex[:8]}"
    return tmp_path / name


def reader_for(sink: str, location: str, s3):
    """What the tests read a sink back through: the storage of a files sink or an S3 sink, else the location."""
    return open_storage(location, s3) if sink.startswith("files") or s3 else location


def checkpoint_has(checkpoint, key: str, s3=None) -> bool:
    """Whether the checkpoint (a local directory or an S3 URI) holds ``key``, e.g. ``offsets/1``."""
    return open_storage(str(checkpoint), s3).exists(key)


def sink_state(stack, sink: str, target, pipeline: str):
    if sink == "delta":  # a path or a storage (S3)
        if isinstance(target, str):
            return DeltaSink(target, pipeline).committed()
        return DeltaSink(target.uri(), pipeline, s3=target.settings).committed()
    if sink == "files":  # a path or a storage (S3)
        storage = sink_storage(target)
        return FilesSink(storage.uri(), pipeline, storage).committed()
    return PostgresSink(
        target,
        pipeline,
        {
            "host": stack.HOST,
            "port": stack.POSTGRES_PORT,
            "dbname": stack.DB_NAME,
            "user": stack.DB_USER,
            "password": stack.DB_PASSWORD,
        },
    ).committed()


@pytest.mark.parametrize("sink", LOCATIONS)
def test_sink_holds_exactly_the_committed_records_across_a_lost_checkpoint(
    stack, spark, airflow_connections, tmp_path, caplog, sink
):
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap, partitions=2)
    location = target_for(sink, tmp_path, topic, stack)
    pipeline = f"it-{topic}"  # the PostgreSQL offsets table is shared by every test run: unique names
    s3 = s3_settings_for(sink)
    checkpoint = checkpoint_for(sink, tmp_path, topic, stack)  # delta-s3: in the bucket too (through s3a)
    target = reader_for(sink, location, s3)  # read back through the storage layer, on local disk or MinIO alike
    sink = sink.removesuffix("-s3")
    args = jobs.job_args(
        stack, pipeline, topic, checkpoint, sink, location, max_offsets=120, s3=s3.to_json() if s3 else None
    )
    if s3:  # the credentials travel in the 0600 secrets file only, never on spark-submit's command line
        assert s3.secret_access_key not in " ".join(jobs.submit_command(stack, args))
    log = tmp_path / "job.log"

    committed = jobs.produce_interleaved(bootstrap, topic, transactions=6, per_transaction=40, partitions=2)
    first = jobs.run_job(stack, args, log_file=log)
    assert first.returncode == 0, first.stderr[-4000:]
    state = jobs.result_line(first.stdout)
    assert state["offsets"] == {topic: {str(p): o for p, o in jobs.end_offsets(bootstrap, topic, 2).items()}}
    assert state["batch_id"] >= 2, "max offsets per trigger should split the input into several batches"
    assert state["rows_total"] == len(committed)
    jobs.assert_exactly(jobs.sink_rows(stack, sink, target), committed)
    if s3 and sink == "files":  # the manifests and the data are objects in the bucket
        keys = target.list()
        assert target.uri().startswith("s3://") and "_manifests/_latest.json" in keys
        assert any(k.startswith("data/") and k.endswith(".parquet") for k in keys)
    if s3 and sink == "delta":  # the log, the data and the checkpoint are objects in the bucket
        keys = target.list()
        assert f"_delta_log/{0:020d}.json" in keys
        assert any(k.startswith("eo-") and k.endswith(".parquet") for k in keys)
        assert open_storage(checkpoint, s3).list("offsets/"), "the streaming checkpoint should be on MinIO"
    if sink == "delta":  # every batch went through the own commit (by delta-rs), none through Delta's writer
        engines = [a["commitInfo"].get("engineInfo", "") for _, a in delta_commit.commits(target)]
        assert engines and all(e.startswith("delta-rs:") for e in engines), engines

    # Lose the checkpoint, add input: the job starts from the sink's offsets, not from the beginning.
    if isinstance(checkpoint, str):
        open_storage(checkpoint, s3).delete_prefix("")
    else:
        shutil.rmtree(checkpoint)
    committed += jobs.produce_interleaved(bootstrap, topic, transactions=3, per_transaction=40, partitions=2, tag="s")
    # The later runs in this process's Spark session: the first one proved the submitted path.
    state2, logged = jobs.run_in_session(args, caplog)
    assert "starting from the sink's committed offsets" in logged, logged[-3000:]
    assert state2["checkpoint_id"] != state["checkpoint_id"]
    assert state2["offsets"] == {topic: {str(p): o for p, o in jobs.end_offsets(bootstrap, topic, 2).items()}}
    assert state2["rows_total"] == len(committed)
    jobs.assert_exactly(jobs.sink_rows(stack, sink, target), committed)

    # Nothing new: the rerun is a no-op.
    assert jobs.run_in_session(args, caplog)[0] == state2
    assert sink_state(stack, sink, target, pipeline).to_json() == state2
    jobs.assert_exactly(jobs.sink_rows(stack, sink, target), committed)
