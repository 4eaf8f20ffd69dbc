"""Benchmark (not a test): the exactly_once write path vs what a user would use instead, on the stack's broker.

Per message size (100 B, 1 KB), interleaved (the order reverses every repeat: ABBA), ``--repeats`` times, all
over the same ``kafka_default`` connection (SASL_SSL, SCRAM-SHA-512, the stack's CA) to one 3-partition topic:

- "plain idempotent producer": confluent-kafka with ``enable.idempotence``, ``acks=all``, no transactions, one
  flush at the end (the issue's baseline; it records no source offset at all);
- "ProduceToTopicOperator": the Airflow Kafka provider's operator, ``execute`` with ``synchronous=False`` and
  its default delivery callback (an INFO line per record into the task log, here a file), on a copy of the
  connection with ``queue.buffering.max.messages`` raised (with the default it fails with BufferError: below);
- "exactly_once, commit every 100 ms / 1 s": the product's write path with the operator's loop
  (``PipelineWriter.submit_batch`` of ``(value, key)`` pairs: each batch plus one offsets-ledger record, one Kafka
  transaction per commit);
- "TransactionalProduceOperator": the product's operator end to end (``execute`` with a producer function of
  ``(offset, key, value)`` tuples, commits every 100 ms): what a user of the product runs.

Every timer covers the setup of its side (producer creation and its TLS/SASL handshake; for exactly_once also
``init_transactions`` and the ledger read) up to the last acknowledged record or commit. Prints msgs/s and the
ratios, writes ``benchmarks/results/producer-*.json``. Usage: ``make bench-producer`` or
``python benchmarks/bench_producer.py [--messages 3000000] [--repeats 3]`` (1 KB runs: a third as many);
``--candidates exactly_once,Transactional`` runs a subset next to the plain producer (printed, no JSON).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import uuid

import _support

KEYS = [f"k{k}".encode() for k in range(16)]
PLAIN, OPERATOR = "plain idempotent producer", "ProduceToTopicOperator (synchronous=False, bigger queue)"
# ProduceToTopicOperator does not catch BufferError: with librdkafka's default queue (100,000 messages) its
# synchronous=False run fails once the broker falls behind (seen at 1 KB). A user's way out, and this
# benchmark's: a connection whose queue holds a whole run (memory stays under the default 1 GB byte limit).
OPERATOR_CONN = "kafka_bench_operator"
EO_100, EO_1000 = "exactly_once, commit every 100 ms", "exactly_once, commit every 1 s"
EO_OPERATOR = "TransactionalProduceOperator, exactly_once, 100 ms"


def run_writer(topic: str, count: int, size: int, interval_ms: int) -> int:
    """Produce ``count`` messages through the product's write path, committing every ``interval_ms``."""
    from exactly_once_provider.hooks.kafka_producer import TransactionalProducerHook

    writer = TransactionalProducerHook(
        pipeline=f"bench-{uuid.uuid4().hex[:8]}", delivery_mode="exactly_once"
    ).open_writer()
    payload, batch = b"x" * size, []
    txn_started = _support.time.perf_counter()
    for n in range(1, count + 1):
        batch.append((payload, KEYS[n % 16]))  # a (value, key) pair: the cheapest record the writer takes
        # The operator's loop (TransactionalProduceOperator._run): the clock is read every 256 records only.
        if n % 256 == 0 and (_support.time.perf_counter() - txn_started) * 1000 >= interval_ms:
            writer.submit_batch(topic, batch, n)
            batch, txn_started = [], _support.time.perf_counter()
    if batch:
        writer.submit_batch(topic, batch, count)
    writer.wait()
    writer.close()
    return count


