"""Several tables, one Spark application: one capture of three tables (integer, two-column and text keys) with
writers changing them concurrently, across tables in one transaction, during the full loads and after; ONE
apply run (``streams`` with one checkpoint: ONE query split per table) merges each table's topic into its own
current table, its driver killed while the tables commit one batch side by side (two committed it, one not),
then retried. Each current table then
equals its source table row by row, read with Spark and with delta-rs, every key once; a second run adds nothing.
One more application keeps the three tables in PostgreSQL (one query per table, each with its own checkpoint, one
pipeline): each equals its source too.
"""

from __future__ import annotations

import os
import random
import re
import signal
import sys
import threading
import time
from collections import Counter

import pytest
from airflow.sdk.exceptions import AirflowException

from exactly_once_provider.full_load.job import FullLoadRequest, run_full_load
from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
from exactly_once_provider.operators.binlog_capture import BinlogCaptureOperator
from exactly_once_provider.operators.spark_stream import SparkKafkaToSinkOperator
from exactly_once_provider.sinks import delta_commit
from exactly_once_provider.sinks.current_table import CURRENT_ROWS, DELETED_COLUMN
from tests import spark_job_support as jobs
from tests.airflow_support import processes_matching
from tests.mysql_support import assert_same_rows, connect, normalise, source_rows, unique_name

# name prefix -> (DDL, columns, key columns)
TABLES = {
    "orders": ("(id INT PRIMARY KEY, amount DECIMAL(10,2), note VARCHAR(40))", ["id", "amount", "note"], ["id"]),
    "lines": (
        "(order_id INT, line_no INT, qty INT, sku VARCHAR(20), PRIMARY KEY (order_id, line_no))",
        ["order_id", "line_no", "qty", "sku"],
        ["order_id", "line_no"],
    ),
    "accounts": (
        "(code VARCHAR(32) CHARACTER SET utf8mb4 PRIMARY KEY, balance BIGINT, owner VARCHAR(40))",
        ["code", "balance", "owner"],
        ["code"],
    ),
}
SEED = 300  # rows per table before the writers start


