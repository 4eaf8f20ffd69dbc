"""CDC apply: the job MERGEs changes by key into Delta / PostgreSQL, a change applies only if its source version
is newer, deletes are applied (tombstones), aborted transactions are ignored, and a driver killed between the
sink commit and the checkpoint commit changes nothing.
"""

from __future__ import annotations

import json
import random

import psycopg2
import pytest

from tests import spark_job_support as jobs
from tests.kafka_support import new_topic, transactional_producer

KEYS = 25


def produce_changes(bootstrap: str, topic: str) -> dict[str, tuple[int, bool, str]]:
    """Write changes in transactions (every third aborted); return the expected state per key."""
    rng = random.Random(7)
    producer = transactional_producer(bootstrap)
    expected: dict[str, tuple[int, bool, str]] = {}
    version = 0
    for txn in range(12):
        commit = txn % 3 != 1
        changes = []
        for _ in range(20):
            version += 1
            key = f"k{rng.randrange(KEYS)}"
            op = "d" if rng.random() < 0.15 else "u"
            changes.append({"pk": key, "version": version, "op": op, "txn": txn, "committed": commit})
        if txn == 9:  # a late, OLDER change for a key: must not overwrite the newer state
            changes.append({"pk": "k1", "version": 1, "op": "u", "txn": txn, "late": True, "committed": commit})
        producer.begin_transaction()
        for change in changes:
            value = json.dumps(change)
            producer.produce(topic, value.encode(), change["pk"].encode(), partition=hash(change["pk"]) % 2)
        producer.flush(30)
        if commit:
            producer.commit_transaction(60)
            for change in changes:
                key, v = change["pk"], change["version"]
                if key not in expected or expected[key][0] < v:
                    expected[key] = (v, change["op"] == "d", json.dumps(change))
        else:
            producer.abort_transaction(60)
    return expected


def sink_state(stack, sink: str, target) -> dict[str, tuple[int, bool, str]]:
    if sink == "postgres":
        conn = psycopg2.connect(
            host=stack.HOST,
            port=stack.POSTGRES_PORT,
            dbname=stack.DB_NAME,
            user=stack.DB_USER,
            password=stack.DB_PASSWORD,
        )
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT pk, source_version, deleted, record_value FROM {target}")
                rows = cur.fetchall()
        finally:
            conn.close()
    else:
        rows = jobs.delta_rows(target, ("pk", "source_version", "deleted", "record_value"))
    keys = [row[0] for row in rows]
    assert len(keys) == len(set(keys)), "a key is in the sink twice"
    return {pk: (version, deleted, value) for pk, version, deleted, value in rows}


# delta-s3 (matrix): the changes table and the checkpoint on the stack's MinIO.
@pytest.mark.parametrize("sink", ("delta", "postgres", pytest.param("delta-s3", marks=pytest.mark.matrix)))
def test_cdc_apply_keeps_the_newest_committed_change_per_key(stack, spark, tmp_path, caplog, sink):
    from tests.integration.spark_jobs.test_kafka_to_sink import checkpoint_for, reader_for, target_for

    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap, partitions=2)
    target = f"eo_cdc_{topic.replace('-', '_')}" if sink == "postgres" else str(tmp_path / "delta-cdc")
    s3 = stack.minio_settings() if sink == "delta-s3" else None
    if s3:
        target = target_for(sink, tmp_path, topic, stack)
    expected = produce_changes(bootstrap, topic)
    assert any(deleted for _, deleted, _ in expected.values()), "the input should contain deletes"
    args = jobs.job_args(
        stack,
        f"cdc-{topic}",
        topic,
        checkpoint_for(sink, tmp_path, topic, stack),
        sink.removesuffix("-s3"),
        target,
        max_offsets=70,
        mode="cdc",
        s3=s3.to_json() if s3 else None,
    )
    target, sink = reader_for(sink, target, s3), sink.removesuffix("-s3")

    killed = jobs.run_job(stack, args, jobs.kill_driver_at("after_sink_commit", 1))
    assert killed.returncode in (-9, 137), killed.stdout[-3000:]
    state, logged = jobs.run_in_session(args, caplog)  # the restart, in this process's Spark session
    assert "batch 1 already committed" in logged, logged[-3000:]
    assert state["offsets"] == {topic: {str(p): o for p, o in jobs.end_offsets(bootstrap, topic, 2).items()}}

    got = sink_state(stack, sink, target)
    assert got == expected
    assert got["k1"][0] > 1 and "late" not in got["k1"][2], "an older change overwrote a newer one"


def test_a_sink_fed_by_two_tables_is_refused_unless_the_key_names_the_table(stack, airflow_connections, tmp_path):
    """Two captured tables both keyed ``{"id": 1}``: merged on ``pk`` alone into one sink, their rows would
    overwrite each other; the batch fails naming both tables, nothing is committed. With the table in the key,
    every (table, key) is one row."""
    from exactly_once_provider.operators.binlog_capture import BinlogCaptureOperator
    from tests.mysql_support import connect, unique_name

    tables, pipeline = [unique_name("cdc_a"), unique_name("cdc_b")], unique_name("cdc2")
    conn = connect(stack)
    cur = conn.cursor()
    for name in tables:
        cur.execute(f"CREATE TABLE `{name}` (id INT PRIMARY KEY, v VARCHAR(10))")
    capture = BinlogCaptureOperator(
        task_id="capture", tables=tables, pipeline=pipeline, start_position=_binlog_end(cur)
    )
    for name in tables:
        cur.execute(f"INSERT INTO `{name}` VALUES (1, %s), (2, %s)", (name[:5], name[:5]))
    captured = capture.execute({})["topics"]
    topics = [captured[f"{stack.DB_NAME}.{name}"] for name in tables]
    target = str(tmp_path / "one-sink")
    args = jobs.job_args(
        stack, f"{pipeline}-apply", ",".join(topics), tmp_path / "checkpoint", "delta", target, mode="cdc"
    )
    refused = jobs.run_job(stack, args)
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert (
        f"two source tables, {stack.DB_NAME}.{min(tables)} and {stack.DB_NAME}.{max(tables)}, merged on the "
        "key 'pk' alone"
    ) in output, output[-3000:]
    assert "key_field='source.schema,source.table,pk'" in output
    from exactly_once_provider.sinks.base import open_sink

    assert open_sink("delta", target, f"{pipeline}-apply", mode="cdc").committed() is None, "something was committed"

    keyed = args + ["--key-field", "source.schema,source.table,pk"]
    accepted = jobs.run_job(stack, keyed)
    assert accepted.returncode == 0, accepted.stdout[-3000:] + accepted.stderr[-3000:]
    rows = jobs.delta_rows(target, ("pk", "deleted"))
    assert sorted(pk for pk, _ in rows) == sorted(
        json.dumps([stack.DB_NAME, name, json.dumps({"id": i}, separators=(",", ":"))], separators=(",", ":"))
        for name in tables
        for i in (1, 2)
    )
    for name in tables:
        cur.execute(f"DROP TABLE `{name}`")
    conn.close()


def _binlog_end(cur) -> str:
    cur.execute("SHOW MASTER STATUS")
    file, pos = cur.fetchone()[:2]
    return f"{file}:{pos}"
