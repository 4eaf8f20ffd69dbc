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
* **freshness**: how long the oldest record the sink has not applied has waited in Kafka (0 when the lag is
  0; Kafka's record time, i.e. when the producer committed it: a source commit the capture has not read yet is
  not counted);
* **position**: the committed binlog position of the producer, ``binlog.000001:18146205`` (GTID on hover).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

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
    """Join pipelines that share a topic; return the groups, producers (pipelines with sources) first."""
    parent = list(range(len(statuses)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i, status in enumerate(statuses):
        for topic in status.spec.topics:
            if topic in owner:
                parent[root(i)] = root(owner[topic])
            else:
                owner[topic] = i
    groups: dict[int, list[PipelineStatus]] = {}
    for i, status in enumerate(statuses):
        groups.setdefault(root(i), []).append(status)
    return [sorted(g, key=lambda s: (not s.spec.sources, not s.spec.offsets_topics, s.spec.name))
            for g in groups.values()]


def _rows(status: PipelineStatus, slug: str) -> list[dict]:
    return next((s.rows for s in status.sections if s.slug == slug), [])


def delta_history(location: str, pipeline: str, limit: int = HISTORY) -> list[tuple[float, int, dict]]:
    """Return ``(epoch seconds, rows in total, committed offsets)`` of the pipeline's last ``limit`` commits
    to a Delta table, oldest first (read from its commit log, newest first, ``limit`` markers deep).

    :param location: the Delta table.
    :param pipeline: the streaming pipeline.
    :param limit: how many commits.
    """
    import json

    from exactly_once_provider.sinks.delta import DeltaSink, _output_rows
    from exactly_once_provider.sinks.delta_commit import commits

    key = DeltaSink(location, pipeline).key
    found = []
    for _, actions in commits(location):
        info = actions.get("commitInfo", {})
        raw = info.get("userMetadata")
        body = json.loads(raw).get(key) if raw else None
        if not isinstance(body, dict):
            continue
        rows = int(body.get("rows_total") or 0) if "windows" in body else int(body.get("rows_before", 0)) + _output_rows(info)
        found.append((info.get("timestamp", 0) / 1000, rows, body.get("offsets") or {}))
        if len(found) >= limit:
            break
    return found[::-1]


def lag_at(consumer: Any, when: float, offsets: dict[str, dict], partitions: dict[str, list[int]]) -> int:
    """Return the records written to the topics before ``when`` that ``offsets`` had not reached.

    :param consumer: a Kafka consumer (its offsets-for-times lookup).
    :param when: epoch seconds.
    :param offsets: ``{topic: {partition: next offset}}`` committed at ``when``.
    :param partitions: ``{topic: [partition, ...]}`` to count.
    """
    from confluent_kafka import TopicPartition

    asked = [TopicPartition(t, p, int(when * 1000)) for t, ps in partitions.items() for p in ps]
    total = 0
    for found in consumer.offsets_for_times(asked, timeout=10):
        end = found.offset
        if end < 0:  # no record at or after that time: every record was written before it
            end = consumer.get_watermark_offsets(TopicPartition(found.topic, found.partition), timeout=10,
                                                 cached=False)[1]
        committed = int((offsets.get(found.topic) or {}).get(str(found.partition), 0))
        total += max(0, end - committed)
    return total


def oldest_unapplied_age(consumer: Any, lagging: list[tuple[str, int, int]], now: float) -> float | None:
    """Return how many seconds the oldest unapplied record has waited (Kafka record time), None if none is read.

    :param consumer: a read_committed Kafka consumer.
    :param lagging: ``(topic, partition, sink next offset)`` of partitions with lag.
    :param now: epoch seconds.
    """
    from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, TopicPartition

    oldest = None
    for topic, partition, offset in lagging:
        consumer.assign([TopicPartition(topic, partition, offset)])
        message = consumer.poll(5)
        if message is None or message.error():
            continue
        kind, stamp = message.timestamp()
        if kind != TIMESTAMP_NOT_AVAILABLE:
            oldest = stamp / 1000 if oldest is None else min(oldest, stamp / 1000)
    consumer.unassign()
    return None if oldest is None else max(0.0, now - oldest)


def build(statuses: list[PipelineStatus], consumer_for: Any, limit: int = HISTORY) -> list[Flow]:
    """Return one flow per group of ``statuses`` with its figures and history.

    :param statuses: the pipelines as :func:`~exactly_once_provider.plugins.status.read_overview` read them.
    :param consumer_for: ``consumer_for(kafka_conn_id)`` returns a read_committed consumer (cached per page).
    :param limit: sink commits per chart.
    """
    flows = []
    now = time.time()
    for members in group(statuses):
        flow = Flow(members[0].spec.name, members)
        flow.sources = sorted(set().union(*(m.spec.sources for m in members)))
        flow.topics = sorted(set().union(*(m.spec.topics for m in members)))
        flow.sinks = sorted({f"{s.kind} {s.location}".strip() for m in members for s in m.spec.sinks})
        lags = [m.lag for m in members if m.spec.sinks]
        flow.lag = sum(lags) if lags else None
        for member in members:
            for row in _rows(member, "ledger"):
                if isinstance(row.get("offset"), Position) and flow.position is None:
                    flow.position = row["offset"]
            for row in _rows(member, "reconciliation")[:1]:
                if flow.reconciliation is None or row["finished at"] > flow.reconciliation["finished at"]:
                    flow.reconciliation = row
        _read_live(flow, consumer_for, now, limit)
        flows.append(flow)
    return flows


def _read_live(flow: Flow, consumer_for: Any, now: float, limit: int) -> None:
    for member in flow.members:
        conn_id = sorted(member.spec.kafka_conn_ids)[0] if member.spec.kafka_conn_ids else "kafka_default"
        lagging = [(r["topic"], r["partition"], r["sink next offset"]) for r in _rows(member, "lag")
                   if isinstance(r.get("lag"), int) and r["lag"] > 0]
        partitions: dict[str, list[int]] = {}
        for row in _rows(member, "lag"):
            if isinstance(row.get("partition"), int):
                partitions.setdefault(row["topic"], []).append(row["partition"])
        try:
            if member.spec.sinks and member.lag == 0:
                flow.freshness = flow.freshness or 0.0
            elif lagging:
                age = oldest_unapplied_age(consumer_for(conn_id), lagging, now)
                if age is not None:
                    flow.freshness = max(flow.freshness or 0.0, age)
            for sink in member.spec.sinks:
                if sink.kind != "delta":
                    flow.notes.append(f"{sink.kind} sink {sink.location}: keeps its newest commit only, no history")
                    continue
                history = delta_history(sink.location, member.spec.name, limit)
                points = [Point(at, rows) for at, rows, _ in history]
                for point, (_, _, committed) in zip(points, history):
                    point.lag = lag_at(consumer_for(conn_id), point.at, committed, partitions) if partitions else None
                for before, point in zip(points, points[1:]):
                    if point.at > before.at:
                        point.rows_per_second = (point.rows - before.rows) / (point.at - before.at)
                flow.history = points
                if len(points) > 1 and points[-1].at > points[0].at:
                    flow.throughput = (points[-1].rows - points[0].rows) / (points[-1].at - points[0].at)
        except Exception as err:  # shown on the card: a figure that cannot be read is said so, never guessed
            flow.notes.append(f"{member.spec.name}: history or freshness not read: {type(err).__name__}: {err}")
