"""Read where each pipeline stands, live, from the systems that hold the truth (never from a cache).

Every figure comes through the product's own readers: the offsets ledger
(:func:`~exactly_once_provider.kafka.offsets.read_ledger`), topic end offsets
(:func:`~exactly_once_provider.kafka.offsets.topic_end_offsets`), the sinks' ``committed()`` (Delta log marker,
PostgreSQL offsets table, files manifest), watermark windows (:mod:`~exactly_once_provider.kafka.windows`) and
full-load handoff records (:mod:`~exactly_once_provider.full_load.handoff`). A reader that fails shows its
error in its section; nothing is left out silently.

Consumer lag is per Kafka partition: the topic's end offset minus the next offset the sink committed. Both
count Kafka offsets (transaction markers included), so a caught-up pipeline shows 0.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

from exactly_once_provider.kafka.offsets import CommittedOffset, read_ledger, topic_end_offsets
from exactly_once_provider.plugins.discovery import (
    Discovery,
    PipelineSpec,
    SinkSpec,
    add_dags,
    add_ledger_keys,
    add_postgres_pipelines,
)
from exactly_once_provider.sinks import dead_letters, delta_commit
from exactly_once_provider.sinks.base import open_sink
from exactly_once_provider.storage import open_storage

NEWEST_LETTERS = 5  # the newest dead letters shown per store (their errors)
ACCESS_TIMEOUT = 5.0  # seconds a page waits for a Kafka connection's brokers before its cards show the error

OK, BEHIND, EMPTY, ERROR, MISMATCH = "ok", "behind", "empty", "error", "mismatch"


@dataclass
class Section:
    """One table of the page: column names, rows, and the error that stopped its reader (if any)."""

    slug: str
    title: str
    columns: tuple[str, ...]
    rows: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    note: str | None = None


@dataclass
class PipelineStatus:
    """The page's view of one pipeline."""

    spec: PipelineSpec
    sections: list[Section]
    lag: int | None = None

    @property
    def state(self) -> str:
        """``error`` if a reader failed, ``mismatch`` if the last reconciliation found differences, ``behind`` if
        lag > 0, ``empty`` if nothing committed, else ``ok``."""
        if any(s.error for s in self.sections):
            return ERROR
        if any(row.get("result") == "mismatch" for s in self.sections if s.slug == "reconciliation" for row in s.rows):
            return MISMATCH
        if self.lag:
            return BEHIND
        return OK if any(s.rows for s in self.sections) else EMPTY


@dataclass
class Overview:
    """Everything the page shows, and when it was read."""

    pipelines: list[PipelineStatus]
    unresolved: list[str]
    errors: list[str]
    notes: list[str]
    read_at: str
    flows: list[Any] = field(default_factory=list)  # plugins.flows.Flow: the pipelines joined per data flow
    seconds: float = 0.0  # how long the read took