def run_product_operator(topic: str, count: int, size: int) -> int:
    """The product's operator end to end: a producer function's (offset, key, value) tuples, commits every 100 ms."""
    from exactly_once_provider.operators.kafka_produce import TransactionalProduceOperator

    payload = b"x" * size
    # max_records_per_transaction far above a 100 ms batch: the interval decides, as in the writer rows.
    result = TransactionalProduceOperator(
        task_id="bench",
        topic=topic,
        pipeline=f"bench-{uuid.uuid4().hex[:8]}",
        delivery_mode="exactly_once",
        producer_function=lambda resume_after: ((n, KEYS[n % 16], payload) for n in range(count)),
        commit_interval_ms=100,
        max_records_per_transaction=10_000_000,
    ).execute({})
    assert result["records"] == count, result
    return count


def run_plain(config: dict, topic: str, count: int, size: int) -> int:
    """An idempotent async producer over the same connection settings: one flush at the end."""
    from confluent_kafka import Producer

    producer = Producer({**config, "enable.idempotence": True, "acks": "all"})
    payload = b"x" * size
    for n in range(count):
        while True:
            try:
                producer.produce(topic, payload, key=KEYS[n % 16])
                break
            except BufferError:  # the local queue is full: serve delivery reports until it has room
                producer.poll(0.05)
    if producer.flush(120):
        raise RuntimeError("plain producer: records left unacknowledged after 120 s")
    return count


def run_operator(topic: str, count: int, size: int) -> int:
    """The Airflow Kafka provider's ProduceToTopicOperator, as a task runs it (its own hook and connection)."""
    from airflow.providers.apache.kafka.operators.produce import ProduceToTopicOperator

    payload = b"x" * size
    for handler in logging.getLogger("airflow").handlers:  # the last run's task log: do not fill the disk
        handler.stream.truncate(0)
    ProduceToTopicOperator(
        task_id="bench",
        topic=topic,
        synchronous=False,
        kafka_config_id=OPERATOR_CONN,
        producer_function=lambda: ((KEYS[n % 16], payload) for n in range(count)),
    ).execute({})
    return count


def task_log(path: str) -> None:
    """Send the ``airflow`` loggers at INFO to a file, as in a task: what the operator's per-record callback costs."""
    from airflow.providers.apache.kafka.operators import produce  # noqa: F401  (Airflow configures logging first)

    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("[%(asctime)s] {%(filename)s:%(lineno)d} %(levelname)s - %(message)s"))
    airflow_log = logging.getLogger("airflow")
    airflow_log.handlers, airflow_log.propagate = [handler], False
    airflow_log.setLevel(logging.INFO)


def add_args(parser) -> None:
    parser.add_argument(
        "--messages",
        type=int,
        default=3_000_000,
        help="messages per run at 100 B (1 KB: a third); every run >= 5 s on 2 cores",
    )
    parser.add_argument("--sizes", default="100,1000", help="message sizes in bytes")
    parser.add_argument(
        "--candidates",
        default="",
        help="comma-separated words; run only the candidates whose "
        "label contains one (the plain producer always runs: the ratios need it)",
    )


