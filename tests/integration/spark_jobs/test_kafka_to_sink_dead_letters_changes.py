"""Dead letters of change records (``mode="current"`` and ``"cdc"``): a key is held back only when its newest
version in the batch is the letter, and letters commit with their batch exactly once.

Three transactions of six change records of one table (rows 1-6 from a full load, ``s = 's<id>'``, ``d = 1.50``
in a ``DECIMAL(6,2)``), one micro-batch each (``max_offsets=7``: six records and the commit marker):

* batch 0, all good: ``s`` of id 1 set to ``a0``, then of ids 1-5 to ``a<id>``;
* batch 1: id 2 to ``b2``, then a bad NEWER version of id 2 (held back: id 2 stays ``a2``); a bad OLDER version of
  id 3, then ``c3`` (applies); id 4 to ``b4``, then a NEWER version of id 4 whose ``d`` is 12345.67, past the
  column's DECIMAL(6,2) (current table: a ``decimal_overflow`` letter, id 4 held back at ``a4``);
* batch 2: id 2 to ``c2`` (a later good change of the held key applies), id 5 to ``b5`` and then a bad newer version
  of it whose Kafka KEY is undecodable (held back: id 5 stays ``a5``), a delete of id 6, an OLDER version of id 1
  whose image names a column ``x`` the table does not hold (current table: a ``schema_version`` letter), then id 1
  to ``z1`` (applies).

The bad records are values that are not valid UTF-8, and for the PostgreSQL current table a text value holding
NUL (the JSON escape, which the table cannot store); the current tables' typed kinds (``decimal_overflow``,
``schema_version``) are good records of a CDC table, which keeps each change's JSON as it is. The Delta current table's first run (spark-submit) is SIGKILLed
in batch 1 after the dead-letter table's commit and before the MERGE (fault point ``sink_written_1``); the rerun,
and the PostgreSQL runs, are in this process on the session's SparkSession. Tables and stores are read back with
delta-rs (its time travel for the state after batch 1) and psycopg 3: every good change applied once, every bad
record in the store once with its raw bytes. Then the reconciliation of each current table against the source
(as the changes left it) is clean apart from the held key, which it names as dead-lettered.
"""

from __future__ import annotations

import json
import logging
import re

import pytest

from exactly_once_provider.full_load.handoff import read_handoff
from exactly_once_provider.full_load.job import FullLoadRequest, run_full_load
from exactly_once_provider.hooks.mysql_source import MySqlSourceHook
from exactly_once_provider.operators.reconcile import ReconcileOperator
from exactly_once_provider.sinks import dead_letters
from exactly_once_provider.sinks.current_table import DELETED_COLUMN
from tests import spark_job_support as jobs
from tests.integration.spark_jobs.test_kafka_to_sink_dead_letters import _pg, _produce, _read
from tests.integration.spark_jobs.test_kafka_to_sink_window import run_job
from tests.kafka_support import new_topic
from tests.mysql_support import connect, unique_name

BAD_TEXT = b'"\xff\xfe"'  # a JSON string whose bytes are not UTF-8
INVALID_KEY = b"k\xc3("
SEP = (",", ":")


def _change(
    schema: str, table: str, op: str, id_: int, s: str | None, version: int, bad: bool = False, **more
) -> tuple[bytes, bytes]:
    """Return ``(key, value)`` of a change record as the binlog capture writes it; ``bad``: ``s`` not UTF-8;
    ``more``: other columns of its image (``d`` is ``"1.50"`` unless given)."""
    image = {"id": id_, "s": "BAD" if bad else s, "d": "1.50", **more}
    value = {
        "format": 1,
        "op": op,
        "pk": {"id": id_},
        "before": image if op == "d" else None,
        "after": None if op == "d" else image,
        "version": version,
        "source": {"server_id": 1, "file": "binlog.000001", "pos": version, "row": 0, "schema": schema, "table": table},
    }
    data = json.dumps(value, separators=SEP, ensure_ascii=False).encode()
    return json.dumps({"id": id_}, separators=SEP).encode(), data.replace(b'"BAD"', BAD_TEXT) if bad else data


def _transactions(schema: str, table: str, base: int, nul: bool) -> list[list[tuple[bytes, bytes]]]:
    def change(op, id_, s, step, bad=False, **more):
        return _change(schema, table, op, id_, s, base + step, bad, **more)

    # the older bad version of id 3: not UTF-8, or (PostgreSQL current table) a text value holding NUL
    older_bad = change("u", 3, "x\x00y", 8) if nul else change("u", 3, None, 8, bad=True)
    return [
        [change("u", 1, "a0", 0)] + [change("u", i, f"a{i}", i) for i in range(1, 6)],
        [change("u", 2, "b2", 6), change("u", 2, None, 7, bad=True), older_bad, change("u", 3, "c3", 9)]
        + [change("u", 4, "b4", 10), change("u", 4, "d4", 11, d="12345.67")],
        [change("u", 2, "c2", 12), change("u", 5, "b5", 13), (INVALID_KEY, change("u", 5, "z5", 14)[1])]
        + [change("d", 6, None, 15), change("u", 1, "y1", 16, x=1), change("u", 1, "z1", 17)],
    ]