class Connections:
    """Client settings from Airflow connections, built once per page read (credentials never leave here)."""

    def __init__(self) -> None:
        self._kafka: dict[str, dict] = {}
        self._consumers: dict[str, Any] = {}
        self._results: dict[str, dict[str, dict]] = {}
        self._s3: dict[str, Any] = {}
        self.refused: dict[str, Exception] = {}  # Kafka connections the brokers refused this page read

    def kafka(self, conn_id: str) -> dict[str, Any]:
        """Return the client settings of ``conn_id``; raise at once for a connection :meth:`check_kafka` refused."""
        if conn_id in self.refused:
            raise self.refused[conn_id]
        if conn_id not in self._kafka:
            from exactly_once_provider.hooks.kafka_client import kafka_client_config

            self._kafka[conn_id] = kafka_client_config(conn_id)
        return self._kafka[conn_id]

    def check_kafka(self, conn_ids: set[str], timeout: float = ACCESS_TIMEOUT) -> None:
        """Reach the brokers of every connection at once; remember the ones that refuse or do not answer.

        One broken connection then costs its pipelines' cards a clear error within ``timeout`` seconds, and
        every later read through it fails at once: not each reader waiting out its own client timeout (a page
        with one wrong password took about two minutes).
        """
        from concurrent.futures import ThreadPoolExecutor

        from exactly_once_provider.connections import check_kafka_access

        def check(conn_id: str) -> None:
            try:
                check_kafka_access(self.kafka(conn_id), conn_id, timeout=timeout)
            except Exception as err:  # noqa: BLE001 - any failure: the cards of this connection say it
                self.refused[conn_id] = err

        with ThreadPoolExecutor(max_workers=max(1, min(8, len(conn_ids)))) as pool:
            list(pool.map(check, sorted(conn_ids)))

    def consumer(self, conn_id: str, isolation: str = "read_committed") -> Any:
        """Return a consumer of ``conn_id`` shared by this page read (closed by :meth:`close`): one SASL/TLS
        handshake per connection and page, not one per topic."""
        key = f"{conn_id}/{isolation}"
        if key not in self._consumers:
            import uuid

            from confluent_kafka import Consumer

            from exactly_once_provider.kafka.offsets import end_offsets_consumer
            from exactly_once_provider.kafka_config import consumer_config

            config = self.kafka(conn_id)
            self._consumers[key] = (
                end_offsets_consumer(config)
                if isolation == "read_uncommitted"
                else Consumer(consumer_config(config, f"eo-status-{uuid.uuid4().hex[:8]}", isolation))
            )
        return self._consumers[key]

    def s3(self, sink: SinkSpec) -> Any:
        """Return the S3 settings of a sink on ``s3://`` (its task's ``aws`` connection, read once a page), else None."""
        if sink.aws_conn_id is None:
            return None
        if sink.aws_conn_id not in self._s3:
            from exactly_once_provider.storage.s3 import S3Settings, settings_for

            # an Iceberg sink's location is its table's name: discovery named the connection for a table on S3
            on_s3 = sink.kind == "iceberg"
            self._s3[sink.aws_conn_id] = (
                S3Settings.from_connection(sink.aws_conn_id) if on_s3 else settings_for(sink.aws_conn_id, sink.location)
            )
        return self._s3[sink.aws_conn_id]

    def end_offsets(self, conn_id: str, topic: str) -> dict[int, int]:
        """Return the topic's end offsets through this page's read_uncommitted consumer."""
        return topic_end_offsets(self.kafka(conn_id), topic, self.consumer(conn_id, "read_uncommitted"))

    def reconciliations(self, conn_id: str) -> dict[str, dict]:
        """Return the newest reconciliation result of every name in ``conn_id``'s database (one query a page)."""
        if conn_id not in self._results:
            import psycopg2

            from exactly_once_provider.reconcile.results import latest_results

            conn = psycopg2.connect(**self.postgres(conn_id))
            try:
                self._results[conn_id] = {r["name"]: r for r in latest_results(conn)}
            finally:
                conn.close()
        return self._results[conn_id]

    def close(self) -> None:
        for consumer in self._consumers.values():
            consumer.close()
        self._consumers.clear()

    @staticmethod
    def postgres(conn_id: str) -> dict[str, Any]:
        from exactly_once_provider.connections import connect_kwargs

        return connect_kwargs(conn_id, connect_timeout=10)


def _guard(section: Section, read: Callable[[], None]) -> Section:
    try:
        read()
    except Exception as err:  # shown on the page in red: a reader that fails must be seen, not hidden
        section.error = f"{type(err).__name__}: {err}"
    return section


@dataclass(frozen=True)
class Position:
    """A committed binlog position as the page shows it, ``binlog.000001:18146205``, with its GTID (on hover)."""

    text: str
    gtid: str | None = None

    def __str__(self) -> str:
        return self.text


def _offset_text(offset: Any) -> Any:
    if isinstance(offset, dict) and offset.get("kind") == "watermark":
        return f"watermark next lower = {offset.get('next_lower')}"
    if isinstance(offset, dict) and "file" in offset and "pos" in offset:
        from exactly_once_provider.positions import parse_position

        return Position(str(parse_position(offset)), offset.get("gtid"))
    return json.dumps(offset, sort_keys=True)


def ledger_section(
    spec: PipelineSpec, ledger: dict[str, CommittedOffset | ValueError], refused: dict[str, Exception] | None = None
) -> Section:
    """Return the committed source offsets of ``spec`` from the read ledger (one row per source partition).

    ``refused``: the Kafka connections the brokers refused: a pipeline on one shows why its ledger was not read.
    """
    section = Section(
        "ledger",
        "Committed source offset (offsets ledger)",
        ("source partition", "offset", "batch", "version", "records", "sequence", "mode", "committed at"),
    )
    for conn_id in sorted(spec.kafka_conn_ids & set(refused or {})):
        section.error = f"{type(refused[conn_id]).__name__}: {refused[conn_id]}"
    for key, record in sorted(ledger.items()):
        pipeline, _, partition = key.partition("/")
        if pipeline != spec.name:
            continue
        if isinstance(record, ValueError):
            section.error = f"{key}: {record}"
            continue
        section.rows.append(
            {
                "source partition": partition,
                "offset": _offset_text(record.offset),
                "batch": record.batch_id,
                "version": record.batch_version,
                "records": record.records,
                "sequence": record.sequence,
                "mode": record.delivery_mode,
                "committed at": record.committed_at,
            }
        )
    return section


