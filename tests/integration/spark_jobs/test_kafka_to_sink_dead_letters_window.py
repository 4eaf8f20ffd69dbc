"""Dead letters in window mode: a bad data record inside a framed settlement window is dead-lettered with the
window's publish, the window still settles without its row, and the sink's window state counts the letter.

Three settlement batches, each one Kafka transaction framed by its begin and end markers (one partition):
window ``a`` v1 (4 data records, the third bad), window ``b`` v1 (3 data records, the second bad) and a re-extract
``a`` v2 (3 good records). ``max_offsets=7`` cuts the reads so that micro-batch 0 publishes ``a`` v1, micro-batch 1
publishes ``b`` (its read also holds ``a`` v2's begin marker: incomplete, carried) and micro-batch 2 publishes
``a`` v2. The bad records: a value that is not UTF-8 and (PostgreSQL) a value holding NUL, or (Delta) a key that is
not UTF-8. Delta: the first run (spark-submit) is SIGKILLed in micro-batch 1 after the store's commit and before the
sink's (fault point ``sink_written_1``), the rerun in this process; PostgreSQL: one run in this process (its
letters are in the window's one transaction). Read back with delta-rs and psycopg 3: each window once at its
version without the bad rows, each letter once, and the window state (and the settlement report reading it) saying
how many letters each window has.
"""

from __future__ import annotations

import json
import logging
import re

import pytest

from exactly_once_provider.operators.settlement_report import SettlementReportOperator
from exactly_once_provider.sinks import dead_letters
from tests import spark_job_support as jobs
from tests.integration.spark_jobs.test_kafka_to_sink import target_for
from tests.integration.spark_jobs.test_kafka_to_sink_dead_letters import _pg, _read
from tests.integration.spark_jobs.test_kafka_to_sink_window import run_job
from tests.kafka_support import new_topic, transactional_producer

INVALID_VALUE = b'{"row": {"id": 2, "s": "\xff\xfe"}}'


def _window(producer, topic: str, batch_id: str, version: int, records: list[tuple[bytes, bytes]]) -> str:
    """Publish one settlement batch as WatermarkExtractOperator frames it; return its window id."""
    body = {"pipeline": "settle", "source_partition": "t", "batch_id": batch_id, "batch_version": version}
    window = f"settle/t/{batch_id}"
    producer.begin_transaction()
    producer.produce(topic, json.dumps(body).encode(), b"m", headers=[("eo.marker", b"begin")])
    for key, value in records:
        producer.produce(topic, value, key, headers=[("eo.batch", f"{window}/v{version}".encode())])
    end = {**body, "records": len(records), "batch_records": len(records)}
    producer.produce(topic, json.dumps(end).encode(), b"m", headers=[("eo.marker", b"end")])
    producer.flush(30)
    producer.commit_transaction(60)
    return window


def _good(i: int) -> tuple[bytes, bytes]:
    return str(i).encode(), json.dumps({"row": {"id": i}}).encode()


@pytest.mark.parametrize("sink", ["delta", "postgres"])
def test_a_window_settles_with_its_bad_records_dead_lettered_once_and_counted(
    stack, spark, tmp_path, monkeypatch, capsys, caplog, sink
):
    for key, value in jobs.pg_env(stack).items():
        monkeypatch.setenv(key, value)
    caplog.set_level(logging.INFO, logger="exactly_once_provider.kafka_to_sink")
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap)
    location = target_for(sink, tmp_path, topic, stack)
    store = dead_letters.default_store(sink, location)
    second_bad = (b"5", b'{"row": {"id": 5, "s": "a\x00b"}}') if sink == "postgres" else (b"k\xc3(", b"{}")
    producer = transactional_producer(bootstrap)
    # offsets: a v1 = begin 0, data 1-4, end 5 (+ commit 6); b = 7, 8-10, 11 (+ 12); a v2 = 13, 14-16, 17 (+ 18)
    a = _window(producer, topic, "a", 1, [_good(1), _good(2), (b"3", INVALID_VALUE), _good(4)])
    b = _window(producer, topic, "b", 1, [_good(5), second_bad, _good(7)])
    _window(producer, topic, "a", 2, [_good(11), _good(12), _good(13)])
    jobs.wait_for_committed_end(bootstrap, topic, 1)
    pipeline = f"dlw-{topic}"
    args = jobs.job_args(stack, pipeline, topic, tmp_path / "checkpoint", sink, location, 7, mode="window")
    args += ["--on-bad-record", "dead_letter"]

    def windows() -> dict[str, tuple]:
        """window -> (version, sorted offsets of its rows)."""
        rows = (
            jobs.delta_rows(location, ("window_id", "window_version", "kafka_offset"))
            if sink == "delta"
            else jobs.postgres_rows(stack, location, ("window_id", "window_version", "kafka_offset"))
        )
        found: dict[str, tuple] = {}
        for window, version, offset in rows:
            found.setdefault(window, (version, []))[1].append(offset)
        return {w: (v, sorted(offsets)) for w, (v, offsets) in found.items()}

    def letters() -> list[tuple]:
        return sorted(_read(stack, sink, store, ["kafka_offset", "record_key", "record_value", "error_class"]))

    if sink == "delta":
        # 1. Killed in micro-batch 1 after the store's commit of b's letter, before the sink's commit.
        killed = jobs.run_job(stack, args, jobs.kill_driver_at("sink_written", 1))
        assert killed.returncode in (-9, 137), f"expected a SIGKILL, got {killed.returncode}:\n{killed.stdout[-3000:]}"
        assert windows() == {a: (1, [1, 2, 4])}
        assert [row[0] for row in letters()] == [3, 9]

    # 2. The (re)run settles b and a v2.
    state = run_job(args, capsys)
    assert state["offsets"] == {topic: {"0": 19}}
    assert state["windows"] == {a: {"version": 2, "rows": 3}, b: {"version": 1, "rows": 2, "dead_letters": 1}}
    assert state["rows_total"] == 5
    assert windows() == {a: (2, [14, 15, 16]), b: (1, [8, 10])}
    second = ("nul_character", second_bad[0], second_bad[1]) if sink == "postgres" else ("invalid_utf8", *second_bad)
    # a v1's letter stays in the store (a letter of the version a v2 replaced); b's once
    assert letters() == [(3, b"3", INVALID_VALUE, "invalid_utf8"), (9, second[1], second[2], second[0])]
    replayed = "1" if sink == "delta" else "0"
    logged = rf'batch 1: 1 dead letters \{{"{second[0]}": 1\}} of windows \{{"{b}": 1\}} committed .* \({replayed} held'
    assert re.search(logged, caplog.text), caplog.text[-3000:]
    if sink == "delta":  # the settlement report's count: the sink's window state, read without Spark

        def report(window: str) -> SettlementReportOperator:
            return SettlementReportOperator(
                task_id="report",
                window_id=window,
                sink_path=location,
                report_table="unused",
                source_table="unused",
                group_by=["id"],
                sum_columns=[],
                sink_pipeline=pipeline,
            )

        assert (report(b)._dead_letters(), report(a)._dead_letters()) == (1, 0)
    if sink == "postgres":  # the windows table counts them beside the version (read without the provider)
        with _pg(stack) as conn:
            counted = conn.execute(
                "SELECT window_id, version, rows, dead_letters FROM eo_stream_windows WHERE pipeline = %s", (pipeline,)
            ).fetchall()
        assert sorted(counted) == [(a, 2, 3, 0), (b, 1, 2, 1)]
