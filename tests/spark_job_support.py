"""Helpers for tests of the packaged Spark jobs: interleaved committed/aborted input, spark-submit runs, sink reads."""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer

from exactly_once_provider.connections import write_secret_file
from exactly_once_provider.spark_jobs import kafka_to_sink
from tests.kafka_support import QUIET, transactional_producer

SPARK_SUBMIT = str(Path(sys.executable).parent / "spark-submit")
JOB = kafka_to_sink.__file__


@functools.cache
def _s3_driver_options(stack) -> str:
    return stack.spark_test_java_options(s3=True)


def s3_driver_conf(stack) -> dict[str, str]:
    """The driver JVM options of a job with the s3a jars: their own class archive (``stack.spark_class_archive``)."""
    return {"spark.driver.extraJavaOptions": _s3_driver_options(stack)}


def task_spark_conf(stack, s3: bool = False) -> dict[str, str]:
    """Return the Spark settings of the operators' Spark applications in tests (the templates' tasks included):
    the stack's connector jars (``s3``: the s3a ones too), two shuffle partitions and no Spark UI.

    The reconcile and the settlement report cache a shuffled comparison: at Spark's default of 200 shuffle
    partitions (and Delta's snapshot partitions, which follow it) a window of a few dozen rows runs 200 tasks,
    ~65 of each task's ~75 s on two cores. The partition count changes how rows are spread over tasks, never
    which rows are compared or summed. The load's operator already defaults to two.
    """
    return {
        **stack.spark_conf(s3=s3),
        **(s3_driver_conf(stack) if s3 else {}),
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.enabled": "false",
    }


def produce_interleaved(
    bootstrap: str,
    topic: str,
    transactions: int,
    per_transaction: int,
    partitions: int = 1,
    abort_every: int = 3,
    tag: str = "r",
) -> list[tuple[str, str]]:
    """Write ``transactions`` transactions (every ``abort_every``-th aborted); return committed (key, value)."""
    producer = transactional_producer(bootstrap)
    committed: list[tuple[str, str]] = []
    for txn in range(transactions):
        commit = txn % abort_every != 1
        rows = [
            (f"{tag}{txn}-{i}", json.dumps({"txn": txn, "i": i, "committed": commit})) for i in range(per_transaction)
        ]
        producer.begin_transaction()
        for n, (key, value) in enumerate(rows):
            producer.produce(topic, value.encode(), key.encode(), partition=n % partitions)
        producer.flush(30)
        if commit:
            producer.commit_transaction(60)
            committed += rows
        else:
            producer.abort_transaction(60)
    return committed