def windows_section(spec: PipelineSpec, ledger: dict[str, CommittedOffset | ValueError]) -> Section:
    """Return the settlement windows the watermark ledger records (newest first), with their versions."""
    section = Section(
        "windows",
        "Settlement windows",
        ("source partition", "batch", "version", "lower", "upper", "bound by", "rows", "checksum", "published at"),
    )
    for key, record in sorted(ledger.items()):
        if not key.startswith(f"{spec.name}/") or not isinstance(record, CommittedOffset):
            continue
        offset = record.offset
        if not (isinstance(offset, dict) and offset.get("kind") == "watermark"):
            continue
        for window in reversed(list(offset.get("history", {}).values())):
            section.rows.append(
                {
                    "source partition": record.source_partition,
                    "batch": window["batch_id"],
                    "version": window["batch_version"],
                    "lower": window["lower"],
                    "upper": window["upper"],
                    "bound by": window["upper_reason"],
                    "rows": window["rows"],
                    "checksum": window["checksum"][:19],
                    "published at": window["published_at"],
                }
            )
    return section


def sink_commit(sink: SinkSpec, pipeline: str, connections: Connections) -> dict[str, Any] | None:
    """Return the last commit of ``pipeline`` in ``sink`` as a page row (None before the first commit)."""
    conn_id = sink.conn_id or "postgres_default"
    catalog = None
    if sink.kind == "iceberg":  # the SQL catalog the task names, in its connection's database
        from exactly_once_provider.sinks.iceberg import DEFAULT_CATALOG, sql_catalog

        catalog = partial(sql_catalog, partial(connections.postgres, conn_id), sink.iceberg_catalog or DEFAULT_CATALOG)
    reader = open_sink(
        sink.kind,
        sink.location,
        pipeline,
        postgres_connect=lambda: connections.postgres(conn_id),
        postgres_conn_id=conn_id,
        s3=connections.s3(sink) if sink.aws_conn_id else None,
        iceberg_catalog=catalog,
    )
    committed = reader.committed()
    if committed is None:
        return None
    windows = committed.extra.get("windows")
    return {
        "sink": sink.kind,
        "location": sink.location or "(offsets table only)",
        "commit": reader.commit_location(),
        "checkpoint": committed.checkpoint_id,
        "batch id": committed.batch_id,
        "rows in sink": committed.rows_total,
        "next offsets": committed.offsets,
        "_windows": windows or {},
    }


def sink_windows_section(sink_rows: list[dict[str, Any]]) -> Section:
    """Return the settlement windows each sink holds (window mode): the version that won and its rows."""
    section = Section(
        "sink_windows",
        "Settlement windows applied in the sink (window mode)",
        ("sink", "location", "window", "version", "rows"),
    )
    for row in sink_rows:
        for window, state in sorted((row.get("_windows") or {}).items(), reverse=True):
            section.rows.append(
                {
                    "sink": row["sink"],
                    "location": row["location"],
                    "window": window,
                    "version": int(state["version"]),
                    "rows": int(state.get("rows", 0)),
                }
            )
    return section


def sinks_section(spec: PipelineSpec, connections: Connections) -> Section:
    """Return the last sink commit of each sink of ``spec``."""
    section = Section(
        "sink",
        "Last sink commit",
        ("sink", "location", "commit", "checkpoint", "batch id", "rows in sink", "next offsets"),
    )

    def read() -> None:
        errors = []
        for sink in sorted(spec.sinks, key=lambda s: (s.kind, s.location)):
            try:
                row = sink_commit(sink, spec.name, connections)
            except Exception as err:
                errors.append(f"{sink.kind} {sink.location}: {type(err).__name__}: {err}")
                continue
            section.rows.append(row or {"sink": sink.kind, "location": sink.location, "commit": "no commit yet"})
        if errors:
            raise RuntimeError("; ".join(errors))

    return _guard(section, read)


