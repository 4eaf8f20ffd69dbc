"""Dead letters (``on_bad_record="dead_letter"``): bad records committed to the store with their batch, exactly once.

Three transactions of five records, one micro-batch each (``max_offsets=6``: five records and the commit marker):
all good, then two bad records among three good ones, then one bad among four good. A first run (spark-submit)
is SIGKILLed in batch 1 after its sink wrote rows and letters and before the batch's commit (PostgreSQL: inside
the open transaction; Delta: after the dead-letter table's commit, before the sink's; files (local and MinIO), in the matrix run:
before the manifest; Delta on MinIO in the matrix run too); a second run (in this process, on the session's
SparkSession) finishes. Sink and store are read back with readers the provider does not commit with (psycopg 3,
delta-rs, the manifest's JSON and pyarrow): every good record in the sink once, every bad one in the store once,
with its raw bytes. Over the limit: nothing of the batch anywhere, the message names the limit and the store.
"""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path

import pytest

from exactly_once_provider.sinks import dead_letters
from tests import spark_job_support as jobs
from tests.integration.spark_jobs.test_kafka_to_sink import target_for
from tests.integration.spark_jobs.test_kafka_to_sink_window import run_job
from tests.kafka_support import new_topic, transactional_producer

INVALID_VALUE = b'{"n": "\xff\xfe"}'
INVALID_KEY = b"k\xc3("
NUL_VALUE = b'{"n": "a\x00b"}'


def _good(name: str) -> tuple[bytes, bytes]:
    return name.encode(), json.dumps({"n": name}).encode()


def _transactions(sink: str) -> list[list[tuple[bytes, bytes]]]:
    """Three transactions of five records; the bad ones (key, value) as PostgreSQL or Delta cannot store them."""
    second = (b"b1", NUL_VALUE) if sink == "postgres" else (INVALID_KEY, b"{}")
    return [
        [_good(f"g{i}") for i in range(5)],
        [_good("g5"), (b"b0", INVALID_VALUE), _good("g6"), second, _good("g7")],
        [_good("g8"), _good("g9"), (INVALID_KEY, b'{"n": 1}'), _good("g10"), _good("g11")],
    ]


def _produce(bootstrap: str, topic: str, transactions) -> None:
    producer = transactional_producer(bootstrap)
    for records in transactions:
        producer.begin_transaction()
        for key, value in records:
            producer.produce(topic, value, key)
        producer.flush(30)
        producer.commit_transaction(60)


def _is_bad(key: bytes, value: bytes, sink: str) -> bool:
    def bad(data: bytes) -> bool:
        try:
            text = data.decode()
        except UnicodeDecodeError:
            return True
        return sink == "postgres" and "\x00" in text

    return bad(key) or bad(value)


def _pg(stack):
    import psycopg

    return psycopg.connect(
        host=stack.HOST, port=stack.POSTGRES_PORT, dbname=stack.DB_NAME, user=stack.DB_USER, password=stack.DB_PASSWORD
    )


def _s3_reader(stack, root: str):
    """Read objects under ``root`` (``s3://bucket/prefix``) with boto3, not the provider's storage layer."""
    bucket, prefix = root.removeprefix("s3://").split("/", 1)
    client = stack.minio_client()
    return lambda name: client.get_object(Bucket=bucket, Key=f"{prefix}/{name}")["Body"].read()


def _s3_names(stack, root: str) -> list[str]:
    """The object names in ``<root>/_manifests/``."""
    bucket, prefix = root.removeprefix("s3://").split("/", 1)
    found = stack.minio_client().list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/_manifests/")
    return [item["Key"].rsplit("/", 1)[1] for item in found.get("Contents", [])]


