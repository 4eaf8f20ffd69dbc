"""Window mode on the real MariaDB + Kafka + Spark + sinks: settlement windows replaced whole, newer versions win.

WatermarkExtractOperator publishes two windows of a MariaDB table to a 2-partition topic, then, after rows of
the first window changed at the source, a re-extracted v2 of it. The job runs in window mode with tiny
micro-batches (every batch is cut by the read at least once): the sink must hold exactly one copy of each
window, with v2's content for the re-extracted one, i.e. exactly the source table. Then the checkpoint is
lost and the second window is re-extracted: the restarted job takes its start from the sink, replaces that
window only, and a rerun with nothing new changes nothing.

The job runs in this process on the session's local[2] SparkSession (same code path as spark-submit, without
a JVM start per run); the kill scenario of window mode uses spark-submit (tests/faults/test_spark_job_kill.py, matrix).
"""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from collections import Counter

import pytest

from exactly_once_provider.operators.watermark_extract import WatermarkExtractOperator
from exactly_once_provider.spark_jobs import kafka_to_sink
from exactly_once_provider.storage import open_storage
from tests import spark_job_support as jobs
from tests.integration.spark_jobs.test_kafka_to_sink import checkpoint_for, sink_state, target_for
from tests.kafka_support import new_topic
from tests.mysql_support import connect


class Source:
    """A MariaDB table with an id cursor, and the settlement windows extracted from it."""

    def __init__(self, stack, topic: str, ledger: str) -> None:
        self.table, self.topic, self.ledger = f"win_{uuid.uuid4().hex[:8]}", topic, ledger
        self.conn = connect(stack)
        self.conn.cursor().execute(
            f"CREATE TABLE {self.table} (id BIGINT AUTO_INCREMENT PRIMARY KEY, tag VARCHAR(20) NOT NULL,"
            " amount INT NOT NULL)"
        )

    def insert(self, tag: str, count: int) -> None:
        self.conn.cursor().execute(
            f"INSERT INTO {self.table} (tag, amount) VALUES " + ", ".join(["(%s, %s)"] * count),
            [x for n in range(count) for x in (tag, n)],
        )

    def update(self, tag: str, limit: int) -> None:
        self.conn.cursor().execute(
            f"UPDATE {self.table} SET amount = amount + 100 WHERE tag = %s LIMIT {limit}", (tag,)
        )

    def extract(self, batch_id: str, reextract: bool = False) -> dict:
        return WatermarkExtractOperator(
            task_id=f"x{uuid.uuid4().hex[:6]}",
            table=self.table,
            cursor_column="id",
            cursor_kind="id",
            topic=self.topic,
            pipeline="settle",
            offsets_topic=self.ledger,
            batch_id=batch_id,
            reextract=reextract,
            safety_lag=0,
        ).execute({})

    def rows(self) -> Counter:
        cur = self.conn.cursor()
        cur.execute(f"SELECT id, tag, amount FROM {self.table}")
        return Counter(cur.fetchall())


def window_rows(stack, sink: str, target) -> list[tuple]:
    """Return ``(window_id, window_version, kafka_partition, kafka_offset, record_value)`` of the sink."""
    columns = ("window_id", "window_version", "kafka_partition", "kafka_offset", "record_value")
    if sink == "delta":  # a path or a storage (MinIO)
        return jobs.delta_rows(target, columns)
    if sink == "files":  # a path or a storage (MinIO)
        return jobs.files_rows(target, columns)
    return jobs.postgres_rows(stack, target, columns)


def assert_windows(rows: list[tuple], source: Counter, versions: dict[str, int]) -> None:
    """One copy of each window, at the expected version, equal to the source table row by row."""
    got_versions = {w: {v for w2, v, *_ in rows if w2 == w} for w in {r[0] for r in rows}}
    assert got_versions == {w: {v} for w, v in versions.items()}, "a window is missing, mixed or at the wrong version"
    positions = [(r[2], r[3]) for r in rows]
    assert len(positions) == len(set(positions)), "a Kafka record is in the sink twice"
    sink = Counter((v["row"]["id"], v["row"]["tag"], v["row"]["amount"]) for v in (json.loads(r[4]) for r in rows))
    assert sink == source, f"missing {source - sink}, extra or stale {sink - source}"