def lag_section(spec: PipelineSpec, sink_rows: list[dict[str, Any]], connections: Connections) -> tuple[Section, int]:
    """Return end offsets and lag per topic partition (lag against the least advanced sink), and total lag."""
    section = Section(
        "lag", "Kafka end offsets and consumer lag", ("topic", "partition", "end offset", "sink next offset", "lag")
    )
    committed: dict[str, dict[str, int]] = {}
    for row in sink_rows:
        for topic, parts in (row.get("next offsets") or {}).items():
            for partition, offset in parts.items():
                previous = committed.setdefault(topic, {}).get(str(partition))
                committed[topic][str(partition)] = offset if previous is None else min(previous, offset)
    total = 0
    topics = sorted(spec.topics | set(committed))

    def read() -> None:
        nonlocal total
        conn_id = sorted(spec.kafka_conn_ids)[0] if spec.kafka_conn_ids else "kafka_default"
        for topic in topics:
            try:
                ends = connections.end_offsets(conn_id, topic)
            except ValueError:  # named by a DAG that has not produced yet: nothing to lag behind
                section.rows.append({"topic": topic, "partition": "—", "end offset": "topic not created yet"})
                continue
            for partition, end in ends.items():
                sink_next = committed.get(topic, {}).get(str(partition))
                # a partition nothing was ever written to has nothing to lag behind, whether or not the sink
                # committed from it (an idle table of a whole database: its changes were all in its snapshot)
                lag = 0 if end == 0 else None if sink_next is None else end - sink_next
                total += lag or 0
                section.rows.append(
                    {
                        "topic": topic,
                        "partition": partition,
                        "end offset": end,
                        "sink next offset": "—" if sink_next is None else sink_next,
                        "lag": "—" if lag is None else lag,
                    }
                )

    _guard(section, read)
    if not spec.sinks:
        section.note = "No streaming job of this pipeline is declared in a DAG: lag is not known."
    return section, total


RECENT_COMMITS = 200  # reloads older than this many commits are left to the table's Delta history


def full_loads_section(spec: PipelineSpec, connections: Connections) -> Section:
    """Return the full load each table builds on, and the reloads among its newest commits (newest first).

    The current full load comes from :func:`~exactly_once_provider.full_load.handoff.read_handoff` (the newest
    commit, or the one a stream commit points to): a table that takes a stream commit a second is never read
    back to its first commit.
    """
    from itertools import islice

    from exactly_once_provider.full_load import handoff

    section = Section(
        "full_loads",
        "Full loads and reloads (handoff records)",
        ("table", "Delta version", "load id", "rows", "chunks", "snapshot from", "snapshot to", "published at"),
    )

    def row(h, info: dict) -> dict:
        published = info.get("timestamp")
        return {
            "table": f"{h.schema}.{h.table}",
            "Delta version": h.table_version,
            "load id": h.load_id,
            "rows": h.rows,
            "chunks": len(h.chunks),
            "snapshot from": str(h.min_position),
            "snapshot to": str(h.max_position),
            "published at": datetime.fromtimestamp(published / 1000, UTC).isoformat() if published else "",
        }

    def read() -> None:
        for table in sorted(spec.full_loads, key=lambda t: t.location):
            # on S3: read with the task's aws connection (as the capture reads the handoff), not this process's
            path = open_storage(table.location, connections.s3(table)) if table.aws_conn_id else table.location
            found = {}
            for version, actions in islice(delta_commit.commits(path), RECENT_COMMITS):
                info = actions.get("commitInfo", {})
                marker = json.loads(info.get("userMetadata") or "{}")
                if handoff.MARKER_KEY in marker:
                    found[version] = row(handoff.parse(version, marker), info)
            try:
                current = handoff.read_handoff(path)
            except LookupError:
                current = None
            if current is not None and current.table_version not in found:
                try:
                    info = delta_commit.read_commit(path, current.table_version).get("commitInfo", {})
                except FileNotFoundError:  # removed by the log cleanup; the staging manifest had the marker
                    info = {}
                found[current.table_version] = row(current, info)
            section.rows.extend(found[v] for v in sorted(found, reverse=True))

    return _guard(section, read)


