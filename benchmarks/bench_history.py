"""Costs that must not grow with history: ledger reads and files-sink commits with 1k..1M records of history.

Ledger: for each history size, a fresh 16-partition ledger and a fresh single-partition (legacy) ledger get
the same records: ``size`` ledger records of 1,000 other pipelines (spread over every partition, written
fast by a plain transactional producer), our pipeline's last commit, then 1,000 more records of the others
(our pipeline is one of many active ones; its last record is not the topic's last). A second, idle pipeline
committed once before all of it. Measured, interleaved, each ``--repeats`` times:

* ``old scan``: the pre-partitioning read (kept here as the baseline, not in the product): the whole topic
  from its start to its high watermark, on the legacy ledger (what an existing installation ran);
* ``read_committed_offset`` on the partitioned and on the legacy ledger (the backward read);
* ``writer open``: ``TransactionalProducerHook.open_writer`` (topic check + init_transactions + ledger read);
* ``status page``: ``read_ledger(keys=[...])`` (the keys its DAGs' producers name, read backwards),
  ``read_ledger(pipelines=[ours])`` (a pipeline named without a producer: its partition), and
  ``read_ledger()`` (every key);
* the idle pipeline's ``read_committed_offset`` (how far back its record sits until compaction runs).

Files sink: ``FilesSink.committed()`` with 10 .. 100k manifests under ``_manifests`` (written directly),
the new pointer read against the old listing (``glob`` + sort + read the newest, kept here as the baseline).

Delta sink: ``DeltaSink.committed()`` (and ``table_state``, what every own commit reads first) on a log of
10 .. 100k commits by hand (one marker commit each, a checkpoint every 10 and ``_last_checkpoint`` as Delta
writes them; the last commit after the checkpoint), on local disk and on the stack's MinIO; the baseline is
the lookup before ``_last_checkpoint`` was followed: list the whole ``_delta_log``, read the newest commit.

PostgreSQL sink: ``PostgresSink.committed()`` (window mode: offsets and window versions) of our pipeline with
1k .. 1M rows of other pipelines in the offsets and windows tables (a schema of its own, analysed); the plans
of its reads are in the JSON. No baseline: the reads were always by primary key; this checks they stay so.

Before each timed call the garbage of the previous one is collected; each history size starts with one
unrecorded warm-up round. Results: a table, and JSON in ``benchmarks/results/history-<commit>-<time>.json`` with the commit, nproc and
the load averages before and after (``benchmarks/results_table.py`` renders it for docs/benchmarks.md).
"""

from __future__ import annotations

import gc
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import _support

PIPELINE, IDLE, OTHERS = "bench-ours", "bench-idle", 1000


def old_scan(config: dict, pipeline: str, source_partition: str, topic: str) -> bytes | None:
    """The ledger read before partitioning: every record of every partition, from the start (the baseline)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer

    from exactly_once_provider.kafka.offsets import ledger_key, topic_end_offsets
    from exactly_once_provider.kafka.topic_reader import read_until

    key, targets = ledger_key(pipeline, source_partition), topic_end_offsets(config, topic)
    consumer = Consumer(
        {
            **config,
            "group.id": f"old-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        latest = None
        for message in read_until(consumer, topic, dict.fromkeys(targets, OFFSET_BEGINNING), targets, 300):
            if message.key() == key:
                latest = message.value()
        return latest
    finally:
        consumer.close()


def old_latest_manifest(root: str) -> dict | None:
    """The files sink's newest-manifest lookup before the pointer: list, sort, read the last (the baseline)."""
    directory = Path(root) / "_manifests"
    names = sorted(p.name for p in directory.glob("[0-9]*.json")) if directory.is_dir() else []
    return json.loads((directory / names[-1]).read_text()) if names else None


