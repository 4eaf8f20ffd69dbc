"""Flows: the pipelines of one data flow (source table -> topic(s) -> sink) on one card, with its figures at a
glance and their recent history.

A producer (binlog capture, watermark extract, produce task) and the streaming jobs that read its topics are
one flow: pipelines are joined when they share a topic (the templates name them ``<p>`` and ``<p>-apply`` /
``<p>-load``), whatever their names. A pipeline that shares no topic is a flow of its own.

The figures come from the sections :mod:`~exactly_once_provider.plugins.status` read, plus, per flow, no new
store:

* **history**: the last ``limit`` commits of each Delta sink (its commit log: time, this pipeline's rows in
  total, the Kafka offsets committed with them); rows/s between consecutive commits; the lag at each commit is
  the topic's records written before the commit's time (Kafka's offsets-for-times index) that the commit had
  not applied. PostgreSQL and files sinks keep their newest commit only: no chart;
* **freshness**: how long ago the oldest change the sink has not applied was committed (0 when the lag is 0):
  the source commit time of a binlog change record (``commit_ts``, whole seconds), else the Kafka record time
  (when the producer wrote it). A source commit the capture has not read yet is not counted: the capture's
  own lag is on its card as bytes of binlog;
* **position**: the committed binlog position of the producer, ``binlog.000001:18146205`` (GTID on hover).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from exactly_once_provider.kafka.change_times import unapplied_since
from exactly_once_provider.plugins.status import BEHIND, EMPTY, ERROR, MISMATCH, OK, PipelineStatus, Position

HISTORY = 30  # sink commits per chart


@dataclass
class Point:
    """One sink commit: when (epoch seconds), the pipeline's rows in the sink, the lag then (None: unknown)."""

    at: float
    rows: int
    lag: int | None = None
    rows_per_second: float | None = None


@dataclass
class Flow:
    """One card: the member pipelines and the figures read from them."""

    name: str
    members: list[PipelineStatus]
    sources: list[str] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)
    sinks: list[str] = field(default_factory=list)
    lag: int | None = None
    freshness: float | None = None
    throughput: float | None = None
    reconciliation: dict | None = None
    position: Position | None = None
    history: list[Point] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    tables: list[dict] = field(default_factory=list)  # a flow of several tables: one row per table
    dead_letters: int | None = None  # open dead letters of the members' stores (None: no store holds any)
    newest_letter: dict | None = None  # the newest of them (its error), for the card's figure

    @property
    def state(self) -> str:
        """The worst state of the members (error, mismatch, behind, then ok; empty when all are empty)."""
        states = {m.state for m in self.members}
        for state in (ERROR, MISMATCH, BEHIND, OK):
            if state in states:
                return state
        return EMPTY

    def has(self, pipeline: str) -> bool:
        """Return whether ``pipeline`` is one of the flow's pipelines."""
        return any(m.spec.name == pipeline for m in self.members)


