"""The repair of dead letters: each chosen letter applied to the PostgreSQL sink once and closed once, also when
the repair is SIGKILLed between its writes and its commit.

The sink table and its store are made as the append-mode sink makes them (``PostgresSink.ensure_tables``, the
store's insert), holding three letters. A first repair runs in its own process and is SIGKILLed after it
inserted the rows and closed the letters in its open transaction (fault point ``repair_written``); then repairs
in this process: by error class with a fix, again (nothing left to do), an ``accept`` refused (a NUL), and by
offset with a fix. Read back with psycopg 3: each repaired letter's row in the sink once, each letter closed once.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import textwrap
import uuid

import pytest
from psycopg2 import sql

from exactly_once_provider.connections import connect_kwargs
from exactly_once_provider.operators.dead_letter_repair import DeadLetterRepairOperator
from exactly_once_provider.sinks import dead_letters
from exactly_once_provider.sinks.postgres import PostgresSink
from tests.integration.spark_jobs.test_kafka_to_sink_dead_letters import _pg

LETTERS = [  # offset, key, value, error class
    (7, b"b0", b'{"n": "\xff\xfe"}', "invalid_utf8"),
    (8, b"b1", b'{"n": "a\x00b"}', "nul_character"),
    (14, b"k\xc3(", b'{"n": 1}', "invalid_utf8"),
]


def _fix(letter: dict) -> tuple[str | None, str | None]:
    """The user's fix: undecodable bytes replaced, NUL removed."""
    key, value = (
        None if data is None else data.decode("utf-8", "replace").replace("\x00", "")
        for data in (letter["record_key"], letter["record_value"])
    )
    return key, value


def _state(stack, table: str, store: str) -> tuple[list, list]:
    with _pg(stack) as conn:
        rows = conn.execute(f"SELECT kafka_offset, record_key, record_value FROM {table} ORDER BY 1").fetchall()
        letters = conn.execute(
            f"SELECT kafka_offset, (to_jsonb(s) ->> 'resolution'), (to_jsonb(s) ->> 'closed_at') IS NOT NULL"
            f" FROM {store} s ORDER BY 1"
        ).fetchall()
    return rows, letters


def test_repaired_letters_land_once_and_close_once_across_a_repair_killed_before_its_commit(stack, airflow_connections):
    pipeline, table = f"repair-{uuid.uuid4().hex[:8]}", f"repair_{uuid.uuid4().hex[:8]}"
    store = dead_letters.default_store("postgres", table)
    sink = PostgresSink(table, pipeline, connect_kwargs("postgres_default"), dead_letter_store=store)
    sink.ensure_tables()
    now = dt.datetime.now(dt.UTC)
    rows = [
        dict(zip(dead_letters.COLUMNS, (pipeline, "c", 1, "t", 0, o, now, k, v, c, f"{c}!", now), strict=True))
        for o, k, v, c in LETTERS
    ]
    conn = sink._connect()
    with conn, conn.cursor() as cur:
        dead_letters.insert_postgres(cur, sql.Identifier(store), dead_letters.DeadLetters(store, rows))
    conn.close()

    # 1. Killed after its inserts and closes, before its commit: nothing applied, nothing closed.
    script = textwrap.dedent(
        f"""
        from exactly_once_provider.operators.dead_letter_repair import DeadLetterRepairOperator
        from tests.integration.operators.test_dead_letter_repair import _fix
        DeadLetterRepairOperator(task_id="r", pipeline={pipeline!r}, sink_table={table!r},
                                 error_classes=["invalid_utf8"], fix=_fix).execute({{}})
        """
    )
    env = {**os.environ, "EO_FAULT_AT": "repair_written", "EO_FAULT_ACTION": "kill"}
    killed = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stdout[-2000:] + killed.stderr[-3000:]
    assert _state(stack, table, store) == ([], [(7, None, False), (8, None, False), (14, None, False)])

    # 2. The rerun applies the two invalid_utf8 letters once and closes them; a third run finds nothing to do.
    def repair(**kwargs) -> dict:
        return DeadLetterRepairOperator(task_id="r", pipeline=pipeline, sink_table=table, **kwargs).execute({})

    done = repair(error_classes=["invalid_utf8"], fix=_fix)
    assert (done["applied"], done["left_open"], done["resolution"]) == (["t/0@7", "t/0@14"], [], "repaired")
    assert repair(error_classes=["invalid_utf8"], fix=_fix)["applied"] == []
    conn = sink._connect()
    try:  # the status page and the reconciliation see the one letter still open
        assert dead_letters.store_rows("postgres", store, pipeline, ("kafka_offset",), pg_conn=conn) == [
            {"kafka_offset": 8}
        ]
    finally:
        conn.close()

    # 3. Accepting the NUL letter as it is is refused, and changes nothing; fixed by its offset it lands.
    with pytest.raises(ValueError, match="NUL character"):
        repair(offsets=["t/0@8"], accept=True)
    assert repair(offsets=["t/0@8"], fix=_fix)["applied"] == ["t/0@8"]

    sink_rows, letters = _state(stack, table, store)
    assert sink_rows == [(7, "b0", '{"n": "\ufffd\ufffd"}'), (8, "b1", '{"n": "ab"}'), (14, "k\ufffd(", '{"n": 1}')]
    assert letters == [(7, "repaired", True), (8, "repaired", True), (14, "repaired", True)]
    # every letter closed: none is open for the status page or the reconciliation
    conn = sink._connect()
    try:
        assert dead_letters.store_rows("postgres", store, pipeline, ("kafka_offset",), pg_conn=conn) == []
    finally:
        conn.close()