def fill_ledger(config: dict, topic: str, partitions: int, size: int) -> None:
    """Write the history (see the module docstring) with big transactions of a plain producer."""
    from confluent_kafka import Producer

    from exactly_once_provider.kafka.offsets import ledger_partition, new_committed_offset

    producer = Producer(
        {
            **config,
            "transactional.id": f"bench-fill-{uuid.uuid4().hex[:8]}",
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
        }
    )
    producer.init_transactions(60)

    def write(records: list[tuple[str, int]]) -> None:
        for start in range(0, len(records), 200_000):
            producer.begin_transaction()
            for pipeline, offset in records[start : start + 200_000]:
                value = new_committed_offset(
                    pipeline,
                    "0",
                    {"file": "binlog.000001", "pos": offset},
                    offset + 1,
                    str(offset + 1),
                    1,
                    100,
                    f"eo-txn/{pipeline}/0",
                    "exactly_once",
                )
                while True:
                    try:
                        producer.produce(
                            topic, value.to_value(), value.key, partition=ledger_partition(pipeline, partitions)
                        )
                        break
                    except BufferError:
                        producer.poll(0.1)
            producer.commit_transaction(120)

    others = [f"other{i}" for i in range(OTHERS)]
    write([(IDLE, 0)])
    write([(others[n % OTHERS], n) for n in range(size)])
    write([(PIPELINE, 7)])
    write([(others[n % OTHERS], size + n) for n in range(1000)])


def timed(samples: dict | None, name: str, work: Callable[[], object], check: Callable[[object], bool]) -> None:
    """Run ``work`` once, check its result, record its wall time under ``name`` (``samples`` None: a warm-up).

    The garbage of the previous candidate is collected first, so no candidate pays for another's (the old
    listing of 100,000 manifests leaves 100,000 Path objects behind).
    """
    gc.collect()
    started = time.perf_counter()
    result = work()
    if samples is not None:
        samples.setdefault(name, []).append(time.perf_counter() - started)
    if not check(result):
        raise AssertionError(f"{name} returned {result!r}")


def bench_ledger(stack, size: int, repeats: int) -> dict[str, list[float]]:
    from confluent_kafka.admin import AdminClient, NewTopic

    from exactly_once_provider.hooks.kafka_producer import TransactionalProducerHook
    from exactly_once_provider.kafka.offsets import (
        LEDGER_PARTITIONS,
        ensure_offsets_topic,
        read_committed_offset,
        read_ledger,
    )

    config = {"bootstrap.servers": f"{stack.HOST}:{stack.KAFKA_PORT}"}
    partitioned, legacy = f"bench-ledger-{uuid.uuid4().hex[:8]}", f"bench-legacy-{uuid.uuid4().hex[:8]}"
    ensure_offsets_topic(config, partitioned)
    admin = AdminClient(config)
    admin.create_topics([NewTopic(legacy, 1, 1, config={"cleanup.policy": "compact"})])[legacy].result(30)
    filled = time.perf_counter()
    fill_ledger(config, partitioned, LEDGER_PARTITIONS, size)
    fill_ledger(config, legacy, 1, size)
    print(f"  history {size:,}: both ledgers filled in {time.perf_counter() - filled:.1f}s", flush=True)
    ours = lambda r: r is not None and getattr(r, "offset", None) == {"file": "binlog.000001", "pos": 7}  # noqa: E731
    samples: dict[str, list[float]] = {}

    def open_writer(topic: str) -> object:
        writer = TransactionalProducerHook(
            pipeline=PIPELINE, delivery_mode="exactly_once", offsets_topic=topic
        ).open_writer()
        writer.close()
        return writer.last_committed

    try:
        # interleaved: every candidate once per round; round 0 is a warm-up, not recorded (the broker is
        # still writing the fill's transaction markers and client connections are cold)
        for round_ in range(repeats + 1):
            timed(
                samples if round_ else None,
                "old scan (legacy ledger)",
                lambda: old_scan(config, PIPELINE, "0", legacy),
                lambda r: r is not None,
            )
            timed(
                samples if round_ else None,
                "read_committed_offset (partitioned)",
                lambda: read_committed_offset(config, PIPELINE, "0", partitioned),
                ours,
            )
            timed(
                samples if round_ else None,
                "read_committed_offset (legacy)",
                lambda: read_committed_offset(config, PIPELINE, "0", legacy),
                ours,
            )
            timed(samples if round_ else None, "writer open (partitioned)", lambda: open_writer(partitioned), ours)
            timed(samples if round_ else None, "writer open (legacy)", lambda: open_writer(legacy), ours)
            timed(
                samples if round_ else None,
                "status page: read_ledger(keys=[ours/0]) (partitioned)",
                lambda: read_ledger(config, partitioned, keys=[(PIPELINE, "0")]),
                lambda r: ours(r.get(f"{PIPELINE}/0")) and len(r) == 1,
            )
            timed(
                samples if round_ else None,
                "read_ledger(pipelines=[ours]): its partition (partitioned)",
                lambda: read_ledger(config, partitioned, pipelines=[PIPELINE]),
                lambda r: ours(r.get(f"{PIPELINE}/0")) and len(r) == 1,
            )
            timed(
                samples if round_ else None,
                "read_ledger() every key (partitioned)",
                lambda: read_ledger(config, partitioned),
                lambda r: len(r) == OTHERS + 2,
            )
            timed(
                samples if round_ else None,
                "idle pipeline: read_committed_offset (partitioned)",
                lambda: read_committed_offset(config, IDLE, "0", partitioned),
                lambda r: r is not None,
            )
    finally:
        _support.delete_topics(stack, [partitioned, legacy])
    return samples