def produce_plain(bootstrap: str, topic: str, count: int, partitions: int = 1) -> None:
    """Write ``count`` small non-transactional records fast (benchmark input)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.num.messages": 10000,
            "compression.type": "lz4",
            **QUIET,
        }
    )
    for i in range(count):
        producer.produce(
            topic, b'{"n":%d,"payload":"abcdefghijklmnopqrstuvwxyz"}' % i, b"k%d" % i, partition=i % partitions
        )
        if i % 100000 == 0:
            producer.poll(0)
    producer.flush(120)


def job_args(
    stack,
    pipeline: str,
    topic: str,
    checkpoint: Path | str,
    sink: str,
    target: str,
    max_offsets: int | None = None,
    delivery: str = "exactly-once",
    mode: str = "append",
    s3: dict | None = None,
) -> list[str]:
    """:param s3: the S3 settings (``S3Settings.to_json()``) of a sink on S3, for the secrets file."""
    # The job reads the connections' settings from a 0600 file, as the operator passes them.
    secrets = {"kafka": {"bootstrap.servers": f"{stack.HOST}:{stack.KAFKA_PORT}"}}
    if sink == "postgres":
        secrets["libpq"] = pg_env(stack)
    if s3:
        secrets["s3"] = s3
    # beside a local checkpoint; a checkpoint on S3 (a URI): in a private temporary directory
    folder = str(checkpoint.parent) if isinstance(checkpoint, Path) else tempfile.mkdtemp(prefix="eo-job-")
    secrets_file = write_secret_file(folder, secrets, prefix="connections-")
    args = [
        "--pipeline",
        pipeline,
        "--secrets-file",
        secrets_file,
        "--topics",
        topic,
        "--checkpoint",
        str(checkpoint),
        "--sink",
        sink,
        "--delivery",
        delivery,
        "--mode",
        mode,
    ]
    args += ["--table", target] if sink == "postgres" else ["--path", target]
    if max_offsets:
        args += ["--max-offsets-per-trigger", str(max_offsets)]
    return args


def pg_env(stack) -> dict[str, str]:
    return {
        "PGHOST": stack.HOST,
        "PGPORT": str(stack.POSTGRES_PORT),
        "PGDATABASE": stack.DB_NAME,
        "PGUSER": stack.DB_USER,
        "PGPASSWORD": stack.DB_PASSWORD,
    }


def kill_driver_at(step: str, batch_id: int) -> dict[str, str]:
    """The environment that makes the job's driver (JVM and spark-submit included) die at a batch's fault point."""
    return {"EO_FAULT_AT": f"{step}_{batch_id}", "EO_FAULT_ACTION": "kill-group"}


def submit_command(stack, args: list[str], master: str = "local[2]", conf: dict[str, str] | None = None) -> list[str]:
    # A job whose arguments name an S3 location gets the s3a connector (its settings travel in the secrets file).
    s3 = any(arg.startswith(("s3://", "s3a://")) for arg in args)
    connectors = [
        arg
        for key, value in {**stack.spark_conf(s3=s3), **(s3_driver_conf(stack) if s3 else {}), **(conf or {})}.items()
        for arg in ("--conf", f"{key}={value}")
    ]
    return [
        SPARK_SUBMIT,
        "--master",
        master,
        "--driver-memory",
        "1g",
        "--conf",
        "spark.sql.shuffle.partitions=2",
        "--conf",
        "spark.sql.adaptive.enabled=false",  # as SparkKafkaToSinkOperator.default_conf
        "--conf",
        "spark.ui.enabled=false",
        *connectors,
        JOB,
        *args,
    ]


def submit_env(stack, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, **stack.spark_env(), **pg_env(stack), **(extra or {})}
    env.pop("SPARK_LOG_DIR", None)
    return env


def run_job(
    stack,
    args: list[str],
    extra_env: dict[str, str] | None = None,
    timeout: float = 300,
    log_file: Path | None = None,
    conf: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run the job to its end with spark-submit (its own process group, like a driver on a worker)."""
    result = subprocess.run(
        submit_command(stack, args, conf=conf),
        env=submit_env(stack, extra_env),
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=True,
    )
    if log_file is not None:
        with open(log_file, "a") as handle:
            handle.write(result.stdout + result.stderr)
    return result


def run_in_session(args: list[str], caplog) -> tuple[dict | None, str]:
    """Run the job to its end in this test process's shared Spark session (the ``spark`` fixture).

    For a restart after a killed driver: what it proves is what the dead driver left on disk, in the sink and in
    the checkpoint, and a run here reads exactly that, without another application's start-up (~9 s of JVM and
    session each, the largest fixed cost of the suite). The kills themselves stay in spark-submit processes.
    Returns the job's committed state and what it logged.
    """
    with caplog.at_level(logging.INFO, logger=kafka_to_sink.log.name):
        start = len(caplog.text)
        state = kafka_to_sink.run(kafka_to_sink.parse_args(args))
        return state, caplog.text[start:]


