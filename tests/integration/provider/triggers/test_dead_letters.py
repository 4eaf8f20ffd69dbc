"""The dead-letter trigger announces the new open letters of its pipeline from a real PostgreSQL store: every
letter once, another pipeline's never, a letter a repair closed no more, and nothing again after a restart."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid

import psycopg2
from psycopg2 import sql

from exactly_once_provider.connections import connect_kwargs
from exactly_once_provider.sinks import dead_letters
from exactly_once_provider.triggers.dead_letters import STATE_KEY, DeadLetterTrigger

T0 = dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.UTC)


class StateStore:
    """The Asset's state store of the triggerer (Airflow's own needs the metadata database)."""

    def __init__(self):
        self.values = {}

    async def aget(self, key, default=None):
        return self.values.get(key, default)

    async def aset(self, key, value):
        self.values[key] = value


def _letter(pipeline: str, offset: int, error: str) -> dict:
    return {
        "pipeline": pipeline,
        "checkpoint_id": "c",
        "batch_id": offset // 10,
        "kafka_topic": "orders",
        "kafka_partition": offset % 2,
        "kafka_offset": offset,
        "kafka_timestamp": T0,
        "record_key": b"k",
        "record_value": b"\xff\x00",
        "error_class": error,
        "error_message": f"{error} at {offset}",
        "dead_lettered_at": T0 + dt.timedelta(seconds=offset),
    }


def _insert(store: str, rows: list[dict], close: list[int] = ()) -> None:
    conn = psycopg2.connect(**connect_kwargs("postgres_default"))
    with conn, conn.cursor() as cur:
        table = sql.Identifier(store)
        cur.execute(sql.SQL(dead_letters.POSTGRES_DDL).format(table))
        dead_letters.insert_postgres(cur, table, dead_letters.DeadLetters(store, rows))
        if close:  # what a repair does to a letter it re-applied
            cur.execute(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS closed_at timestamptz").format(table))
            cur.execute(
                sql.SQL("UPDATE {} SET closed_at = now() WHERE kafka_offset = ANY(%s)").format(table), (list(close),)
            )
    conn.close()


def _events(trigger: DeadLetterTrigger, state: StateStore, wait: float) -> list[dict]:
    trigger.asset_state_store = state

    async def collect():
        out, gen = [], trigger.run()
        try:
            while True:
                out.append((await asyncio.wait_for(gen.__anext__(), wait)).payload)
        except TimeoutError:
            pass
        await gen.aclose()
        return out

    return asyncio.run(collect())


def test_new_open_letters_of_the_pipeline_are_announced_once(stack, airflow_connections):
    pipeline, table = f"dlt-{uuid.uuid4().hex[:8]}", f"dlt_{uuid.uuid4().hex[:8]}"
    store = dead_letters.default_store("postgres", table)
    _insert(store, [_letter(pipeline, o, "nul_character") for o in (3, 7, 12)] + [_letter("other", 5, "x")])
    state = StateStore()

    def trigger():
        return DeadLetterTrigger("postgres", table, pipeline, poll_interval=0.05)

    first = _events(trigger(), state, wait=2)
    assert [(e["new_letters"], e["open_letters"], e["by_class"]) for e in first] == [(3, 3, {"nul_character": 3})]
    assert [r["record"] for r in first[0]["letters"]] == ["orders/1@3", "orders/1@7", "orders/0@12"]
    assert first[0]["store"] == store and first[0]["pipeline"] == pipeline

    # Two new letters; a repair closes an announced one and one of the new ones before any poll saw it.
    _insert(store, [_letter(pipeline, o, "invalid_utf8") for o in (20, 21)], close=[7, 21])
    second = _events(trigger(), state, wait=2)  # a restarted triggerer: resumes after the last announced letter
    assert [(e["new_letters"], e["open_letters"]) for e in second] == [(1, 3)]
    assert [(r["record"], r["error_class"]) for r in second[0]["letters"]] == [("orders/0@20", "invalid_utf8")]
    assert state.values[STATE_KEY][1:] == ["orders", 0, 20]

    assert _events(trigger(), state, wait=0.5) == []  # nothing new: nothing announced again