def bench_files(count: int, repeats: int) -> dict[str, list[float]]:
    from exactly_once_provider.sinks.files import FilesSink, write_pointer

    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(dir="/var/tmp") as root:
        manifests = Path(root) / "_manifests"
        manifests.mkdir()
        for sequence in range(count):
            manifest = {
                "format": 1,
                "sequence": sequence,
                "pipeline": PIPELINE,
                "checkpoint_id": "c",
                "batch_id": sequence,
                "offsets": {"t": {"0": sequence}},
                "rows_total": sequence,
                "files": [{"path": f"data/c-{sequence}/part-0.parquet", "rows": 1}],
            }
            (manifests / f"{sequence:020d}.json").write_text(json.dumps(manifest, sort_keys=True))
        write_pointer(Path(root), manifest)
        sink = FilesSink(root, PIPELINE)
        for _ in range(repeats * 5):
            timed(
                samples,
                "old listing: newest manifest",
                lambda: old_latest_manifest(root),
                lambda r: r["sequence"] == count - 1,
            )
            timed(samples, "FilesSink.committed()", sink.committed, lambda r: r.batch_id == count - 1)
    return samples


def write_delta_log(storage, count: int) -> None:
    """Write a Delta log of ``count`` marker commits, a checkpoint every 10 versions and ``_last_checkpoint``."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa
    import pyarrow.parquet as pq

    from exactly_once_provider.sinks.delta_log import LAST_CHECKPOINT, LOG

    schema = json.dumps(
        {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
    )
    protocol = {"minReaderVersion": 1, "minWriterVersion": 2}
    meta = {
        "id": "bench",
        "format": {"provider": "parquet", "options": {}},
        "schemaString": schema,
        "partitionColumns": [],
        "configuration": {},
    }

    def commit(version: int) -> None:
        marker = {
            f"eo_stream:{PIPELINE}": {
                "pipeline": PIPELINE,
                "batch_id": version,
                "checkpoint_id": "c",
                "offsets": {"t": {"0": version}},
                "rows_before": version,
            }
        }
        actions = ([{"protocol": protocol}, {"metaData": meta}] if version == 0 else []) + [
            {"txn": {"appId": PIPELINE, "version": version}},
            {
                "commitInfo": {
                    "operation": "WRITE",
                    "userMetadata": json.dumps(marker),
                    "operationMetrics": {"numOutputRows": "1"},
                }
            },
        ]
        storage.put(f"{LOG}{version:020d}.json", "".join(json.dumps(a) + "\n" for a in actions).encode())

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(commit, range(count)))
    checkpoint = (count - 1) // 10 * 10
    if checkpoint:
        txn = pa.struct([("appId", pa.string()), ("version", pa.int64()), ("lastUpdated", pa.int64())])
        table = pa.table(
            {
                "protocol": pa.array(
                    [protocol, None, None],
                    pa.struct([("minReaderVersion", pa.int32()), ("minWriterVersion", pa.int32())]),
                ),
                "metaData": pa.array(
                    [None, {**meta, "configuration": [], "format": {"provider": "parquet", "options": []}}, None],
                    pa.struct(
                        [
                            ("id", pa.string()),
                            ("schemaString", pa.string()),
                            ("partitionColumns", pa.list_(pa.string())),
                            (
                                "format",
                                pa.struct([("provider", pa.string()), ("options", pa.map_(pa.string(), pa.string()))]),
                            ),
                            ("configuration", pa.map_(pa.string(), pa.string())),
                        ]
                    ),
                ),
                "txn": pa.array([None, None, {"appId": PIPELINE, "version": checkpoint, "lastUpdated": 0}], txn),
            }
        )
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        storage.put(f"{LOG}{checkpoint:020d}.checkpoint.parquet", sink.getvalue().to_pybytes())
        storage.put(LAST_CHECKPOINT, json.dumps({"version": checkpoint, "size": 3}).encode())


def old_delta_committed(storage) -> int | None:
    """The newest marker commit before ``_last_checkpoint`` was followed: the whole log listed (the baseline)."""
    from exactly_once_provider.sinks import delta_commit, delta_log

    versions = delta_log.commit_versions(delta_log.log_names(storage))
    for version in reversed(versions):
        raw = delta_commit.read_commit(storage, version).get("commitInfo", {}).get("userMetadata")
        if raw and f"eo_stream:{PIPELINE}" in json.loads(raw):
            return version
    return None


def bench_delta(stack, where: str, count: int, repeats: int) -> dict[str, list[float]]:
    from exactly_once_provider.sinks import delta_log
    from exactly_once_provider.sinks.delta import DeltaSink
    from exactly_once_provider.storage import open_storage

    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(dir="/var/tmp") as root:
        location = f"s3://{stack.MINIO_BUCKETS[0]}/bench-history-{uuid.uuid4().hex[:8]}" if where == "minio" else root
        settings = stack.minio_settings() if where == "minio" else None
        storage = open_storage(location, settings)
        written = time.perf_counter()
        write_delta_log(storage, count)
        print(
            f"  delta log of {count:,} commits on {where} written in {time.perf_counter() - written:.1f}s", flush=True
        )
        sink = DeltaSink(location, PIPELINE, s3=settings)
        try:
            for round_ in range(repeats * 3 + 1):  # round 0: a warm-up (client connections), not recorded
                record = samples if round_ else None
                timed(
                    record, "old listing: newest marker", lambda: old_delta_committed(storage), lambda r: r == count - 1
                )
                timed(record, "DeltaSink.committed()", sink.committed, lambda r: r.batch_id == count - 1)
                timed(
                    record,
                    "table_state()",
                    lambda: delta_log.table_state(storage),
                    lambda r: r.version == count - 1 and r.txns == {PIPELINE: count - 1},
                )
        finally:
            if where == "minio":
                storage.delete_prefix("")
    return samples


def bench_postgres(stack, size: int, repeats: int) -> tuple[dict[str, list[float]], list[str]]:
    import psycopg2

    from exactly_once_provider.sinks.base import BatchCommit
    from exactly_once_provider.sinks.postgres import OFFSETS_TABLE, WINDOWS_TABLE, PostgresSink

    schema = f"bench_history_{uuid.uuid4().hex[:8]}"
    params = dict(
        host=stack.HOST, port=stack.POSTGRES_PORT, dbname=stack.DB_NAME, user=stack.DB_USER, password=stack.DB_PASSWORD
    )
    admin = psycopg2.connect(**params)
    admin.autocommit = True
    admin.cursor().execute(f"CREATE SCHEMA {schema}")
    samples: dict[str, list[float]] = {}
    try:
        scoped = {**params, "options": f"-c search_path={schema}"}
        sink = PostgresSink("bench_rows", PIPELINE, connect_kwargs=scoped, mode="window")
        sink.prepare()
        with psycopg2.connect(**scoped) as conn, conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO {OFFSETS_TABLE} (pipeline, topic, kafka_partition, next_offset, checkpoint_id,"
                " batch_id, rows_total) SELECT 'other' || n, 't', 0, n, 'c', n, n"
                f" FROM generate_series(1, {size}) AS n"
            )
            cur.execute(
                f"INSERT INTO {WINDOWS_TABLE} (pipeline, window_id, version, rows) SELECT 'other' || "
                f"(n % {OTHERS}), 'w' || n, 1, 1 FROM generate_series(1, {size}) AS n"
            )
            cur.execute(f"ANALYZE {OFFSETS_TABLE}; ANALYZE {WINDOWS_TABLE}")
        sink.commit_windows(None, {}, {}, BatchCommit(PIPELINE, "c", 7, {"t": {0: 7}}, 0))
        with psycopg2.connect(**scoped) as conn, conn.cursor() as cur:
            plans = []
            for table in (OFFSETS_TABLE, WINDOWS_TABLE):
                cur.execute(f"EXPLAIN SELECT * FROM {table} WHERE pipeline = %s", (PIPELINE,))
                plans.append(" / ".join(row[0].strip() for row in cur.fetchall()))
        for round_ in range(repeats * 3 + 1):
            timed(
                samples if round_ else None,
                "PostgresSink.committed()",
                sink.committed,
                lambda r: r.batch_id == 7 and r.offsets == {"t": {0: 7}},
            )
    finally:
        admin.cursor().execute(f"DROP SCHEMA {schema} CASCADE")
        admin.close()
    return samples, plans


def summarise(samples: dict[str, list[float]]) -> dict[str, dict]:
    return {name: {"median_s": statistics.median(runs), "runs_s": runs} for name, runs in samples.items()}


def main() -> None:
    args = _support.parse_args(
        __doc__,
        rows=1,
        repeats=5,
        extra=lambda p: (
            p.add_argument("--ledger-sizes", default="1000,100000,1000000"),
            p.add_argument("--manifests", default="10,10000,100000"),
            p.add_argument("--delta-commits", default="10,10000,100000"),
            p.add_argument("--delta-s3-commits", default="10,1000,10000"),
            p.add_argument("--postgres-rows", default="1000,100000,1000000"),
        ),
    )
    stack = _support.start_stack()
    result = _support.result_header(
        "history",
        {
            "repeats": args.repeats,
            "ledger": {},
            "files": {},
            "delta (local)": {},
            "delta (minio)": {},
            "postgres": {},
            "postgres plans": {},
        },
    )
    commit = result["commit"]
    for size in [int(s) for s in args.ledger_sizes.split(",") if s]:  # "" skips a part
        result["ledger"][str(size)] = summarise(bench_ledger(stack, size, args.repeats))
        print(json.dumps({k: round(v["median_s"], 4) for k, v in result["ledger"][str(size)].items()}), flush=True)
    for count in [int(c) for c in args.manifests.split(",") if c]:
        result["files"][str(count)] = summarise(bench_files(count, args.repeats))
    for where, counts in (("local", args.delta_commits), ("minio", args.delta_s3_commits)):
        for count in [int(c) for c in counts.split(",") if c]:
            result[f"delta ({where})"][str(count)] = summarise(bench_delta(stack, where, count, args.repeats))
    for size in [int(s) for s in args.postgres_rows.split(",") if s]:
        samples, plans = bench_postgres(stack, size, args.repeats)
        result["postgres"][str(size)], result["postgres plans"][str(size)] = summarise(samples), plans
    path = _support.write_result(result)
    for kind, unit in (
        ("ledger", "history records"),
        ("files", "manifests"),
        ("delta (local)", "commits"),
        ("delta (minio)", "commits"),
        ("postgres", "rows of other pipelines"),
    ):
        sizes = list(result[kind])
        if not sizes:
            continue
        names = list(result[kind][sizes[0]])
        rows = [
            [
                name,
                *(result[kind][s][name]["median_s"] * 1000 for s in sizes),
                result[kind][sizes[-1]][name]["median_s"] / result[kind][sizes[0]][name]["median_s"],
            ]
            for name in names
        ]
        _support.print_table(
            f"{kind}: median ms by {unit} ({commit}, nproc {result['nproc']})",
            ["what", *sizes, f"{sizes[-1]} / {sizes[0]}"],
            rows,
        )
    print(f"\nJSON: {path}")


if __name__ == "__main__":
    main()