# The table after batch 1 and at the end, per mode: the current table holds id 4 back at its decimal_overflow letter,
# a CDC table applies that change (its JSON is stored as it is).
AFTER_BATCH_1 = {
    "current": {1: "a1", 2: "a2", 3: "c3", 4: "a4", 5: "a5", 6: "s6"},
    "cdc": {1: "a1", 2: "a2", 3: "c3", 4: "d4", 5: "a5"},
}
FINAL = {"current": {1: "z1", 2: "c2", 3: "c3", 4: "a4", 5: "a5"}, "cdc": {1: "z1", 2: "c2", 3: "c3", 4: "d4", 5: "a5"}}
BAD_OFFSETS = {"current": [8, 9, 12, 16, 18], "cdc": [8, 9, 16]}  # six records and a marker a batch


def _delta_rows(path: str, version: int | None = None, mode: str = "current") -> dict[int, str]:
    from deltalake import DeltaTable

    if mode == "cdc":  # one row per key, its newest change record
        table = DeltaTable(path, version=version).to_pyarrow_table(columns=["pk", "record_value", "deleted"])
        found = list(zip(*(table.column(c).to_pylist() for c in ("pk", "record_value", "deleted")), strict=True))
        rows = [(json.loads(pk)["id"], json.loads(value)["after"], deleted) for pk, value, deleted in found]
        rows = [(i, None if after is None else after["s"], deleted) for i, after, deleted in rows]
    else:
        table = DeltaTable(path, version=version).to_pyarrow_table(columns=["id", "s", "_eo_deleted"])
        rows = list(zip(*(table.column(c).to_pylist() for c in ("id", "s", "_eo_deleted")), strict=True))
    assert len({r[0] for r in rows}) == len(rows), f"a key twice: {rows}"
    return {i: s for i, s, deleted in rows if not deleted}


def _postgres_rows(stack, table: str, mode: str) -> dict[int, str]:
    with _pg(stack) as conn:
        if mode == "current":
            rows = conn.execute(f"SELECT id, s FROM {table} WHERE NOT _eo_deleted").fetchall()
        else:  # cdc: one row per key, its newest change record
            found = conn.execute(f"SELECT pk, record_value FROM {table} WHERE NOT deleted").fetchall()
            rows = [(json.loads(pk)["id"], json.loads(value)["after"]["s"]) for pk, value in found]
    assert len({r[0] for r in rows}) == len(rows), f"a key twice: {rows}"
    return dict(rows)


def _letters(stack, sink: str, store: str) -> list[tuple]:
    return sorted(_read(stack, sink, store, ["kafka_offset", "record_key", "record_value", "error_class", "batch_id"]))


