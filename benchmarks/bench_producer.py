"""Benchmark (not a test): exactly_once vs at_least_once vs synchronous send, on the stack's broker.

Runs every mode against the same broker in one run, interleaved, ``--repeats`` times, and prints the
median msgs/s and the ratio exactly_once / at_least_once. exactly_once and at_least_once go through the
product's write path (PipelineWriter: batches -> Kafka + offsets ledger record per commit, the
transactional one with begin/commit); "sync" is a bare idempotent producer that
flushes after every message (the strawman); "bare async" is the same producer with one flush at the end, a
ceiling for reference (it records no offset at all). Usage: ``make bench-producer`` or
``python benchmarks/bench_producer.py [--messages 200000] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


sys.path.insert(0, str(REPO))


def run_writer(mode: str, topic: str, count: int, size: int, interval_ms: int) -> float:
    """Produce ``count`` messages through the product's write path; commit every ``interval_ms``.

    The writer is opened (init_transactions, ledger read) before the clock starts: the figure is the
    steady-state rate, where the per-transaction cost (flush, ledger record, commit) is what differs. The
    loop is the operator's (TransactionalProduceOperator._run): submit_batch, whose commit finishes while
    the next batch is collected, and one wait() at the end; the clock stops when the last batch is committed.
    """
    from exactly_once_provider.hooks.kafka_producer import TransactionalProducerHook
    from exactly_once_provider.kafka.writer import Message

    hook = TransactionalProducerHook(pipeline=f"bench-{uuid.uuid4().hex[:8]}", delivery_mode=mode)
    writer = hook.open_writer()
    payload, keys = b"x" * size, [f"k{k}".encode() for k in range(16)]
    batch: list = []
    started = txn_started = time.perf_counter()
    for n in range(1, count + 1):
        batch.append(Message(payload, keys[n % 16]))
        if n % 256 == 0 and (time.perf_counter() - txn_started) * 1000 >= interval_ms:
            writer.submit_batch(topic, batch, n)
            batch, txn_started = [], time.perf_counter()
    if batch:
        writer.submit_batch(topic, batch, count)
    writer.wait()
    elapsed = time.perf_counter() - started
    writer.close()
    return count / elapsed


def run_bare(bootstrap: str, topic: str, count: int, size: int, flush_each: bool) -> float:
    """A bare idempotent producer: one flush at the end (reference) or after every message (sync strawman)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    payload, keys = b"x" * size, [f"k{k}".encode() for k in range(16)]
    started = time.perf_counter()
    for n in range(count):
        while True:
            try:
                producer.produce(topic, payload, key=keys[n % 16])
                break
            except BufferError:
                producer.poll(0.05)
        if flush_each:
            producer.flush(30)
    producer.flush(60)
    return count / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=500_000, help="messages per run at 100 B (1 KB: half)")
    parser.add_argument("--sync-messages", type=int, default=2_000, help="messages per synchronous run")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from tests.conftest import STACK as stack  # the one loader of docker/local/stack.py

    stack.up(only=("kafka",))
    os.environ.update(stack.connection_env())
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    logging.getLogger("airflow").setLevel(logging.WARNING)
    sys.path.insert(0, str(REPO))
    from confluent_kafka.admin import AdminClient

    from tests.kafka_support import new_topic

    modes = [("at_least_once", 100), ("exactly_once", 100), ("exactly_once", 1000), ("bare async", 0),
             ("sync", 0)]
    rows = []
    for size in (100, 1000):
        count = args.messages if size == 100 else args.messages // 2
        topic = new_topic(bootstrap, partitions=3, prefix="bench")
        run_writer("exactly_once", topic, 1000, size, 100)  # warm-up: coordinator, metadata, offsets topic
        samples: dict[tuple[str, int], list[float]] = {mode: [] for mode in modes}
        for _ in range(args.repeats):
            for mode, interval in modes:
                if mode == "sync":
                    rate = run_bare(bootstrap, topic, args.sync_messages, size, flush_each=True)
                elif mode == "bare async":
                    rate = run_bare(bootstrap, topic, count, size, flush_each=False)
                else:
                    rate = run_writer(mode, topic, count, size, interval)
                samples[(mode, interval)].append(rate)
        # A run writes gigabytes (1 KB x 5 modes x repeats): give the disk back, retention would keep it 7 days
        admin = AdminClient({"bootstrap.servers": bootstrap})  # kept referenced until the deletion is done
        admin.delete_topics([topic])[topic].result(60)
        baseline = statistics.median(samples[("at_least_once", 100)])
        for mode, interval in modes:
            rate = statistics.median(samples[(mode, interval)])
            raw = ", ".join(f"{run:,.0f} ({run / base:.3f})"
                            for run, base in zip(samples[(mode, interval)], samples[("at_least_once", 100)]))
            rows.append((size, mode, interval, count if mode != "sync" else args.sync_messages, rate,
                         rate / baseline, raw))

    print()
    print(f"Producer benchmark, broker {bootstrap}, median of {args.repeats} interleaved runs per row")
    print(f"{'size':>6} | {'mode':<14} | {'commit interval':>15} | {'messages':>8} | {'msgs/s':>10} | "
          f"{'ratio vs at_least_once':>22} | raw runs msgs/s (ratio to the same repeat's at_least_once)")
    print("-" * 150)
    for size, mode, interval, count, rate, ratio, raw in rows:
        every = {"sync": "per message", "bare async": "none (1 flush)"}.get(mode, f"{interval} ms")
        print(f"{size:>5}B | {mode:<14} | {every:>15} | {count:>8} | {rate:>10,.0f} | {ratio:>22.3f} | {raw}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