def main() -> int:
    args = _support.parse_args(__doc__, extra=add_args)
    stack = _support.start_stack(only=("kafka",))
    log = tempfile.NamedTemporaryFile(prefix="eo-bench-task-", suffix=".log")  # deleted at exit
    task_log(log.name)
    from exactly_once_provider.hooks.kafka_client import kafka_client_config
    from tests.kafka_support import new_topic

    config = kafka_client_config("kafka_default")
    operator_conn = json.loads(os.environ["AIRFLOW_CONN_KAFKA_DEFAULT"])
    operator_conn["extra"]["queue.buffering.max.messages"] = 10_000_000
    os.environ[f"AIRFLOW_CONN_{OPERATOR_CONN.upper()}"] = json.dumps(operator_conn)
    sizes = [int(s) for s in args.sizes.split(",")]
    result = _support.result_header(
        "producer",
        {
            "messages": args.messages,
            "sizes": sizes,
            "repeats": args.repeats,
            "candidates": args.candidates or "all",
            "connection": config.get("security.protocol", "PLAINTEXT"),
        },
    )
    result["runs"], rows, topics = {}, [], []
    for size in sizes:
        count = args.messages if size <= 100 else args.messages // 3
        topic = new_topic(f"{stack.HOST}:{stack.KAFKA_PORT}", partitions=3, prefix="bench")
        topics.append(topic)
        candidates = {
            PLAIN: lambda t=topic, c=count, s=size: run_plain(config, t, c, s),
            OPERATOR: lambda t=topic, c=count, s=size: run_operator(t, c, s),
            EO_100: lambda t=topic, c=count, s=size: run_writer(t, c, s, 100),
            EO_1000: lambda t=topic, c=count, s=size: run_writer(t, c, s, 1000),
            EO_OPERATOR: lambda t=topic, c=count, s=size: run_product_operator(t, c, s),
        }
        words = [w.strip().lower() for w in args.candidates.split(",") if w.strip()]
        candidates = {
            label: run
            for label, run in candidates.items()
            if label == PLAIN or not words or any(w in label.lower() for w in words)
        }
        runs = {label: _support.Runs(label) for label in candidates}
        # Warm-up, unrecorded: topic metadata, the transaction coordinator, imports (the product's operator
        # module pulls in OpenLineage's client: ~1 s of imports that would land in its first timer only).
        run_plain(config, topic, 1000, size), run_writer(topic, 1000, size, 100)
        if OPERATOR in candidates:
            run_operator(topic, 1000, size)
        if EO_OPERATOR in candidates:
            run_product_operator(topic, 1000, size)
        for repeat in range(args.repeats):
            for label in list(candidates) if repeat % 2 == 0 else list(candidates)[::-1]:
                runs[label].measure(candidates[label])
        result["runs"][size] = {
            label: {
                "msgs_per_s_wall": r.wall,
                "msgs_per_cpu_s": r.cpu,
                "median_wall": r.median,
                "seconds": [count / rate for rate in r.wall],
            }
            for label, r in runs.items()
        }
        plain, operator = runs[PLAIN].median, runs[OPERATOR].median if OPERATOR in runs else None
        for label, r in runs.items():
            rows.append(
                [
                    f"{size} B, {label}",
                    count,
                    r.median,
                    _support.runs_text(r.wall),
                    min(count / rate for rate in r.wall),
                    r.median / plain,
                    r.median / operator if operator else "-",
                ]
            )
    _support.delete_topics(stack, topics)  # gigabytes a run: retention would keep them 7 days
    short = [row[0] for row in rows if row[4] < 5]
    result["runs_under_5s"] = short
    if args.candidates:  # a subset: printed only, so docs/benchmarks.md keeps a full run's table
        _support.print_table(
            f"Producer over {result['connection']}, candidates {args.candidates!r}, median msgs/s "
            f"of {args.repeats} interleaved runs (ABBA)",
            [
                "size, candidate",
                "messages",
                "msgs/s",
                "runs",
                "shortest run s",
                "x plain idempotent",
                "x ProduceToTopicOperator",
            ],
            rows,
        )
        for size, runs_of_size in result["runs"].items():
            plain_cpu = _support.statistics.median(runs_of_size[PLAIN]["msgs_per_cpu_s"])
            for label, figures in runs_of_size.items():
                print(
                    f"{size} B, {label}: msgs per CPU-second {_support.runs_text(figures['msgs_per_cpu_s'])}, "
                    f"median x plain {_support.statistics.median(figures['msgs_per_cpu_s']) / plain_cpu:.3f}"
                )
        return 0
    _support.report(
        result,
        f"Producer over {result['connection']}, median msgs/s of {args.repeats} interleaved runs "
        "(ABBA), setup inside every timer" + (f"; runs under 5 s: {len(short)}" if short else ""),
        [
            "size, candidate",
            "messages",
            "msgs/s",
            "runs",
            "shortest run s",
            "x plain idempotent",
            "x ProduceToTopicOperator",
        ],
        rows,
        plot={"column": 2, "label": "msgs/s (median)"},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