def group(statuses: list[PipelineStatus]) -> list[list[PipelineStatus]]:
    """Join pipelines that share a topic (a reconciliation: the topics it checks, so the tables of one database
    are one card); return the groups, producers (pipelines with sources) first."""
    parent = list(range(len(statuses)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i, status in enumerate(statuses):
        for topic in status.spec.topics | status.spec.checked_topics:
            if topic in owner:
                parent[root(i)] = root(owner[topic])
            else:
                owner[topic] = i
    groups: dict[int, list[PipelineStatus]] = {}
    for i, status in enumerate(statuses):
        groups.setdefault(root(i), []).append(status)
    return [
        sorted(g, key=lambda s: (not s.spec.sources, not s.spec.offsets_topics, s.spec.name)) for g in groups.values()
    ]


TABLE_COLUMNS = ("table", "rows in sink", "lag", "freshness (s)", "last commit", "last reconciliation", "reconciled at")
FRESHNESS = "freshness (s)"  # whole seconds: the page sorts the column as numbers


def table_rows(members: list[PipelineStatus]) -> list[dict]:
    """Return one row per source table of a flow that follows several (a database): its rows in the sink, lag,
    freshness, last commit and last reconciliation, read from the members' sections (no further reads); empty for
    one table. Freshness is 0 for a table without lag here; a lagging table's is filled in by :func:`build` from
    the first record its sinks have not applied (:func:`table_of_topic`).

    A table is found by its topic (the capture's topics end with ``.<schema>.<table>``): the sinks' committed
    offsets, the lag rows and the reconciliations (by the topics they check) name it.
    """
    sources = sorted(set().union(*(m.spec.sources for m in members)))
    topics = set().union(*(m.spec.topics for m in members))
    if len(sources) < 2:
        return []
    table_of = {t: src for t in topics for src in sources if t.endswith(f".{src}")}
    rows = {src: {"table": src, "rows in sink": None, "lag": None} for src in sources}
    for member in members:
        for sink in _rows(member, "sink"):
            for topic in sink.get("next offsets") or {}:
                row = rows.get(table_of.get(topic, ""))
                if row is not None and row["rows in sink"] is None:  # the first sink (Delta before PostgreSQL)
                    row["rows in sink"], row["last commit"] = sink.get("rows in sink"), sink.get("commit")
        for lagging in _rows(member, "lag"):
            row = rows.get(table_of.get(lagging.get("topic"), ""))
            if row is not None and isinstance(lagging.get("lag"), int):
                row["lag"] = max(row["lag"] or 0, lagging["lag"])  # the furthest behind of the table's sinks
        checked = {table_of[t] for t in member.spec.checked_topics if t in table_of}
        for result in _rows(member, "reconciliation")[:1]:  # each sink's newest; a mismatch of any shows
            for row in (rows[src] for src in checked):
                if row.get("last reconciliation") != "mismatch":
                    row["last reconciliation"] = result["result"]
                row["reconciled at"] = max(row.get("reconciled at") or "", result["finished at"])
    for row in rows.values():
        row[FRESHNESS] = 0 if row["lag"] == 0 else None
    return list(rows.values())


def table_of_topic(tables: list[dict], topic: str) -> dict | None:
    """Return the row of ``tables`` whose table the capture's ``topic`` (``...<schema>.<table>``) carries."""
    return next((row for row in tables if topic.endswith(f".{row['table']}")), None)


def _rows(status: PipelineStatus, slug: str) -> list[dict]:
    return next((s.rows for s in status.sections if s.slug == slug), [])


def delta_history(location: str, pipeline: str, limit: int = HISTORY, s3: Any = None) -> list[tuple[float, int, dict]]:
    """Return ``(epoch seconds, rows in total, committed offsets)`` of the pipeline's last ``limit`` commits
    to a Delta table, oldest first (read from its commit log, newest first, ``limit`` markers deep).

    :param location: the Delta table.
    :param pipeline: the streaming pipeline.
    :param limit: how many commits.
    :param s3: a table on ``s3://``: its :class:`~exactly_once_provider.storage.s3.S3Settings`.
    """

    from exactly_once_provider.sinks.delta import DeltaSink, _output_rows
    from exactly_once_provider.sinks.delta_commit import commits
    from exactly_once_provider.storage import open_storage

    key = DeltaSink(location, pipeline).key
    found = []
    for _, actions in commits(open_storage(location, s3) if s3 is not None else location):
        info = actions.get("commitInfo", {})
        raw = info.get("userMetadata")
        body = json.loads(raw).get(key) if raw else None
        if not isinstance(body, dict):
            continue
        rows = (
            int(body.get("rows_total") or 0)
            if "windows" in body
            else int(body.get("rows_before", 0)) + _output_rows(info)
        )
        found.append((info.get("timestamp", 0) / 1000, rows, body.get("offsets") or {}))
        if len(found) >= limit:
            break
    return found[::-1]


def offsets_at_times(consumer: Any, asks: list[tuple[str, int, int]], ends: dict[tuple[str, int], int]) -> dict:
    """Return ``{(topic, partition, ms): offset}``: the first offset written at or after ``ms`` (Kafka's
    offsets-for-times index), the partition's end offset when nothing was written since.

    One request per round, each round asking every partition once, so a page costs as many requests as one flow
    has commits, not flows x commits.

    :param consumer: a Kafka consumer.
    :param asks: ``(topic, partition, epoch milliseconds)``.
    :param ends: ``{(topic, partition): end offset}`` read for the page.
    """
    from confluent_kafka import TopicPartition

    queues: dict[tuple[str, int], list[int]] = {}
    for topic, partition, ms in asks:
        queues.setdefault((topic, partition), []).append(ms)
    found = {}
    while any(queues.values()):
        asked = [TopicPartition(t, p, queue.pop()) for (t, p), queue in queues.items() if queue]
        for tp, ask in zip(consumer.offsets_for_times(asked, timeout=10), asked):
            found[(ask.topic, ask.partition, ask.offset)] = (
                tp.offset if tp.offset >= 0 else ends[(ask.topic, ask.partition)]
            )
    return found


@dataclass
class _Live:
    """What one page read asks Kafka for all flows at once, per Kafka connection."""

    asks: list = field(default_factory=list)  # (topic, partition, ms)
    ends: dict = field(default_factory=dict)  # (topic, partition) -> end offset
    lagging: list = field(default_factory=list)  # (topic, partition, sink next offset)
    fill: list = field(default_factory=list)  # callbacks(offsets at times, unapplied since)


def build(
    statuses: list[PipelineStatus], consumer_for: Any, limit: int = HISTORY, s3_for: Any = lambda sink: None
) -> list[Flow]:
    """Return one flow per group of ``statuses`` with its figures and history.

    :param statuses: the pipelines as :func:`~exactly_once_provider.plugins.status.read_overview` read them.
    :param consumer_for: ``consumer_for(kafka_conn_id)`` returns a read_committed consumer (cached per page).
    :param limit: sink commits per chart.
    :param s3_for: ``s3_for(sink)`` returns the S3 settings of a sink on ``s3://`` (None for others).
    """
    flows, live = [], {}
    for members in group(statuses):
        flow = Flow(members[0].spec.name, members)
        flow.tables = table_rows(members)
        flow.sources = sorted(set().union(*(m.spec.sources for m in members)))
        flow.topics = sorted(set().union(*(m.spec.topics for m in members)))
        flow.sinks = sorted({f"{s.kind} {s.location}".strip() for m in members for s in m.spec.sinks})
        lags = [m.lag for m in members if m.spec.sinks]
        flow.lag = sum(lags) if lags else None
        streams = ", ".join(m.spec.name for m in members if m.spec.sinks)
        for member in members:
            for section in member.sections:
                if section.slug == "lag" and streams and not member.spec.sinks:
                    section.note = f"The lag of this flow is measured at the sinks of {streams}."
            for row in _rows(member, "ledger"):
                if isinstance(row.get("offset"), Position) and flow.position is None:
                    flow.position = row["offset"]
            for row in _rows(member, "reconciliation")[:1]:
                if flow.reconciliation is None or row["finished at"] > flow.reconciliation["finished at"]:
                    flow.reconciliation = row
            for row in _rows(member, "dead_letters"):
                flow.dead_letters = (flow.dead_letters or 0) + row["open letters"]
            for row in _rows(member, "dead_letter_errors"):
                if flow.newest_letter is None or row["dead-lettered at"] > flow.newest_letter["dead-lettered at"]:
                    flow.newest_letter = row
            conn_id = sorted(member.spec.kafka_conn_ids)[0] if member.spec.kafka_conn_ids else "kafka_default"
            try:
                _plan(flow, member, live.setdefault(conn_id, _Live()), limit, s3_for)
            except Exception as err:  # shown on the card: a figure that cannot be read is said so, never guessed
                flow.notes.append(f"{member.spec.name}: history not read: {type(err).__name__}: {err}")
        flows.append(flow)
    now = time.time()
    for conn_id, asked in live.items():
        try:
            consumer = consumer_for(conn_id) if asked.asks or asked.lagging else None
            at_times = offsets_at_times(consumer, asked.asks, asked.ends) if asked.asks else {}
            since = unapplied_since(consumer, asked.lagging) if asked.lagging else {}
        except Exception as err:
            for flow in flows:
                flow.notes.append(f"lag history and freshness via {conn_id!r} not read: {type(err).__name__}: {err}")
            continue
        for fill in asked.fill:
            fill(at_times, since, now)
    return flows


def _plan(flow: Flow, member: PipelineStatus, live: _Live, limit: int, s3_for: Any) -> None:
    """Read the member's sink history; register what Kafka must answer for its lag history and freshness."""
    rows = [r for r in _rows(member, "lag") if isinstance(r.get("partition"), int)]
    for r in rows:
        live.ends[(r["topic"], r["partition"])] = r["end offset"]
    lagging = [
        (r["topic"], r["partition"], r["sink next offset"])
        for r in rows
        if isinstance(r.get("lag"), int) and r["lag"] > 0
    ]
    live.lagging += lagging
    if member.spec.sinks and member.lag == 0:
        flow.freshness = flow.freshness or 0.0

    def freshness(at_times: dict, since: dict, now: float) -> None:
        waited = [now - since[(t, p)] for t, p, _ in lagging if (t, p) in since]
        if waited:
            flow.freshness = max(flow.freshness or 0.0, max(0.0, *waited))
        for t, p, _ in lagging:  # a database's tables: each its own
            row = table_of_topic(flow.tables, t) if (t, p) in since else None
            if row is not None:
                row[FRESHNESS] = max(row[FRESHNESS] or 0, round(max(0.0, now - since[(t, p)])))

    live.fill.append(freshness)
    for sink in member.spec.sinks:
        if sink.kind == "iceberg":  # its snapshots are a history, not read for the charts yet
            flow.notes.append(f"iceberg sink {sink.location}: its commit history is not charted yet")
            continue
        if sink.kind != "delta":
            flow.notes.append(f"{sink.kind} sink {sink.location}: keeps its newest commit only, no history")
            continue
        history = delta_history(sink.location, member.spec.name, limit, s3_for(sink))
        points = [Point(at, total) for at, total, _ in history]
        for before, point in zip(points, points[1:]):
            if point.at > before.at:
                point.rows_per_second = (point.rows - before.rows) / (point.at - before.at)
        flow.history = points
        if len(points) > 1 and points[-1].at > points[0].at:
            flow.throughput = (points[-1].rows - points[0].rows) / (points[-1].at - points[0].at)
        for point in points:
            live.asks += [(r["topic"], r["partition"], int(point.at * 1000)) for r in rows]

        def lag_history(at_times: dict, since: dict, now: float, points=points, history=history) -> None:
            for point, (_, _, committed) in zip(points, history):
                point.lag = (
                    sum(
                        max(
                            0,
                            at_times[(r["topic"], r["partition"], int(point.at * 1000))]
                            - int((committed.get(r["topic"]) or {}).get(str(r["partition"]), 0)),
                        )
                        for r in rows
                    )
                    if rows
                    else None
                )

        live.fill.append(lag_history)