def _read(stack, sink: str, location: str, columns: list[str]) -> list[tuple]:
    """Read a table back without the provider: psycopg 3 for PostgreSQL, delta-rs for Delta, the newest manifest's
    JSON and pyarrow for files (its ``files``, or for the store its ``dead_letters``); [] if absent."""
    if sink == "files":
        import pyarrow.parquet as pq

        root, key = (
            (location.removesuffix("/dead_letters"), "dead_letters")
            if location.endswith("/dead_letters")
            else (location, "files")
        )
        read = _s3_reader(stack, root) if root.startswith("s3://") else lambda name: Path(root, name).read_bytes()
        names = (
            _s3_names(stack, root) if root.startswith("s3://") else [p.name for p in Path(root, "_manifests").glob("*")]
        )
        manifests = sorted(n for n in names if n.startswith("0") and n.endswith(".json"))
        listed = json.loads(read(f"_manifests/{manifests[-1]}")).get(key, []) if manifests else []
        rows = []
        for file in listed:
            table = pq.read_table(io.BytesIO(read(file["path"])), columns=columns)
            rows += list(zip(*(table.column(c).to_pylist() for c in columns)))
        return rows
    if sink == "postgres":
        with _pg(stack) as conn:
            if conn.execute("SELECT to_regclass(%s)", (location,)).fetchone()[0] is None:
                return []
            rows = conn.execute(f"SELECT {', '.join(columns)} FROM {location}").fetchall()
        return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row) for row in rows]
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    options = stack.minio_settings().delta_rs_options() if location.startswith("s3://") else None
    try:
        table = DeltaTable(location, storage_options=options).to_pyarrow_table(columns=columns)
    except TableNotFoundError:
        return []
    return list(zip(*(table.column(c).to_pylist() for c in columns)))


def _args(stack, pipeline, topic, tmp_path, sink, location, *policy: str) -> list[str]:
    s3 = stack.minio_settings().to_json() if location.startswith("s3://") else None
    args = jobs.job_args(stack, pipeline, topic, tmp_path / "checkpoint", sink, location, max_offsets=6, s3=s3)
    return [*args, "--on-bad-record", "dead_letter", *policy]