# delta-current, delta-cdc: the SIGKILL between the store's commit and the MERGE; the PostgreSQL variants commit
# letters in the batch's one transaction (its kill is test_kafka_to_sink_dead_letters.py's): one in-process run each.
@pytest.mark.parametrize(
    "variant",
    ["delta-current", pytest.param("delta-cdc", marks=pytest.mark.matrix), "postgres-current", "postgres-cdc"],
)
def test_a_bad_newest_version_holds_its_key_back_and_letters_land_once(
    stack, spark, airflow_connections, tmp_path, monkeypatch, capsys, caplog, variant
):
    sink, mode = variant.split("-")
    for key, value in jobs.pg_env(stack).items():
        monkeypatch.setenv(key, value)
    caplog.set_level(logging.INFO, logger="exactly_once_provider.kafka_to_sink")
    table = unique_name("dlcur")
    path = str(tmp_path / "current")
    base = 1
    if mode == "current":
        cur = connect(stack).cursor()
        cur.execute(f"CREATE TABLE `{table}` (id INT PRIMARY KEY, s VARCHAR(20), d DECIMAL(6,2))")
        cur.executemany(f"INSERT INTO `{table}` VALUES (%s, %s, 1.50)", [(i, f"s{i}") for i in range(1, 7)])
        run_full_load(spark, MySqlSourceHook(), FullLoadRequest(schema=stack.DB_NAME, table=table, sink_path=path))
        base = read_handoff(path).max_position.version + 10
    bootstrap = f"{stack.HOST}:{stack.KAFKA_PORT}"
    topic = new_topic(bootstrap)
    transactions = _transactions(stack.DB_NAME, table, base, nul=variant == "postgres-current")
    _produce(bootstrap, topic, transactions)
    location = path if sink == "delta" else table
    store = dead_letters.default_store(sink, location)
    args = jobs.job_args(stack, f"dl-{mode}-{topic}", topic, tmp_path / "checkpoint", sink, location, 7, mode=mode)
    args += ["--on-bad-record", "dead_letter"] + (["--path", path] if variant == "postgres-current" else [])
    records = [record for records in transactions for record in records]
    bad = [(o, *records[o - o // 7]) for o in BAD_OFFSETS[mode]]  # (offset, key, value)
    in_batch_1 = 3 if mode == "current" else 2

    if sink == "delta":
        # 1. Killed in batch 1 after the store's commit, before the MERGE: the store is ahead of the table.
        killed = jobs.run_job(stack, args, jobs.kill_driver_at("sink_written", 1))
        assert killed.returncode in (-9, 137), f"expected a SIGKILL, got {killed.returncode}:\n{killed.stdout[-3000:]}"
        loaded = {6: "s6"} if mode == "current" else {}  # cdc: no full load, the table is the changes'
        assert _delta_rows(path, mode=mode) == {i: f"a{i}" for i in range(1, 6)} | loaded
        assert [row[:3] for row in _letters(stack, sink, store)] == bad[:in_batch_1]

    # 2. The (re)run: batch 1 (replayed, for Delta) and batch 2.
    state = run_job(args, capsys)
    assert state["offsets"] == {topic: {"0": 21}}
    if sink == "delta":
        assert _delta_rows(path, mode=mode) == FINAL[mode]
        from deltalake import DeltaTable

        newest = DeltaTable(path).version()  # batch 2's MERGE; the one before it is batch 1's
        assert _delta_rows(path, newest - 1, mode) == AFTER_BATCH_1[mode]
    else:
        # cdc: no full load, every key of FINAL has a change; 6 is a tombstone
        assert _postgres_rows(stack, table.lower(), mode) == FINAL[mode]
    letters = _letters(stack, sink, store)
    assert [row[:3] for row in letters] == bad
    second = "nul_character" if variant == "postgres-current" else "invalid_utf8"
    classes = [("invalid_utf8", 1), (second, 1), ("invalid_utf8", 2)]
    if mode == "current":
        classes[2:2] = [("decimal_overflow", 1)]
        classes.append(("schema_version", 2))
    assert [row[3:] for row in letters] == classes
    if mode == "current":  # the messages say what to fix: the column, its declared type, the value; the column
        messages = dict(_read(stack, sink, store, ["kafka_offset", "error_message"]))
        for part in ("'d'", "decimal(6,2)", "4 integer digits and 2 decimals", "12345.67", "full reload"):
            assert part in messages[12], messages[12]
        assert "column(s) x that" in messages[18] and "id, s, d" in messages[18], messages[18]
    held_keys = {1: [2, 4] if mode == "current" else [2], 2: [5]}
    for batch, keys in held_keys.items():  # cdc: the key field 'pk' is the JSON object {"id": ...}
        held = ", ".join(
            json.dumps([json.dumps({"id": key}, separators=SEP) if mode == "cdc" else str(key)]) for key in keys
        )
        assert re.search(rf"batch {batch}: {len(keys)} keys held back .*: {re.escape(held)}", caplog.text), caplog.text[
            -3000:
        ]
    replayed = str(in_batch_1) if sink == "delta" else "0"
    assert re.search(rf"batch 1: {in_batch_1} dead letters .* \({replayed} held there already", caplog.text), (
        caplog.text[-3000:]
    )
    if mode == "current":
        _reconcile_names_the_dead_lettered_key(stack, table, sink, location, f"dl-{mode}-{topic}")


def _reconcile_names_the_dead_lettered_key(stack, table: str, sink: str, location: str, pipeline: str) -> None:
    """The source as the changes left it (the newest changes of ids 4 and 5, letters, set s = 'd4' and 'z5'): the
    reconciliation is clean apart from keys 4 and 5, which it names as dead-lettered (the letters of ids 1, 2 and 3
    name keys the table holds as the source does: no difference)."""
    cur = connect(stack).cursor()
    for id_, s in {**FINAL["current"], 4: "d4", 5: "z5"}.items():
        cur.execute(f"UPDATE `{table}` SET s = %s WHERE id = %s", (s, id_))
    cur.execute(f"DELETE FROM `{table}` WHERE id = 6")
    target = {"sink_path": location, "delta_reader": "delta-rs"} if sink == "delta" else {"sink_table": location}
    summary = ReconcileOperator(
        task_id="reconcile",
        name=pipeline,
        table=table,
        sink=sink,
        sink_deleted_column=DELETED_COLUMN,
        sink_pipeline=pipeline,
        **target,
    ).execute({})
    cur.execute(f"DROP TABLE `{table}`")
    assert summary["clean"] and summary["changed"] == 0 and summary["missing"] == 0, summary
    assert (summary["dead_lettered"], sorted(summary["dead_lettered_keys"])) == (2, ["4", "5"]), summary
    with _pg(stack) as conn:  # the stored result counts it too (the status page shows that column)
        stored = conn.execute(
            "SELECT status, changed, dead_lettered FROM eo_reconciliation WHERE name = %s ORDER BY id DESC LIMIT 1",
            (pipeline,),
        ).fetchone()
    assert stored == ("clean", 0, 2), stored
