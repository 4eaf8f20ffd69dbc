"""Event trigger: announce new dead letters of a pipeline as an Airflow Asset event, so users can alert on them.

``on_bad_record="dead_letter"`` keeps a night or a stream going past a bad record; somebody still has to look at
the letter. This trigger runs in the triggerer as an :class:`~airflow.sdk.AssetWatcher` of the pipeline's
dead-letter Asset (:func:`~exactly_once_provider.assets.dead_letters`): it reads the OPEN letters of the pipeline
from its store (the same reader the status page uses, without the sink's bookkeeping) and yields an event when
letters appeared that it has not announced, with their records and errors in the event's extra. A DAG scheduled
on that Asset (an alert, a ticket, a repair run) runs once per event.

Which letters are new: a letter's ``(dead_lettered_at, topic, partition, offset)`` is past the newest one
announced. One pipeline's batches commit in order, and a letter is written once (the store's key is its record),
so the letters of a later batch sort after those announced. A letter a repair closes before it was seen is not
announced; letters that appear between two polls are announced together.

Announced at least once, like :mod:`~exactly_once_provider.triggers.sink_commits`: the newest announced letter is
kept in the Asset's state store after the event is handed over; a triggerer restart in between announces those
letters again, and the first start announces every open letter.

A Delta store commits before its sink (docs/dead-letters.md): a letter may be announced while its batch's sink
commit is still to come (the batch's replay completes it; the letter is not written again).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from exactly_once_provider.triggers.arguments import SerializedByArguments

STATE_KEY = "exactly_once_last_dead_letter"
LISTED = 20  # letters named in one event; the counts cover all of them
COLUMNS = ("kafka_topic", "kafka_partition", "kafka_offset", "error_class", "error_message", "dead_lettered_at")


def letter_mark(letter: dict) -> list:
    """Return where ``letter`` sorts among a pipeline's letters (JSON-storable)."""
    at = letter["dead_lettered_at"]
    at = at.astimezone(UTC) if at.tzinfo else at.replace(tzinfo=UTC)
    return [at.isoformat(), letter["kafka_topic"], int(letter["kafka_partition"]), int(letter["kafka_offset"])]


def new_letters(letters: list[dict], mark: list | None) -> list[dict]:
    """Return the letters past ``mark`` (all of them when None), oldest first."""
    ordered = sorted(letters, key=letter_mark)
    return ordered if mark is None else [letter for letter in ordered if letter_mark(letter) > mark]


def describe_letters(new: list[dict], open_letters: int, store: str, pipeline: str) -> dict[str, Any]:
    """Return the Asset event's extra for the ``new`` letters of ``store`` (``open_letters`` open in all)."""
    by_class: dict[str, int] = {}
    for letter in new:
        by_class[letter["error_class"]] = by_class.get(letter["error_class"], 0) + 1
    return {
        "store": store,
        "pipeline": pipeline,
        "new_letters": len(new),
        "open_letters": open_letters,
        "by_class": dict(sorted(by_class.items())),
        "letters": [
            {
                "record": f"{r['kafka_topic']}/{r['kafka_partition']}@{r['kafka_offset']}",
                "error_class": r["error_class"],
                "error_message": r["error_message"],
                "dead_lettered_at": letter_mark(r)[0],
            }
            for r in new[-LISTED:]
        ],
        "seen_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


class DeadLetterTrigger(SerializedByArguments, BaseEventTrigger):
    """Yield an event each time new dead letters of ``sink_pipeline`` are in its store (for an AssetWatcher).

    :param sink: ``postgres`` or ``delta`` (the sinks whose letters are in a store table).
    :param sink_location: the PostgreSQL table or the Delta table's location (local or ``s3://``).
    :param sink_pipeline: the Spark job's pipeline name.
    :param store: the dead-letter store; default the sink's (``<table>_dead_letters`` / ``<path>_dead_letters``).
    :param postgres_conn_id: ``postgres`` sink: the connection, resolved in the triggerer.
    :param aws_conn_id: a Delta sink on ``s3://``: the ``aws`` connection, resolved in the triggerer.
    :param poll_interval: seconds between reads of the store.
    """

    def __init__(
        self,
        sink: str,
        sink_location: str,
        sink_pipeline: str,
        store: str | None = None,
        postgres_conn_id: str | None = None,
        aws_conn_id: str | None = None,
        poll_interval: float = 30.0,
    ) -> None:
        super().__init__()
        self.sink, self.sink_location, self.sink_pipeline, self.store = sink, sink_location, sink_pipeline, store
        self.postgres_conn_id, self.aws_conn_id, self.poll_interval = postgres_conn_id, aws_conn_id, poll_interval

    ARGUMENTS = ("sink", "sink_location", "sink_pipeline", "store", "postgres_conn_id", "aws_conn_id", "poll_interval")

    def _read(self, store: str, connect: dict | None, s3: Any) -> list[dict]:
        from exactly_once_provider.sinks import dead_letters

        if self.sink == "postgres":
            import psycopg2

            conn = psycopg2.connect(**connect)
            try:
                return dead_letters.store_rows("postgres", store, self.sink_pipeline, COLUMNS, pg_conn=conn)
            finally:
                conn.close()
        options = s3.delta_rs_options() if s3 is not None else None
        return dead_letters.store_rows("delta", store, self.sink_pipeline, COLUMNS, storage_options=options)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from exactly_once_provider.sinks.dead_letters import default_store
        from exactly_once_provider.triggers.consumer_lag import sink_connections

        store = self.store or default_store(self.sink, self.sink_location)
        connect, s3 = await sink_connections(self.sink, [store], self.postgres_conn_id, self.aws_conn_id)
        state = self.asset_state_store
        mark = None if state is None else await state.aget(STATE_KEY)
        while True:
            letters = await asyncio.to_thread(self._read, store, connect, s3)
            new = new_letters(letters, mark)
            if new:
                extra = describe_letters(new, len(letters), store, self.sink_pipeline)
                self.log.warning(
                    "dead-letter store %s: %d new letter(s) of pipeline %s (%s); %d open",
                    store,
                    len(new),
                    self.sink_pipeline,
                    ", ".join(f"{n} {kind}" for kind, n in extra["by_class"].items()),
                    len(letters),
                )
                yield TriggerEvent(extra)
                mark = letter_mark(new[-1])
                if state is not None:
                    await state.aset(STATE_KEY, mark)
            await asyncio.sleep(self.poll_interval)