def start_job(stack, args: list[str], log_file: Path, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    handle = open(log_file, "a")
    return subprocess.Popen(
        submit_command(stack, args),
        env=submit_env(stack, extra_env),
        stdout=handle,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def sigkill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the job's whole process group (spark-submit, the driver JVM and the Python driver)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


def wait_for_log(log_file: Path, needle: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log_file.exists() and needle in log_file.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(f"{needle!r} did not appear in {log_file} within {timeout}s")


def result_line(stdout: str) -> dict | None:
    lines = [line for line in stdout.splitlines() if line.startswith("EO_RESULT ")]
    assert lines, f"the job printed no EO_RESULT line:\n{stdout[-3000:]}"
    return json.loads(lines[-1].removeprefix("EO_RESULT "))


# ------------------------------------------------------------------------------------------- sink reads
def delta_live_files(path) -> list[str]:
    """Return a Delta table's live files (add minus remove actions of its JSON log), read without Spark.

    :param path: a local table path, or the storage rooted at a table (e.g. on S3: then the keys are returned).
    """
    from urllib.parse import unquote

    from exactly_once_provider.sinks import delta_log

    live: dict[str, bool] = {}
    for version in delta_log.commit_versions(delta_log.log_names(path)):
        for action in delta_log.read_log_file(path, f"{version:020d}.json"):
            if "add" in action:
                live[action["add"]["path"]] = True
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
    if isinstance(path, str):
        return [str(Path(path) / unquote(name)) for name in live]
    return [unquote(name) for name in live]


def delta_rows(path, columns=("kafka_partition", "kafka_offset", "record_key", "record_value")) -> list[tuple]:
    """Return the rows of a Delta table's live files (``path``: a local path or the storage of a table)."""
    if isinstance(path, str):
        return arrow_rows(delta_live_files(path), columns)
    import pyarrow.parquet as pq

    rows: list[tuple] = []
    for key in delta_live_files(path):
        filesystem, location = path.arrow_path(key)
        table = pq.read_table(location, columns=list(columns), filesystem=filesystem)
        rows += list(zip(*(table.column(i).to_pylist() for i in range(len(columns)))))
    return rows


def arrow_rows(
    files: list[str], columns=("kafka_partition", "kafka_offset", "record_key", "record_value")
) -> list[tuple]:
    import pyarrow.parquet as pq

    rows: list[tuple] = []
    for file in files:
        table = pq.read_table(file, columns=list(columns))
        rows += list(zip(*(table.column(i).to_pylist() for i in range(len(columns)))))
    return rows


def files_rows(root, columns=("kafka_partition", "kafka_offset", "record_key", "record_value")) -> list[tuple]:
    """Return the rows a files sink's newest manifest publishes (``root``: a path or a storage, e.g. on S3)."""
    from exactly_once_provider.sinks.files import read_published

    table = read_published(root, list(columns))
    return [] if table is None else list(zip(*(table.column(c).to_pylist() for c in columns)))


def postgres_rows(
    stack, table: str, columns=("kafka_partition", "kafka_offset", "record_key", "record_value")
) -> list[tuple]:
    import psycopg2

    conn = psycopg2.connect(
        host=stack.HOST, port=stack.POSTGRES_PORT, dbname=stack.DB_NAME, user=stack.DB_USER, password=stack.DB_PASSWORD
    )
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT {', '.join(columns)} FROM {table}")
            return cur.fetchall()
    finally:
        conn.close()


def sink_rows(stack, sink: str, target) -> list[tuple]:
    """:param target: the Delta path, the files sink's root (a path or its storage) or the PostgreSQL table."""
    if sink == "delta":
        return delta_rows(target)
    if sink == "files":
        return files_rows(target)
    return postgres_rows(stack, target)


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "eo-watermarks", **QUIET})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions)}
    finally:
        consumer.close()


def wait_for_committed_end(bootstrap: str, topic: str, partitions: int, timeout: float = 30) -> None:
    """Wait until read_committed consumers see the end of every partition (LSO == high watermark).

    ``commit_transaction`` returns before the broker has written the commit markers into the data
    partitions; until then a read_committed reader (Spark's ``availableNow`` target) stops short.
    """
    from confluent_kafka import Consumer, TopicPartition

    def ends(isolation: str) -> dict[int, int]:  # ListOffsets(latest) answers the LSO to read_committed
        consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": "eo-lso", "isolation.level": isolation, **QUIET}
        )
        try:
            return {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False)[1]
                for p in range(partitions)
            }
        finally:
            consumer.close()

    deadline = time.monotonic() + timeout
    while (stable := ends("read_committed")) != (high := ends("read_uncommitted")):
        if time.monotonic() > deadline:
            raise AssertionError(f"{topic}: read_committed end {stable} never reached the high watermark {high}")
        time.sleep(0.2)


def assert_exactly(rows: list[tuple], committed: list[tuple[str, str]]) -> None:
    """The sink holds every committed record once and nothing else (aborted records absent), row by row."""
    from collections import Counter

    got = Counter((key, value) for _, _, key, value in rows)
    want = Counter(committed)
    duplicates = {k: n for k, n in got.items() if n > 1}
    assert not duplicates, f"{len(duplicates)} records written more than once, e.g. {list(duplicates.items())[:3]}"
    missing, extra = want - got, got - want
    assert not missing and not extra, (
        f"{len(missing)} committed records missing (e.g. {list(missing)[:3]}), "
        f"{len(extra)} unexpected records (e.g. {list(extra)[:3]})"
    )
    assert all(json.loads(value)["committed"] for _, _, _, value in rows), "an aborted record reached the sink"
    positions = [(p, o) for p, o, _, _ in rows]
    assert len(set(positions)) == len(positions), "a Kafka (partition, offset) is in the sink twice"