def _change(op: str, id_: int, s: str, version: int) -> bytes:
    image = {"id": id_, "s": s}
    after, before = (None, image) if op == "d" else (image, None)
    record = {"op": op, "pk": {"id": id_}, "before": before, "after": after, "version": version}
    return json.dumps(record, separators=(",", ":")).encode()


def test_repaired_change_records_apply_by_the_cdc_tables_version_rule(stack, airflow_connections):
    pipeline, table = f"repair-cdc-{uuid.uuid4().hex[:8]}", f"repair_cdc_{uuid.uuid4().hex[:8]}"
    store = dead_letters.default_store("postgres", table)
    sink = PostgresSink(table, pipeline, connect_kwargs("postgres_default"), mode="cdc", dead_letter_store=store)
    sink.ensure_tables()
    held = [(1, "u", "one", 10), (2, "u", "two", 30), (3, "u", "three", 10)]  # the table as the stream left it
    with _pg(stack) as conn:
        for id_, op, s, version in held:
            conn.execute(
                f"INSERT INTO {table} VALUES (%s, %s, false, %s, 't', 0, %s)",
                (
                    json.dumps({"id": id_}, separators=(",", ":")),
                    version,
                    _change(op, id_, s, version).decode(),
                    version,
                ),
            )
    now = dt.datetime.now(dt.UTC)
    letters = [  # offset, the bad change (a NUL in its text), the version it carries
        (20, _change("u", 1, "one\x00fixed", 20)),  # newer than id 1's row: applied
        (21, _change("u", 2, "two\x00old", 21)),  # older than id 2's row (30): superseded
        (22, _change("d", 3, "three\x00", 22)),  # a delete, newer: a tombstone
        (23, _change("u", 4, "four\x00", 23)),  # a key the table lacks: inserted
        (24, _change("u", 4, "four\x00newer", 24)),  # the same key, newer: this one wins, 23 superseded
    ]
    rows = [
        dict(
            zip(
                dead_letters.COLUMNS,
                (pipeline, "c", 1, "t", 0, o, now, b"k", v, "nul_character", "NUL", now),
                strict=True,
            )
        )
        for o, v in letters
    ]
    conn = sink._connect()
    with conn, conn.cursor() as cur:
        dead_letters.insert_postgres(cur, sql.Identifier(store), dead_letters.DeadLetters(store, rows))
    conn.close()

    def fix(letter: dict) -> tuple[None, str]:
        return None, letter["record_value"].decode().replace("\\u0000", " ")

    done = DeadLetterRepairOperator(
        task_id="r", pipeline=pipeline, sink_table=table, mode="cdc", key_field="pk", fix=fix
    ).execute({})
    assert (done["applied"], done["superseded"]) == (["t/0@20", "t/0@22", "t/0@24"], ["t/0@21", "t/0@23"]), done
    with _pg(stack) as conn:
        found = conn.execute(f"SELECT pk, source_version, deleted, record_value FROM {table} ORDER BY pk").fetchall()
        closed = conn.execute(f"SELECT kafka_offset, resolution FROM {store} WHERE closed_at IS NOT NULL ORDER BY 1")
        closed = closed.fetchall()
    state = {json.loads(pk)["id"]: (v, d, (json.loads(r)["after"] or {}).get("s")) for pk, v, d, r in found}
    assert state == {
        1: (20, False, "one fixed"),
        2: (30, False, "two"),
        3: (22, True, None),
        4: (24, False, "four newer"),
    }
    assert closed == [(20, "repaired"), (21, "superseded"), (22, "repaired"), (23, "superseded"), (24, "repaired")]
    again = DeadLetterRepairOperator(task_id="r", pipeline=pipeline, sink_table=table, mode="cdc", fix=fix).execute({})
    assert again["applied"] == again["superseded"] == []  # every letter closed once