def reconciliation_section(spec: PipelineSpec, connections: Connections) -> Section:
    """Return the last reconciliation result stored for the pipeline (``eo_reconciliation``, by name)."""
    section = Section(
        "reconciliation",
        "Last reconciliation",
        (
            "result",
            "finished at",
            "source rows",
            "sink rows",
            "missing",
            "extra",
            "changed",
            "duplicate",
            "in flight",
            "dead-lettered",
            "full scans",
            "run",
        ),
    )

    def read() -> None:
        for conn_id in sorted(spec.result_conn_ids or {"postgres_default"}):
            found = connections.reconciliations(conn_id).get(spec.name)
            rows = [found] if found else []
            for r in rows:
                section.rows.append(
                    {
                        "result": r["status"],
                        "finished at": r["finished_at"].isoformat(timespec="seconds"),
                        "source rows": r["source_rows"],
                        "sink rows": r["sink_rows"],
                        "missing": r["missing"],
                        "extra": r["extra"],
                        "changed": r["changed"],
                        "duplicate": r["duplicate"],
                        "in flight": r["in_flight"],
                        "dead-lettered": r.get("dead_lettered"),
                        "full scans": (r["cost"] or {}).get("full_scans"),
                        "run": f"{r['dag_id'] or ''} {r['run_id'] or ''}".strip(),
                    }
                )

    return _guard(section, read)


def dead_letters_section(spec: PipelineSpec, connections: Connections) -> tuple[Section, Section]:
    """Return the open dead letters of each sink of ``spec`` (``on_bad_record="dead_letter"``; a letter a repair
    closed is not open) per store, and the newest :data:`NEWEST_LETTERS` errors of each store.

    The store is the task's ``dead_letter_store``, else the sink's default one (``<table>_dead_letters`` /
    ``<path>_dead_letters``), read without the
    sink's bookkeeping (:func:`~exactly_once_provider.sinks.dead_letters.store_rows`); a sink whose store does not
    exist (the default policy) or holds no letter of the pipeline shows no row.
    """
    counts = Section("dead_letters", "Dead letters (open)", ("sink", "store", "open letters", "newest at"))
    errors = Section(
        "dead_letter_errors",
        "Newest dead letters",
        ("store", "record", "error class", "error", "dead-lettered at"),
    )
    columns = ("kafka_topic", "kafka_partition", "kafka_offset", "error_class", "error_message", "dead_lettered_at")

    def read() -> None:
        failed = []
        for sink in sorted(spec.sinks, key=lambda s: (s.kind, s.location)):
            if sink.kind not in ("postgres", "delta") or not sink.location:
                if sink.kind == "files":
                    counts.note = "A files sink lists its dead letters in its manifest; this page does not read them."
                continue
            store = sink.dead_letter_store or dead_letters.default_store(sink.kind, sink.location)
            try:
                rows = _letters_of(sink, store, spec.name, columns, connections)
            except Exception as err:
                failed.append(f"{store}: {type(err).__name__}: {err}")
                continue
            if not rows:
                continue
            rows.sort(key=lambda r: (r["dead_lettered_at"], r["kafka_offset"]), reverse=True)
            newest = rows[0]["dead_lettered_at"]
            counts.rows.append(
                {
                    "sink": sink.kind,
                    "store": store,
                    "open letters": len(rows),
                    "newest at": newest.isoformat(timespec="seconds") if newest else None,
                }
            )
            for r in rows[:NEWEST_LETTERS]:
                errors.rows.append(
                    {
                        "store": store,
                        "record": f"{r['kafka_topic']}/{r['kafka_partition']}@{r['kafka_offset']}",
                        "error class": r["error_class"],
                        "error": r["error_message"],
                        "dead-lettered at": r["dead_lettered_at"].isoformat(timespec="seconds"),
                    }
                )
        if failed:
            raise RuntimeError("; ".join(failed))

    guarded = _guard(counts, read)
    errors.error = guarded.error
    return guarded, errors


def _letters_of(sink: SinkSpec, store: str, pipeline: str, columns: tuple[str, ...], connections: Connections) -> list:
    if sink.kind == "postgres":
        import psycopg2

        conn = psycopg2.connect(**connections.postgres(sink.conn_id or "postgres_default"))
        try:
            return dead_letters.store_rows("postgres", store, pipeline, columns, pg_conn=conn)
        finally:
            conn.close()
    s3 = connections.s3(sink)
    return dead_letters.store_rows(
        "delta", store, pipeline, columns, storage_options=s3.delta_rs_options() if s3 is not None else None
    )