def _seed(cur, names: dict[str, str]) -> None:
    cur.executemany(
        f"INSERT INTO `{names['orders']}` VALUES (%s, %s, %s)", [(i, f"{i}.25", f"order {i}") for i in range(SEED)]
    )
    cur.executemany(
        f"INSERT INTO `{names['lines']}` VALUES (%s, %s, %s, %s)", [(i // 3, i % 3, i, f"sku-{i}") for i in range(SEED)]
    )
    cur.executemany(
        f"INSERT INTO `{names['accounts']}` VALUES (%s, %s, %s)",
        [(f"acc-{i:05d}-é", i * 10, f"owner {i}") for i in range(SEED)],
    )


def _writer(stack, names: dict[str, str], seed: int, stop: threading.Event, errors: list) -> None:
    """Change all three tables in transactions that span them, until ``stop`` (each writer its own keys)."""
    rng = random.Random(seed)
    conn = connect(stack)
    try:
        cur = conn.cursor()
        n = 0
        # 30 to 120 transactions each: at least 30 whatever the timing, more while the full loads run
        while n < 30 or (not stop.is_set() and n < 120):
            n += 1
            new = 100_000 * (seed + 1) + n
            o, li, a = names["orders"], names["lines"], names["accounts"]
            cur.execute("START TRANSACTION")  # one source transaction across the three tables
            cur.execute(f"INSERT INTO `{o}` VALUES (%s, %s, %s)", (new, f"{n}.50", f"new {seed}"))
            cur.execute(f"INSERT INTO `{li}` VALUES (%s, 0, %s, 'new'), (%s, 1, %s, 'new')", (new, n, new, n))
            cur.execute(f"INSERT INTO `{a}` VALUES (%s, %s, %s)", (f"w{seed}-{n}", n, "writer"))
            key = rng.randrange(SEED)
            cur.execute(f"UPDATE `{o}` SET amount = amount + 1, note = %s WHERE id = %s", (f"w{seed} {n}", key))
            cur.execute(f"UPDATE `{li}` SET qty = qty + 1 WHERE order_id = %s", (key // 3,))
            cur.execute(f"UPDATE `{a}` SET balance = balance - 1 WHERE code = %s", (f"acc-{key:05d}-é",))
            if n % 4 == 0:
                gone = rng.randrange(SEED)
                cur.execute(f"DELETE FROM `{o}` WHERE id = %s", (gone,))
                cur.execute(f"DELETE FROM `{li}` WHERE order_id = %s AND line_no = %s", (gone // 3, gone % 3))
                cur.execute(f"DELETE FROM `{a}` WHERE code = %s", (f"acc-{gone:05d}-é",))
            if n % 7 == 0:  # a key change in the composite and the text key: a delete and a create
                cur.execute(f"UPDATE `{li}` SET line_no = line_no + 10 WHERE order_id = %s AND line_no < 10", (new,))
                cur.execute(f"UPDATE `{a}` SET code = %s WHERE code = %s", (f"w{seed}-{n}-moved", f"w{seed}-{n}"))
            conn.commit()
    except Exception as err:  # reported by the test: a writer that died silently would weaken it
        errors.append(err)
    finally:
        conn.close()


def _expect_failure(operator, failed: list) -> None:
    try:
        operator.execute({})
    except BaseException as err:  # what the killed driver's task raises, checked by the test
        failed.append(err)


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.5)


def _kill_driver_group(app: str) -> None:
    """SIGKILL the process group of the Spark driver whose command line names ``app`` (spark-submit, its JVM
    and the Python driver)."""
    drivers = [line for line in processes_matching(app) if "SparkSubmit" in line or "spark-submit" in line]
    assert drivers, f"no Spark driver of {app}"
    for line in drivers:
        try:
            os.killpg(os.getpgid(int(line.split()[0])), signal.SIGKILL)
        except ProcessLookupError:
            pass


def _spark_rows(spark, path: str, columns: list[str], key: list[str]) -> Counter:
    frame = spark.read.format("delta").load(path)
    doubled = frame.groupBy(*key).count().filter("count > 1").count()
    assert doubled == 0, f"{doubled} keys are in {path} more than once"
    return Counter(tuple(normalise(v) for v in row) for row in frame.filter(CURRENT_ROWS).select(*columns).collect())


def _delta_rs_rows(path: str, columns: list[str], key: list[str]) -> Counter:
    from deltalake import DeltaTable

    table = DeltaTable(path).to_pyarrow_table(columns=columns + [DELETED_COLUMN])
    rows = list(zip(*(table.column(c).to_pylist() for c in columns + [DELETED_COLUMN])))
    keys = Counter(tuple(row[columns.index(k)] for k in key) for row in rows)
    doubled = [k for k, n in keys.items() if n > 1]
    assert not doubled, f"keys in {path} more than once (delta-rs): {doubled[:3]}"
    return Counter(tuple(normalise(v) for v in row[:-1]) for row in rows if not row[-1])


def test_one_application_applies_three_tables_each_into_its_own_current_table(
    stack, spark, airflow_connections, tmp_path
):
    names = {prefix: unique_name(prefix) for prefix in TABLES}
    pipeline = unique_name("multi")
    conn = connect(stack)
    cur = conn.cursor()
    for prefix, name in names.items():
        cur.execute(f"CREATE TABLE `{name}` {TABLES[prefix][0]}")
    _seed(cur, names)
    conn.commit()

    stop, errors = threading.Event(), []
    writers = [threading.Thread(target=_writer, args=(stack, names, seed, stop, errors)) for seed in range(3)]
    for writer in writers:
        writer.start()
    paths = {prefix: str(tmp_path / prefix) for prefix in TABLES}
    for prefix, name in names.items():  # the writers keep changing the tables while they are loaded
        run_full_load(
            spark,
            MySqlSourceHook(),
            FullLoadRequest(schema=stack.DB_NAME, table=name, sink_path=paths[prefix], chunk_rows=100),
        )
    stop.set()
    for writer in writers:
        writer.join(300)
    # and after them (their minimum each): changes the capture must deliver, whatever the timing above
    after = [threading.Thread(target=_writer, args=(stack, names, seed, stop, errors)) for seed in range(3, 6)]
    for writer in after:
        writer.start()
    for writer in after:
        writer.join(300)
    assert not errors, errors

    capture = BinlogCaptureOperator(
        task_id="capture",
        tables=list(names.values()),
        pipeline=pipeline,
        full_load_paths={names[p]: paths[p] for p in TABLES},
    ).execute({})
    topics = {p: capture["topics"][f"{stack.DB_NAME}.{names[p]}"] for p in TABLES}
    assert len(set(topics.values())) == 3
    streams = [{"topics": [topics[p]], "sink_path": paths[p]} for p in TABLES]

    def apply_delta(**env: str) -> SparkKafkaToSinkOperator:
        return SparkKafkaToSinkOperator(
            task_id="apply",
            pipeline=f"{pipeline}-apply",
            sink="delta",
            mode="current",
            streams=streams,
            checkpoint_location=str(tmp_path / "ckpt"),  # ONE query of the three tables
            max_offsets_per_trigger=300,  # several micro-batches, each touching every table
            conf={"spark.jars": stack.spark_conf()["spark.jars"], "spark.ui.enabled": "false"},
            env_vars={"PYSPARK_PYTHON": sys.executable, **env},
        )

    # The tables of a batch commit side by side: the second table to reach its commit of batch 1 stops there
    # (a paused thread) while the other two commit it; then the driver dies with its JVM.
    marker = tmp_path / "paused"
    killed = apply_delta(EO_FAULT_AT="before_sink_commit_1:2", EO_FAULT_ACTION="pause:600", EO_FAULT_FILE=str(marker))
    failed: list[BaseException] = []
    running = threading.Thread(target=lambda: _expect_failure(killed, failed), daemon=True)
    running.start()

    def batch_ids() -> list[int]:
        held = apply_delta().sink_state()["streams"]
        return sorted(held[paths[p]]["batch_id"] if held.get(paths[p]) else -1 for p in TABLES)

    _wait_for(lambda: marker.exists() and batch_ids() == [0, 1, 1], 300, "two tables at batch 1, one paused at 0")
    _kill_driver_group(f"{pipeline}-apply")
    running.join(120)
    assert not running.is_alive() and len(failed) == 1 and isinstance(failed[0], AirflowException), failed
    assert batch_ids() == [0, 1, 1]
    # The retry keeps the checkpoint (each sink holds its part of batch 0 or 1), replays batch 1: the tables that
    # committed it skip it, the third commits it; and goes on to the end.
    apply = apply_delta()
    state = apply.execute({})

    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    for prefix in TABLES:
        got = state["streams"][paths[prefix]]
        end = {topics[prefix]: {str(p): o for p, o in jobs.end_offsets(bootstrap, topics[prefix], 1).items()}}
        assert got["offsets"] == end, (prefix, got)
        assert got["rows_this_run"] > 0, prefix
        _, columns, key = TABLES[prefix]
        source = source_rows(stack, names[prefix], columns)
        assert_same_rows(_spark_rows(spark, paths[prefix], columns, key), source, columns)
        assert_same_rows(_delta_rs_rows(paths[prefix], columns, key), source, columns)

    # the same changes into PostgreSQL current tables, one application again: the three queries share the
    # pipeline and its offsets table, and commit their batches interleaved
    pg_tables = {p: names[p].lower() for p in TABLES}
    pg_state = SparkKafkaToSinkOperator(
        task_id="apply_postgres",
        pipeline=f"{pipeline}-apply-postgres",
        sink="postgres",
        mode="current",
        streams=[
            {
                "topics": [topics[p]],
                "sink_path": paths[p],
                "sink_table": pg_tables[p],
                "checkpoint_location": str(tmp_path / f"ckpt-pg-{p}"),
            }
            for p in TABLES
        ],
        max_offsets_per_trigger=300,
        conf={"spark.jars": stack.spark_conf()["spark.jars"], "spark.ui.enabled": "false"},
        env_vars={"PYSPARK_PYTHON": sys.executable},
    ).execute({})
    for prefix in TABLES:
        assert pg_state["streams"][pg_tables[prefix]]["offsets"] == state["streams"][paths[prefix]]["offsets"]
        _, columns, key = TABLES[prefix]
        rows = jobs.postgres_rows(stack, f"{pg_tables[prefix]} WHERE NOT {DELETED_COLUMN}", columns)
        assert_same_rows(
            Counter(tuple(normalise(v) for v in row) for row in rows),
            source_rows(stack, names[prefix], columns),
            columns,
        )

    versions = {p: delta_commit.newest_version(paths[p]) for p in TABLES}
    again = apply.execute({})  # a retry / the next increment with nothing new: nothing is written
    assert all(again["streams"][paths[p]]["rows_this_run"] == 0 for p in TABLES), again
    assert {p: delta_commit.newest_version(paths[p]) for p in TABLES} == versions
    for prefix, name in names.items():
        _, columns, key = TABLES[prefix]
        assert_same_rows(_delta_rs_rows(paths[prefix], columns, key), source_rows(stack, name, columns), columns)
        cur.execute(f"DROP TABLE `{name}`")
    conn.close()


def test_a_stream_fed_another_tables_topic_fails_the_application_and_a_fixed_run_ends_exact(
    stack, spark, airflow_connections, tmp_path
):
    """lines' sink fed accounts' topic and the other way round, orders right: the run fails naming both tables,
    neither mis-fed table gets a commit; the run with the right mapping (new checkpoints: each query starts from
    its sink's offsets) leaves all three equal to the source."""
    names = {prefix: unique_name(prefix) for prefix in TABLES}
    pipeline = unique_name("multi")
    conn = connect(stack)
    cur = conn.cursor()
    for prefix, name in names.items():
        cur.execute(f"CREATE TABLE `{name}` {TABLES[prefix][0]}")
    _seed(cur, names)
    paths = {prefix: str(tmp_path / prefix) for prefix in TABLES}
    for prefix, name in names.items():
        run_full_load(
            spark, MySqlSourceHook(), FullLoadRequest(schema=stack.DB_NAME, table=name, sink_path=paths[prefix])
        )
    stop, errors = threading.Event(), []
    stop.set()
    _writer(stack, names, 7, stop, errors)
    assert not errors, errors
    capture = BinlogCaptureOperator(
        task_id="capture",
        tables=list(names.values()),
        pipeline=pipeline,
        full_load_paths={names[p]: paths[p] for p in TABLES},
    ).execute({})
    topics = {p: capture["topics"][f"{stack.DB_NAME}.{names[p]}"] for p in TABLES}
    loaded = {p: delta_commit.newest_version(paths[p]) for p in TABLES}

    def apply(feeds: dict[str, str], checkpoints: str) -> SparkKafkaToSinkOperator:
        return SparkKafkaToSinkOperator(
            task_id="apply",
            pipeline=f"{pipeline}-apply",
            sink="delta",
            mode="current",
            streams=[
                {
                    "topics": [topics[feeds[p]]],
                    "sink_path": paths[p],
                    "checkpoint_location": str(tmp_path / checkpoints / p),
                }
                for p in TABLES
            ],
            conf={"spark.jars": stack.spark_conf()["spark.jars"], "spark.ui.enabled": "false"},
            env_vars={"PYSPARK_PYTHON": sys.executable},
        )

    with pytest.raises(AirflowException, match="reached the current table of") as failed:
        apply({"orders": "orders", "lines": "accounts", "accounts": "lines"}, "wrong").execute({})
    assert re.search(rf"A change of {stack.DB_NAME}\.({names['lines']}|{names['accounts']})", str(failed.value))
    assert delta_commit.newest_version(paths["lines"]) == loaded["lines"], "a mis-fed table got a commit"
    assert delta_commit.newest_version(paths["accounts"]) == loaded["accounts"], "a mis-fed table got a commit"

    state = apply({p: p for p in TABLES}, "right").execute({})
    for prefix, name in names.items():
        _, columns, key = TABLES[prefix]
        assert state["streams"][paths[prefix]]["offsets"] == {
            topics[prefix]: {"0": jobs.end_offsets(f"{stack.HOST}:{stack.KAFKA_PORT}", topics[prefix], 1)[0]}
        }
        assert_same_rows(_delta_rs_rows(paths[prefix], columns, key), source_rows(stack, name, columns), columns)
        cur.execute(f"DROP TABLE `{name}`")
    conn.close()