# delta-lost-checkpoint: the rerun starts without the checkpoint (set aside) and without the per-batch cap, so the
# replay has another checkpoint id and other batch bounds: only the store's offset watermark keeps it exact.
# delta-s3, files-s3: sink and store on MinIO.
@pytest.mark.parametrize(
    "variant",
    [
        "postgres",
        "delta",
        pytest.param("delta-lost-checkpoint", marks=pytest.mark.matrix),
        pytest.param("files", marks=pytest.mark.matrix),
        pytest.param("files-s3", marks=pytest.mark.matrix),
        pytest.param("delta-s3", marks=pytest.mark.matrix),
    ],
)
def test_dead_letters_land_once_with_their_batch_across_a_driver_killed_before_the_commit(
    stack, spark, tmp_path, monkeypatch, capsys, caplog, variant
):
    sink = variant.removesuffix("-lost-checkpoint").removesuffix("-s3")
    for key, value in jobs.pg_env(stack).items():
        monkeypatch.setenv(key, value)
    caplog.set_level(logging.INFO, logger="exactly_once_provider.kafka_to_sink")
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap)
    location = target_for(variant.removesuffix("-lost-checkpoint"), tmp_path, topic, stack)
    store = dead_letters.default_store(sink, location)
    pipeline = f"dl-{topic}"
    transactions = _transactions(sink)
    _produce(bootstrap, topic, transactions)
    args = _args(stack, pipeline, topic, tmp_path, sink, location)
    # offsets: batch 0 = 0-4 (+ marker 5), batch 1 = 6-10 (+ 11), batch 2 = 12-16 (+ 17)
    offsets = [
        (6 * t + i, key, value) for t, records in enumerate(transactions) for i, (key, value) in enumerate(records)
    ]
    good = [(o, k.decode(), v.decode()) for o, k, v in offsets if not _is_bad(k, v, sink)]
    bad = [(o, k, v) for o, k, v in offsets if _is_bad(k, v, sink)]
    sink_columns = ["kafka_offset", "record_key", "record_value"]
    letter_columns = ["kafka_offset", "record_key", "record_value", "error_class", "pipeline", "batch_id"]
    letter_columns += ["kafka_timestamp", "dead_lettered_at", "error_message"]

    # 1. Killed in batch 1 after its rows and letters were written, before the batch's commit.
    run = jobs.run_job(stack, args, jobs.kill_driver_at("sink_written", 1))
    assert run.returncode in (-9, 137), f"expected a SIGKILL, got {run.returncode}:\n{run.stdout[-3000:]}"
    assert sorted(_read(stack, sink, location, sink_columns)) == good[:5]
    letters = _read(stack, sink, store, letter_columns)
    if sink in ("postgres", "files"):  # the batch's one transaction / manifest died with the driver
        assert letters == []
    else:  # the store commits first: it holds batch 1's letters, the sink does not hold batch 1 yet
        assert sorted(row[:3] for row in letters) == bad[:2]

    # 2. The rerun replays batch 1 and finishes: each good record in the sink once, each bad one in the store once.
    lost = variant.endswith("lost-checkpoint")
    if lost:
        (tmp_path / "checkpoint").rename(tmp_path / "checkpoint.lost")
        args = [a for a in args if a not in ("--max-offsets-per-trigger", "6")]
    state = run_job(args, capsys)
    assert state["offsets"] == {topic: {"0": 18}} and state["rows_total"] == len(good)
    assert sorted(_read(stack, sink, location, sink_columns)) == good
    letters = sorted(_read(stack, sink, store, letter_columns))
    assert [row[:3] for row in letters] == bad
    assert [row[3:6] for row in letters] == [
        ("invalid_utf8", pipeline, 1),
        ("nul_character" if sink == "postgres" else "invalid_utf8", pipeline, 1),
        ("invalid_utf8", pipeline, 0 if lost else 2),
    ]
    assert all(row[6] is not None and row[7] is not None for row in letters), letters
    assert [row[8] for row in letters][::2] == ["the value is not valid UTF-8", "the key is not valid UTF-8"]
    if lost:  # one batch [6, 18) of the new checkpoint: batch 1's two letters were in the store already
        assert re.search(r"batch 0: 3 dead letters .* \(2 held there already: a replay\)", caplog.text), caplog.text
        return
    held = "2" if sink == "delta" else "0"  # Delta: batch 1's letters were committed by the killed run
    assert re.search(rf"batch 1: 2 dead letters .* \({held} held there already: a replay\)", caplog.text), caplog.text
    assert re.search(r"batch 2: 1 dead letters \{\"invalid_utf8\": 1\}", caplog.text), caplog.text


@pytest.mark.parametrize(
    "sink,limit", [("postgres", ["--max-dead-letters", "1"]), ("delta", ["--max-dead-letter-ratio", "0.3"])]
)
def test_a_batch_over_the_dead_letter_limit_commits_nothing_and_names_the_limit_and_the_store(
    stack, spark, tmp_path, monkeypatch, capsys, sink, limit
):
    for key, value in jobs.pg_env(stack).items():
        monkeypatch.setenv(key, value)
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap)
    location = target_for(sink, tmp_path, topic, stack)
    store = dead_letters.default_store(sink, location)
    transactions = _transactions(sink)[:2]  # batch 1: 2 bad of 5
    _produce(bootstrap, topic, transactions)
    args = _args(stack, f"dl-limit-{topic}", topic, tmp_path, sink, location, *limit)

    with pytest.raises(Exception) as failure:
        run_job(args, capsys)
    message = str(failure.value)
    expected = "max_dead_letters=1" if sink == "postgres" else "2 of its 5 records, more than max_dead_letter_ratio=0.3"
    assert expected in message and f"dead-letter store {store}" in message, message[-2000:]
    assert f"{topic}/0@7 (invalid_utf8)" in message and '{"0": 6}' in message, message[-2000:]
    assert sorted(_read(stack, sink, location, ["kafka_offset"])) == [(o,) for o in range(5)]
    assert _read(stack, sink, store, ["kafka_offset"]) == []