def read_overview(
    dags: list[Any],
    connections: Connections | None = None,
    every_ledger_key: bool = False,
    history: int = 30,
    newest_xcom: Any = None,
) -> Overview:
    """
    Discover the pipelines and read each one's state from the live systems.

    The ledger is read only in the partitions of the pipelines the DAGs name (:func:`read_ledger` with
    ``pipelines``), so a page load costs those partitions, not every pipeline's history; pipelines that
    only the ledger knows (produced from outside Airflow) are listed with ``every_ledger_key``.

    :param dags: serialized (or parsed) DAGs to discover pipelines from.
    :param connections: client settings; default: Airflow connections.
    :param every_ledger_key: read every key of the offsets topics, to list pipelines no DAG names.
    :param newest_xcom: reads the newest run's XCom of an argument a task takes from an upstream task (e.g. the
        tables a pattern matched): :func:`~exactly_once_provider.plugins.discovery.newest_xcom` on the API server.
    :param history: sink commits per flow chart.
    """
    import time

    from exactly_once_provider.plugins import flows

    started = time.monotonic()
    connections = connections or Connections()
    found = add_dags(Discovery(), dags, newest_xcom)
    errors: list[str] = []
    notes: list[str] = []
    ledger: dict[str, CommittedOffset | ValueError] = {}
    conn_ids = {c for p in found.pipelines.values() for c in p.kafka_conn_ids} or {"kafka_default"}
    connections.check_kafka(conn_ids)
    for conn_id in sorted(conn_ids - set(connections.refused)):  # a refused one: its pipelines' cards say why
        for topic in sorted(found.offsets_topics()):
            try:
                named = {n: spec for n, spec in found.pipelines.items() if topic in spec.offsets_topics}
                config = connections.kafka(conn_id)
                if every_ledger_key or not named:
                    records = read_ledger(config, topic, timeout=30)
                else:  # the keys the DAGs' producers write, read backwards; a pipeline without any: its partition
                    keyed = [(n, sp) for n, spec in sorted(named.items()) for sp in sorted(spec.source_partitions)]
                    records = read_ledger(config, topic, timeout=30, keys=keyed) if keyed else {}
                    if unkeyed := sorted(n for n, spec in named.items() if not spec.source_partitions):
                        records.update(read_ledger(config, topic, timeout=30, pipelines=unkeyed))
            except ValueError:  # the topic is created by the first exactly-once commit
                notes.append(f"offsets ledger {topic!r} via {conn_id!r} does not exist yet (nothing committed)")
                continue
            except Exception as err:
                errors.append(f"offsets ledger {topic!r} via {conn_id!r}: {type(err).__name__}: {err}")
                continue
            ledger.update(records)
            add_ledger_keys(found, records, topic)
    try:
        import psycopg2

        from exactly_once_provider.sinks.postgres import OFFSETS_TABLE

        with psycopg2.connect(**connections.postgres("postgres_default")) as conn, conn.cursor() as cur:
            cur.execute("SELECT to_regclass(%s)", (OFFSETS_TABLE,))
            if cur.fetchone()[0] is not None:
                cur.execute(f"SELECT DISTINCT pipeline FROM {OFFSETS_TABLE}")
                add_postgres_pipelines(found, [r[0] for r in cur.fetchall()], "postgres_default")
        conn.close()
    except Exception as err:
        errors.append(f"PostgreSQL offsets table via 'postgres_default': {type(err).__name__}: {err}")
    statuses = []
    for name in sorted(found.pipelines):
        spec = found.pipelines[name]
        sinks = sinks_section(spec, connections)
        lag, total = lag_section(spec, sinks.rows, connections)
        letters, letter_errors = dead_letters_section(spec, connections)
        sections = [
            ledger_section(spec, ledger, connections.refused),
            lag,
            sinks,
            reconciliation_section(spec, connections),
            windows_section(spec, ledger),
            sink_windows_section(sinks.rows),
            letters,
            letter_errors,
            full_loads_section(spec, connections),
        ]
        statuses.append(PipelineStatus(spec, sections, total))
    try:
        joined = flows.build(statuses, connections.consumer, history, s3_for=connections.s3)
    finally:
        connections.close()
    return Overview(
        statuses,
        found.unresolved,
        errors,
        notes,
        datetime.now(UTC).isoformat(timespec="seconds"),
        joined,
        time.monotonic() - started,
    )
