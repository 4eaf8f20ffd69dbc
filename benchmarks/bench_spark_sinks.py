"""Benchmark: the exactly-once Kafka -> sink job vs the same job appending at-least-once, per sink.

Not a test. One run produces N records once (transactions of 10 000) and runs, per sink, both delivery
modes of the packaged job with spark-submit (local[2], driver 1g) on that same topic, ``--repeat`` times in
ABBA order (the first run of a pair is often the slower one on a busy machine); it prints rows/s of every
run (rows in the sink / query time, JVM start-up excluded) with its per-batch seconds (the job's own log
lines: a fixed per-commit cost shows in the small last batch) and, per sink, the median of each mode and
their ratio exactly-once / at-least-once. For Delta the at-least-once append collects the same statistics as
the own commit (``SAME_STATS``: integral columns only, no ``.crc``), like for like. For Delta a third candidate runs in the same rotation: the
exactly-once job committing through Delta's own writer (``--delta-commit delta``, the txn-id write option:
what the sink did before it wrote its commits itself), printed as its own row. Each run's output is deleted once counted, and the topic at the
end unless ``--keep-topic`` (a 1M-record topic per run filled the shared disk otherwise); ``--topic``
re-reads a kept topic instead of producing again. Writes ``benchmarks/results/spark_sinks-*.json``.

    make bench-spark-sinks                       # 1 000 000 records
    .venv/bin/python benchmarks/bench_spark_sinks.py --records 200000 --sinks files
    make bench-spark-sinks BENCH_ARGS="--sinks delta --repeat 3"
    make bench-spark-sinks BENCH_ARGS="--sinks files,files-s3"   # files-s3: the files sink on the stack's MinIO
    make bench-spark-sinks BENCH_ARGS="--sinks delta,delta-s3"   # delta-s3: the Delta table on MinIO
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _support

from tests import spark_job_support as jobs
from tests.conftest import STACK as stack  # the local stack module, not a fixture
from tests.kafka_support import new_topic, transactional_producer


def produce(bootstrap: str, topic: str, records: int, partitions: int, per_transaction: int = 10_000) -> None:
    producer = transactional_producer(bootstrap)
    payload = b'{"n":%d,"payload":"abcdefghijklmnopqrstuvwxyz0123456789","committed":true}'
    for start in range(0, records, per_transaction):
        producer.begin_transaction()
        for i in range(start, min(start + per_transaction, records)):
            while True:
                try:
                    producer.produce(topic, payload % i, b"k%d" % i, partition=i % partitions)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.commit_transaction(120)


def s3_storage(target: str):
    """The storage of an S3 target on the stack's MinIO."""
    from exactly_once_provider.storage import open_storage

    return open_storage(target, stack.minio_settings())


def sink_row_count(sink: str, target: str) -> int:
    if sink == "delta-s3":  # the live files of the log (not a checkpoint's Parquet, not an uncommitted file)
        import pyarrow.parquet as pq

        storage = s3_storage(target)
        return sum(
            pq.read_metadata(path, filesystem=fs).num_rows
            for fs, path in map(storage.arrow_path, jobs.delta_live_files(storage))
        )
    if sink == "files-s3":
        import pyarrow.parquet as pq

        storage = s3_storage(target)
        parts = [k for k in storage.list() if k.endswith(".parquet") and "/_temporary/" not in k]
        return sum(pq.read_metadata(path, filesystem=fs).num_rows for fs, path in map(storage.arrow_path, parts))
    if sink == "postgres":
        import psycopg2

        with (
            psycopg2.connect(
                host=stack.HOST,
                port=stack.POSTGRES_PORT,
                dbname=stack.DB_NAME,
                user=stack.DB_USER,
                password=stack.DB_PASSWORD,
            ) as conn,
            conn.cursor() as cur,
        ):
            cur.execute(f"SELECT count(*) FROM {target}")
            return cur.fetchone()[0]
    import pyarrow.parquet as pq

    return sum(pq.read_metadata(f).num_rows for f in Path(target).rglob("*.parquet"))


PG_TABLES: list[str] = []


def drop_postgres_tables() -> None:
    import psycopg2

    with (
        psycopg2.connect(
            host=stack.HOST,
            port=stack.POSTGRES_PORT,
            dbname=stack.DB_NAME,
            user=stack.DB_USER,
            password=stack.DB_PASSWORD,
        ) as conn,
        conn.cursor() as cur,
    ):
        for table in PG_TABLES:
            cur.execute(f"DROP TABLE IF EXISTS {table}")
            cur.execute("DELETE FROM eo_stream_offsets WHERE pipeline = %s", (f"bench-{table}",))
    PG_TABLES.clear()


def delete_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})  # keep it alive until the futures resolve
    for future in admin.delete_topics([topic]).values():
        future.result(60)


# The job's per-batch log line: "batch 3 committed to the delta sink in 4.2s" / "batch 3 appended (...) in 1.1s".
BATCH_LINE = re.compile(r"\bbatch (\d+) (?:appended|committed|was already committed)\b.*? in ([0-9.]+)s")