def run_job(args: list[str], capsys) -> dict | None:
    capsys.readouterr()
    kafka_to_sink.run(kafka_to_sink.parse_args(args))
    return jobs.result_line(capsys.readouterr().out)


# PostgreSQL runs in the default suite (time budget: the Delta variant takes ~110 s on the loaded 2-core box,
# five Delta commits); Delta and files (local disk and MinIO) run with `pytest -m matrix` (same planning, other
# commit paths).
@pytest.mark.parametrize(
    "sink",
    (
        pytest.param("delta", marks=pytest.mark.matrix),
        "postgres",
        pytest.param("files", marks=pytest.mark.matrix),
        pytest.param("files-s3", marks=pytest.mark.matrix),
        pytest.param("delta-s3", marks=pytest.mark.matrix),
    ),
)
def test_window_versions_replace_whole_windows_across_a_lost_checkpoint(
    stack, airflow_connections, spark, tmp_path, monkeypatch, capsys, caplog, sink
):
    for key, value in jobs.pg_env(stack).items():
        monkeypatch.setenv(key, value)
    caplog.set_level(logging.INFO, logger="exactly_once_provider.kafka_to_sink")
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap, partitions=2)
    source = Source(stack, topic, f"ledger-{uuid.uuid4().hex[:8]}")
    location = target_for(sink, tmp_path, topic, stack)
    s3 = stack.minio_settings() if sink.endswith("-s3") else None
    checkpoint = checkpoint_for(sink, tmp_path, topic, stack)  # delta-s3: on MinIO too
    sink = sink.removesuffix("-s3")
    target = open_storage(location, s3) if sink == "files" or s3 else location
    pipeline = f"win-{topic}"
    args = jobs.job_args(
        stack,
        pipeline,
        topic,
        checkpoint,
        sink,
        location,
        max_offsets=10,
        mode="window",
        s3=s3.to_json() if s3 else None,
    )

    source.insert("d1", 6)
    first = source.extract("d1")
    source.insert("d2", 4)
    second = source.extract("d2")
    source.update("d1", 2)  # the source changed after the settlement: re-extract d1 as v2
    again = source.extract("d1", reextract=True)
    assert (first["rows"], second["rows"], again["rows"], again["batch_version"]) == (6, 4, 6, 2)
    w1, w2 = f"settle/{source.table}/d1", f"settle/{source.table}/d2"
    jobs.wait_for_committed_end(bootstrap, topic, 2)

    state = run_job(args, capsys)
    assert "windows" in state, f"no window published: {state}"
    assert "incomplete in this read" in caplog.text, "max offsets per trigger should cut a batch"
    assert {w: (v["version"], v["rows"]) for w, v in state["windows"].items()} == {w1: (2, 6), w2: (1, 4)}
    assert state["rows_total"] == 10
    assert state["offsets"] == {topic: {str(p): o for p, o in jobs.end_offsets(bootstrap, topic, 2).items()}}
    assert_windows(window_rows(stack, sink, target), source.rows(), {w1: 2, w2: 1})

    # Lose the checkpoint; the second window is re-extracted meanwhile: only it is replaced.
    if isinstance(checkpoint, str):
        open_storage(checkpoint, s3).delete_prefix("")
    else:
        shutil.rmtree(checkpoint)
    source.update("d2", 3)
    assert source.extract("d2", reextract=True)["batch_version"] == 2
    jobs.wait_for_committed_end(bootstrap, topic, 2)
    caplog.clear()
    state2 = run_job(args, capsys)
    assert "starting from the sink's committed offsets" in caplog.text
    assert state2["checkpoint_id"] != state["checkpoint_id"]
    assert {w: v["version"] for w, v in state2["windows"].items()} == {w1: 2, w2: 2}
    assert_windows(window_rows(stack, sink, target), source.rows(), {w1: 2, w2: 2})

    # Nothing new: a rerun changes nothing.
    assert run_job(args, capsys) == state2
    assert sink_state(stack, sink, target, pipeline).to_json() == state2
    assert_windows(window_rows(stack, sink, target), source.rows(), {w1: 2, w2: 2})
