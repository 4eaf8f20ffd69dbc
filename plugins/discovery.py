"""Which pipelines the status page shows, and where each one keeps its truth.

A pipeline is found in three places, merged by its name:

1. the DAGs: every task of this provider's operators in the serialized DAGs (the metadata DB copy the
   API server already reads) names its pipeline, topics, offsets topic and sink (a binlog capture also
   names its tables' full loads). Templated values of the
   form ``{{ params.x }}`` are rendered with the DAG's Param defaults; a value that needs a run (e.g.
   ``{{ ds }}``) cannot be known before the run and is listed as unresolved instead of guessed;
2. the offsets ledger: the ``<pipeline>/<source_partition>`` keys of the offsets topics the DAGs name (the
   default ``eo-offsets`` always). A page load reads the keys the DAGs' producers name backwards from the
   end of their partitions (the cost of the distance back to their last commits, not of history), and only
   the partitions of pipelines the DAGs name without a producer; ``?all_keys=true`` reads every key, so a pipeline produced from outside Airflow shows up too (as it
   does when no DAG names any pipeline);
3. the PostgreSQL offsets table ``eo_stream_offsets``: every pipeline that committed there.

The DAGs are the only place that says where a Delta table or files sink lives, so those sinks show up
once a DAG names them. A full load (which has no pipeline name) is attached to the pipelines of its DAG,
or shown under the DAG id when the DAG has no other pipeline task.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jinja2 import StrictUndefined, TemplateError
from jinja2.sandbox import SandboxedEnvironment

from exactly_once_provider.kafka.offsets import DEFAULT_OFFSETS_TOPIC
from exactly_once_provider.storage import is_s3

PRODUCERS = {"TransactionalProduceOperator", "WatermarkExtractOperator", "BinlogCaptureOperator"}
STREAMS = {"SparkKafkaToSinkOperator"}
FULL_LOADS = {"MySqlFullLoadOperator"}
RECONCILERS = {"ReconcileOperator"}
MODULE_PREFIX = "exactly_once_provider."
_JINJA = SandboxedEnvironment(undefined=StrictUndefined)
# How a serialized DAG holds an argument taken from an upstream task's XCom (e.g. the tables a pattern matched).
_UPSTREAM_XCOM = re.compile(
    r"^\{\{ task_instance\.xcom_pull\(task_ids='(?P<task>[^']+)', dag_id='(?P<dag>[^']+)', key='(?P<key>[^']+)'\) \}\}$"
)
NewestXCom = Callable[[str, str, str], Any]  # (dag_id, task_id, key) -> the newest run's value, None if none


@dataclass(frozen=True)
class SinkSpec:
    """Where a streaming job commits: ``kind`` is delta/postgres/files/iceberg, ``location`` a path or table.

    ``conn_id`` is the PostgreSQL connection of a ``postgres`` sink, or the database of an ``iceberg`` sink's SQL
    catalog; ``aws_conn_id`` the ``aws`` connection of a Delta table, files sink or Iceberg table on ``s3://`` (the
    task's own, so the page reads the bucket the job writes); ``dead_letter_store`` the task's
    ``dead_letter_store`` when it names one (None: the sink's default store); ``iceberg_catalog`` the name of an
    ``iceberg`` sink's catalog. An Iceberg sink's ``location`` is its table, ``namespace.table``: the catalog
    knows where the table lives, and its commits (snapshots) are read through the catalog.
    """

    kind: str
    location: str
    conn_id: str | None = None
    aws_conn_id: str | None = None
    dead_letter_store: str | None = None
    iceberg_catalog: str | None = None


@dataclass
class PipelineSpec:
    """Everything known about one pipeline before reading the live systems."""

    name: str
    dag_ids: set[str] = field(default_factory=set)
    topics: set[str] = field(default_factory=set)
    offsets_topics: set[str] = field(default_factory=set)
    kafka_conn_ids: set[str] = field(default_factory=set)
    sinks: set[SinkSpec] = field(default_factory=set)
    sources: set[str] = field(default_factory=set)  # source tables (schema.table) a producer reads
    full_loads: set[SinkSpec] = field(default_factory=set)  # Delta tables holding full-load handoff commits
    result_conn_ids: set[str] = field(default_factory=set)  # PostgreSQL connections holding eo_reconciliation
    checked_topics: set[str] = field(default_factory=set)  # a reconciliation's: the card of the flow it checks
    found_in: set[str] = field(default_factory=set)  # "dag", "ledger", "postgres"
    source_partitions: set[str] = field(default_factory=set)  # ledger keys "<name>/<sp>" its producers write


@dataclass
class Discovery:
    """The pipelines by name, and the task arguments that could not be resolved (shown, not guessed)."""

    pipelines: dict[str, PipelineSpec] = field(default_factory=dict)
    unresolved: list[str] = field(default_factory=list)

    def pipeline(self, name: str, found_in: str) -> PipelineSpec:
        spec = self.pipelines.setdefault(name, PipelineSpec(name))
        spec.found_in.add(found_in)
        return spec

    def offsets_topics(self) -> set[str]:
        """Return the offsets topics to scan: the default one and every one a DAG names."""
        return {DEFAULT_OFFSETS_TOPIC}.union(*(p.offsets_topics for p in self.pipelines.values()))


def render(value: Any, params: Mapping[str, Any]) -> Any:
    """
    Return ``value`` with ``{{ params.* }}`` templates rendered from the DAG's Param defaults.

    :param value: a task argument as serialized (a string may hold a Jinja template).
    :param params: the DAG's Param defaults.
    :raises ValueError: the template needs more than the Param defaults (a run's context).
    """
    if not isinstance(value, str) or "{" not in value:
        return value
    try:
        return _JINJA.from_string(value).render(params=dict(params))
    except TemplateError as err:
        raise ValueError(f"{value!r} is known only when a run renders it ({err})") from err


def _topics(value: Any) -> set[str]:
    items = [value] if isinstance(value, str) else list(value or ())
    return {t.strip() for item in items for t in str(item).split(",") if t.strip()}


def _capture_topics(task: Any, pipeline: str, params: Mapping[str, Any]) -> dict[str, str]:
    """Return ``{schema.table: topic}`` of a binlog capture task (a bare table needs the connection)."""
    from exactly_once_provider.capture.change_record import DEFAULT_TOPIC_TEMPLATE, topic_for

    tables = render(task.tables, params)
    names = [tables] if isinstance(tables, str) else list(tables or ())
    template = render(getattr(task, "topic_template", DEFAULT_TOPIC_TEMPLATE), params)
    topics = {}
    for name in (n.strip() for item in names for n in str(item).split(",") if n.strip()):
        schema, _, table = name.rpartition(".")
        if not schema:
            raise ValueError(
                f"table {name!r} takes its schema from the MySQL connection: name it schema.table "
                "for its topic to be shown"
            )
        topics[name] = topic_for(template, pipeline, schema, table)
    return topics


def _add_stream(spec: PipelineSpec, task: Any, params: Mapping[str, Any]) -> None:
    """Add a Kafka -> sink task's topics and sinks: its own, or each of its ``streams`` (one query per table)."""
    sink = render(task.sink, params)
    queries = getattr(task, "streams", None) or [
        {"topics": task.topics, "sink_path": task.sink_path, "sink_table": task.sink_table}
    ]
    for query in queries:
        topics = query.get("topics")
        spec.topics |= _topics([render(t, params) for t in ([topics] if isinstance(topics, str) else topics or ())])
        table = sink in ("postgres", "iceberg")  # named by its table; an Iceberg table's path is its catalog's
        location = render(query.get("sink_table") if table else query.get("sink_path"), params)
        # an Iceberg table lives on the store of sink_path (mode="current": beside the Delta full load there)
        on_s3 = sink != "postgres" and is_s3(render(query.get("sink_path"), params) or "")
        store = render(getattr(task, "dead_letter_store", None), params) or None  # one query only (streams: unset)
        iceberg = sink == "iceberg"
        spec.sinks.add(
            SinkSpec(
                sink,
                location,
                render(getattr(task, "iceberg_conn_id" if iceberg else "postgres_conn_id", None), params),
                render(getattr(task, "aws_conn_id", None) or "aws_default", params) if on_s3 else None,
                store,
                render(getattr(task, "iceberg_catalog", None), params) if iceberg else None,
            )
        )
    spec.kafka_conn_ids.add(getattr(task, "kafka_conn_id", "kafka_default"))


def _delta_table(location: str, task: Any, params: Mapping[str, Any]) -> SinkSpec:
    """Return a Delta table a task writes or reads, with the task's ``aws`` connection when it is on S3."""
    aws = render(getattr(task, "aws_conn_id", None) or "aws_default", params) if is_s3(location or "") else None
    return SinkSpec("delta", location, None, aws)


class _PerInstance(ValueError, AttributeError):
    """A mapped task's argument that only its expanded instances have."""


class _TaskView:
    """A task's arguments as discovery reads them.

    An argument taken from an upstream task's XCom (the tables a pattern matched, resolved by the preflight at
    every run) is the newest run's value; a mapped task's arguments are its partial ones (each instance's own are
    known only in a run).
    """

    def __init__(self, task: Any, newest_xcom: NewestXCom | None) -> None:
        self._task, self._newest_xcom = task, newest_xcom

    def __getattr__(self, name: str) -> Any:
        task = self._task
        partial = getattr(task, "partial_kwargs", None)
        if partial is not None and name not in ("task_id", "task_type", "_task_module"):
            if name not in partial:  # an argument with a default (getattr's applies) or one each instance has
                raise _PerInstance(f"{name} differs per mapped instance: known only when a run expands the task")
            value = partial[name]
        else:
            value = getattr(task, name)
        upstream = _UPSTREAM_XCOM.match(value) if isinstance(value, str) else None
        if upstream is None:
            return value
        newest = self._newest_xcom(upstream["dag"], upstream["task"], upstream["key"]) if self._newest_xcom else None
        if newest is None:
            raise ValueError(f"{name} comes from task {upstream['task']!r} at run time: known after the first run")
        return newest


def add_dags(found: Discovery, dags: Iterable[Any], newest_xcom: NewestXCom | None = None) -> Discovery:
    """
    Add the pipelines the tasks of ``dags`` declare (serialized or parsed DAG objects).

    :param found: the discovery to extend.
    :param dags: DAG objects with ``dag_id``, ``params`` and ``tasks``.
    :param newest_xcom: ``newest_xcom(dag_id, task_id, key)`` returns the newest run's XCom value (None: none),
        for arguments taken from an upstream task's XCom; without it they are listed as unresolved.
    """
    for dag in dags:
        params = {key: dag.params[key] for key in dag.params}
        names: set[str] = set()
        loads: set[SinkSpec] = set()
        for serialized in dag.tasks:
            task = _TaskView(serialized, newest_xcom)
            kind = task.task_type
            if kind not in PRODUCERS | STREAMS | FULL_LOADS | RECONCILERS or not str(
                getattr(task, "_task_module", MODULE_PREFIX)
            ).startswith(MODULE_PREFIX):
                continue
            try:
                if kind in FULL_LOADS:  # several tables: a {table} placeholder names each one's location
                    path = render(task.sink_path, params)
                    tables = render(getattr(task, "tables", None), params) if "{table}" in path else None
                    for location in [path.replace("{table}", t) for t in tables] if tables else [path]:
                        loads.add(_delta_table(location, task, params))
                    continue
                if kind in RECONCILERS:  # its result rows are named like the pipelines (or tables) it checks
                    several = render(getattr(task, "tables", None), params)
                    for entry in several or [{"name": task.name, "topics": getattr(task, "topics", None)}]:
                        spec = found.pipeline(render(entry["name"], params), "dag")
                        spec.dag_ids.add(dag.dag_id)
                        spec.checked_topics |= _topics([render(t, params) for t in entry.get("topics") or ()])
                        spec.result_conn_ids.add(
                            render(getattr(task, "postgres_conn_id", None) or "postgres_default", params)
                        )
                    continue
                spec = found.pipeline(render(task.pipeline, params), "dag")
                spec.dag_ids.add(dag.dag_id)
                names.add(spec.name)
                if kind in STREAMS:
                    _add_stream(spec, task, params)
                elif kind == "BinlogCaptureOperator":
                    captured = _capture_topics(task, spec.name, params)
                    spec.topics |= set(captured.values())
                    spec.sources |= set(captured)
                    spec.full_loads |= {
                        _delta_table(render(path, params), task, params)
                        for path in (task.full_load_paths or {}).values()
                    }
                    spec.offsets_topics.add(render(getattr(task, "offsets_topic", DEFAULT_OFFSETS_TOPIC), params))
                    spec.kafka_conn_ids.add(render(getattr(task, "kafka_config_id", "kafka_default"), params))
                    spec.source_partitions.add(render(getattr(task, "source_partition", "binlog"), params))
                else:
                    spec.topics.add(render(task.topic, params))
                    partition = render(getattr(task, "source_partition", None), params)
                    if kind == "WatermarkExtractOperator":
                        spec.sources.add(render(task.table, params))
                        partition = partition or render(task.table, params)
                    spec.source_partitions.add(partition or "0")
                    spec.offsets_topics.add(render(getattr(task, "offsets_topic", DEFAULT_OFFSETS_TOPIC), params))
                    spec.kafka_conn_ids.add(render(getattr(task, "kafka_config_id", "kafka_default"), params))
            except ValueError as err:
                found.unresolved.append(f"{dag.dag_id}.{task.task_id}: {err}")
        for name in names or ({dag.dag_id} if loads else set()):
            spec = found.pipeline(name, "dag")
            spec.dag_ids.add(dag.dag_id)
            spec.full_loads |= loads
    return found


def add_ledger_keys(found: Discovery, keys: Iterable[str], offsets_topic: str) -> Discovery:
    """
    Add the pipelines of offsets-ledger keys ``"<pipeline>/<source_partition>"``.

    :param found: the discovery to extend.
    :param keys: the ledger keys read from ``offsets_topic``.
    :param offsets_topic: the topic they come from.
    """
    for key in keys:
        pipeline = key.split("/", 1)[0]
        found.pipeline(pipeline, "ledger").offsets_topics.add(offsets_topic)
    return found


def add_postgres_pipelines(found: Discovery, pipelines: Iterable[str], conn_id: str) -> Discovery:
    """
    Add the pipelines that committed into the PostgreSQL offsets table of connection ``conn_id``.

    :param found: the discovery to extend.
    :param pipelines: pipeline names read from ``eo_stream_offsets``.
    :param conn_id: the PostgreSQL connection they were read through.
    """
    for name in pipelines:
        spec = found.pipeline(name, "postgres")
        if not any(s.kind == "postgres" for s in spec.sinks):
            spec.sinks.add(SinkSpec("postgres", "", conn_id))
    return found


def newest_xcom(dag_id: str, task_id: str, key: str) -> Any:
    """Return the newest XCom value of ``key`` a run of ``task_id`` in ``dag_id`` pushed (None when none did)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        row = session.scalars(
            select(XComModel)
            .where(XComModel.dag_id == dag_id, XComModel.task_id == task_id, XComModel.key == key)
            .where(XComModel.map_index == -1)
            .order_by(XComModel.timestamp.desc())
            .limit(1)
        ).first()
        return None if row is None else XComModel.deserialize_value(row)


def serialized_dags() -> list[Any]:
    """Return the latest serialized version of every DAG in the metadata DB (what the API server shows)."""
    from airflow.models.serialized_dag import SerializedDagModel

    return list(SerializedDagModel.read_all_dags().values())