# candidate -> (job --delivery, extra job args)
CANDIDATES = {
    "exactly-once": ("exactly-once", []),
    "at-least-once": ("at-least-once", []),
    "eo-delta-writer": ("exactly-once", ["--delta-commit", "delta"]),
}
# The plain Delta append with the statistics the own commit records (min/max/null counts of the integral columns,
# Kafka partition and offset; no .crc file), so both sides of the Delta ratio collect the same statistics.
SAME_STATS = {
    "spark.databricks.delta.properties.defaults.dataSkippingStatsColumns": "kafka_partition,kafka_offset",
    "spark.databricks.delta.writeChecksumFile.enabled": "false",
}


def run_once(sink: str, candidate: str, topic: str, work: Path, batch: int, run: int) -> tuple[int, float, list[float]]:
    name = f"{sink}_{candidate.replace('-', '_')}_{run}_{topic.replace('-', '_')}"
    target = name if sink == "postgres" else str(work / name)
    if sink == "postgres":
        PG_TABLES.append(name)
    s3 = None
    if sink.endswith("-s3"):
        target = f"s3://{stack.MINIO_BUCKETS[0]}/bench/{name}"
        s3 = s3_storage(target).settings.to_json()
    delivery, extra = CANDIDATES[candidate]
    args = (
        jobs.job_args(
            stack,
            f"bench-{name}",
            topic,
            work / f"cp-{name}",
            sink.removesuffix("-s3"),
            target,
            max_offsets=batch,
            delivery=delivery,
            s3=s3,
        )
        + extra
    )
    same_stats = sink.startswith("delta") and candidate == "at-least-once"
    result = jobs.run_job(stack, args, timeout=1800, conf=SAME_STATS if same_stats else None)
    if result.returncode != 0:
        raise SystemExit(f"{sink} {delivery} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    seconds = float(next(line.split()[1] for line in result.stdout.splitlines() if line.startswith("EO_TIMING ")))
    batches = [float(m.group(2)) for m in BATCH_LINE.finditer(result.stdout)]
    rows = sink_row_count(sink, target)
    if sink == "postgres":
        drop_postgres_tables()
    elif sink.endswith("-s3"):
        s3_storage(target).delete_prefix("")
    else:
        shutil.rmtree(target, ignore_errors=True)
    shutil.rmtree(work / f"cp-{name}", ignore_errors=True)
    return rows, seconds, batches


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--batch", type=int, default=250_000, help="maxOffsetsPerTrigger")
    parser.add_argument("--sinks", default="delta,postgres,files")
    parser.add_argument("--repeat", type=int, default=3, help="runs per mode, in ABBA order")
    parser.add_argument("--topic", help="re-read this existing topic (holding --records committed records)")
    parser.add_argument("--keep-topic", action="store_true", help="do not delete the topic at the end")
    args = parser.parse_args()
    stack.up()
    result = _support.result_header(
        "spark_sinks", {k: v for k, v in vars(args).items() if k != "repeat"} | {"repeats": args.repeat}
    )
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = args.topic
    if topic is None:
        topic = new_topic(bootstrap, partitions=args.partitions, prefix="bench")
        t0 = time.monotonic()
        produce(bootstrap, topic, args.records, args.partitions)
        print(f"produced {args.records} records to {topic} in {time.monotonic() - t0:.1f}s", flush=True)
    work = Path(tempfile.mkdtemp(prefix="eo-bench-"))
    table = []
    try:
        for sink in (s.strip() for s in args.sinks.split(",")):
            delta = sink.startswith("delta")
            candidates = ["exactly-once"] + (["eo-delta-writer"] if delta else []) + ["at-least-once"]
            measured: dict[str, list[float]] = {c: [] for c in candidates}
            for run in range(args.repeat):
                for candidate in candidates if run % 2 == 0 else candidates[::-1]:
                    rows, seconds, batches = run_once(sink, candidate, topic, work, args.batch, run)
                    if rows != args.records:
                        raise SystemExit(f"{sink} {candidate}: {rows} rows in the sink, expected {args.records}")
                    measured[candidate].append(rows / seconds)
                    print(
                        f"  {sink:<8} {candidate:<15} run {run}: {rows} rows in {seconds:6.1f}s"
                        f" = {rows / seconds:9.0f} rows/s; batches (s): " + " ".join(f"{b:.1f}" for b in batches),
                        flush=True,
                    )
            table.append((sink, measured["exactly-once"], measured["at-least-once"]))
            if delta:
                table.append(
                    (
                        f"{sink}, Delta's writer commits (txn-id option)",
                        measured["eo-delta-writer"],
                        measured["at-least-once"],
                    )
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if PG_TABLES:
            drop_postgres_tables()
        if not args.keep_topic:
            delete_topic(bootstrap, topic)
    result["runs"] = {sink: {"exactly_once_rows_per_s": eo, "at_least_once_rows_per_s": alo} for sink, eo, alo in table}
    _support.report(
        result,
        f"Kafka -> Spark -> sink, {args.records:,} records, {args.partitions} partitions, batches of "
        f"{args.batch:,}, local[2], driver 1g, median of {args.repeat} runs per mode (ABBA)",
        ["sink", "exactly-once rows/s", "runs", "at-least-once rows/s", "runs", "ratio of medians"],
        [
            [
                sink,
                statistics.median(eo),
                _support.runs_text(eo),
                statistics.median(alo),
                _support.runs_text(alo),
                statistics.median(eo) / statistics.median(alo),
            ]
            for sink, eo, alo in table
        ],
        plot={"column": 5, "label": "exactly-once / plain append, rows/s (ratio of medians)"},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
