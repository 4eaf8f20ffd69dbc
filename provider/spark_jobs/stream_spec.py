"""The streaming job's request, validated once: by the operator that builds it and by the job's command line."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

SINKS = ("delta", "postgres", "files", "iceberg")
TRIGGERS = ("available-now", "processing-time")
DELIVERIES = ("exactly-once", "at-least-once")
MODES = ("append", "cdc", "current", "window")
DELTA_COMMITS = ("own", "delta")


@dataclass(frozen=True)
class Route:
    """One table of a multi-table stream: its topics into its own sink.

    :param topics: the Kafka topics of this table (one source table's, in ``cdc``/``current`` mode).
    :param checkpoint: empty when the stream's routes share one query (the spec's ``checkpoint``); else this
        route's own query's checkpoint directory.
    :param path: its Delta table or files sink directory.
    :param table: its PostgreSQL table.
    """

    topics: tuple[str, ...]
    checkpoint: str = ""
    path: str | None = None
    table: str | None = None

    @classmethod
    def from_json(cls, item: dict[str, Any]) -> Route:
        """Return the route of a JSON object; refuse unknown settings."""
        unknown = sorted(set(item) - {f.name for f in fields(cls)})
        if unknown or "topics" not in item:
            raise ValueError(
                f"A route names 'topics', 'path' or 'table' and (one query per route) 'checkpoint', got {sorted(item)}."
            )
        return cls(**{**item, "topics": split_topics(item["topics"])})


@dataclass(frozen=True)
class StreamSpec:
    """What the Kafka -> sink job runs (see :class:`~exactly_once_provider.operators.spark_stream.SparkKafkaToSinkOperator`).

    :param pipeline: stable pipeline name (part of every sink commit).
    :param topics: the Kafka topics.
    :param checkpoint: this pipeline's checkpoint directory.
    :param sink: ``delta``, ``postgres``, ``files`` or ``iceberg``.
    :param path: the Delta table or files sink directory; ``postgres`` in ``current`` mode: the Delta table the
        full load published (the PostgreSQL current table is built from it); ``iceberg``: the table's location.
    :param table: the PostgreSQL table; ``iceberg``: the table in the catalog, ``namespace.table``.
    :param trigger: ``available-now`` or ``processing-time``.
    :param interval: processing-time trigger interval.
    :param max_offsets_per_trigger: cap on records per micro-batch.
    :param max_runtime: processing-time: seconds after which the stream stops cleanly.
    :param mode: ``append``, ``cdc`` (a changes table), ``current`` (merge the changes into the full load's
        table: :mod:`~exactly_once_provider.sinks.current_table`) or ``window``.
    :param key_field: CDC: JSON field of the record value holding the key.
    :param version_field: CDC: JSON field holding the source version.
    :param op_field: CDC: JSON field holding the operation.
    :param delta_commit: Delta append: the provider's own commit (``own``) or Delta's writer (``delta``).
    :param delivery: ``exactly-once`` or ``at-least-once`` (benchmark baseline).
    :param secrets_file: the command line's 0600 secrets file (a submitted job gets it from its job spec).
    :param on_bad_record: ``fail`` (stop at a record the sink cannot store, nothing of its batch committed) or
        ``dead_letter`` (commit it to the dead-letter store with its batch: :mod:`~exactly_once_provider.sinks.dead_letters`).
    :param max_dead_letters: ``dead_letter``: bad records allowed per batch (default 100); more fail the batch.
    :param max_dead_letter_ratio: ``dead_letter``: share of a batch's records allowed to be bad (0 < r <= 1).
    :param dead_letter_store: ``dead_letter``: the PostgreSQL table / Delta location of the letters (default
        ``<table>_dead_letters`` / ``<path>_dead_letters``; files: its manifest, not settable); with routes, each
        route's default.
    :param routes: several tables in ONE Spark application, each :class:`Route` with its own topics and sink
        (then ``topics``, ``path`` and ``table`` stay empty); every other setting is shared. With ``checkpoint``
        set, the routes share ONE streaming query over all their topics, split per table inside each
        micro-batch (:attr:`shared`: a batch costs only the tables it touches); without it, each route names its
        own checkpoint and runs its own query. Each table commits exactly as a one-route spec does
        (:meth:`queries`).
    """

    pipeline: str
    topics: tuple[str, ...]
    checkpoint: str
    sink: str
    path: str | None = None
    table: str | None = None
    trigger: str = "available-now"
    interval: str = "10 seconds"
    max_offsets_per_trigger: int | None = None
    max_runtime: float | None = None
    mode: str = "append"
    key_field: str = "pk"
    version_field: str = "version"
    op_field: str = "op"
    delta_commit: str = "own"
    delivery: str = "exactly-once"
    secrets_file: str | None = None
    on_bad_record: str = "fail"
    max_dead_letters: int | None = None
    max_dead_letter_ratio: float | None = None
    dead_letter_store: str | None = None
    routes: tuple[Route, ...] = ()

    def dead_letter_policy(self):
        """Return this one-route spec's :class:`~exactly_once_provider.sinks.dead_letters.DeadLetterPolicy`, or
        None with ``on_bad_record="fail"``."""
        from exactly_once_provider.sinks import dead_letters

        if self.on_bad_record != "dead_letter":
            return None
        location = self.table if self.sink == "postgres" else self.path
        return dead_letters.DeadLetterPolicy(
            store=self.dead_letter_store or dead_letters.default_store(self.sink, location),
            max_letters=self.max_dead_letters or dead_letters.DEFAULT_MAX_LETTERS,
            max_ratio=self.max_dead_letter_ratio,
            mode=self.mode,
        )

    @property
    def shared(self) -> bool:
        """Whether the routes share one streaming query (and the spec's checkpoint)."""
        return bool(self.routes) and bool(self.checkpoint)

    def queries(self) -> list[StreamSpec]:
        """Return one single-route spec per table of this spec (itself when it has no routes).

        Routes of a shared query each get the spec's checkpoint: every table's batches are that query's.
        """
        if not self.routes:
            return [self]
        return [
            replace(
                self, topics=r.topics, checkpoint=r.checkpoint or self.checkpoint, path=r.path, table=r.table, routes=()
            )
            for r in self.routes
        ]

    def validate(self) -> StreamSpec:
        """Return the spec; raise ValueError naming the first setting that is wrong."""
        if self.routes:
            return self._validate_routes()
        if not self.pipeline or not str(self.pipeline).replace("_", "").replace("-", "").isalnum():
            raise ValueError(
                f"pipeline must be a non-empty name of letters, digits, '-' and '_', got {self.pipeline!r}."
            )
        if not self.topics:
            raise ValueError("topics is empty: name at least one Kafka topic.")
        if self.sink not in SINKS:
            raise ValueError(f"sink must be one of {SINKS}, got {self.sink!r}.")
        if self.sink in ("delta", "files") and not self.path:
            raise ValueError(f"sink={self.sink!r} needs sink_path (the table or directory to write).")
        if self.sink == "postgres" and not self.table:
            raise ValueError("sink='postgres' needs sink_table.")
        if self.sink == "iceberg":
            self._validate_iceberg()
        if self.trigger not in TRIGGERS:
            raise ValueError(f"trigger must be one of {TRIGGERS}, got {self.trigger!r}.")
        if self.max_runtime is not None and (self.trigger != "processing-time" or self.max_runtime <= 0):
            raise ValueError(
                f"max_runtime={self.max_runtime!r}: a positive number of seconds, with "
                "trigger='processing-time' (an available-now run ends by itself)."
            )
        if self.delivery not in DELIVERIES:
            raise ValueError(f"delivery must be one of {DELIVERIES}, got {self.delivery!r}.")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}.")
        if self.delta_commit not in DELTA_COMMITS:
            raise ValueError(f"delta_commit must be one of {DELTA_COMMITS}, got {self.delta_commit!r}.")
        if self.mode == "window" and self.delivery != "exactly-once":
            raise ValueError("mode='window' replaces windows by version: it needs delivery='exactly-once'.")
        if self.mode == "current" and self.sink == "files":
            raise ValueError("mode='current' keeps one row per key: it needs sink='delta', 'postgres' or 'iceberg'.")
        if self.mode == "current" and self.sink == "postgres" and not self.path:
            raise ValueError(
                "mode='current' with sink='postgres' builds the table from the full load: set "
                "sink_path to the Delta table the full load published."
            )
        if self.mode == "current" and self.delivery != "exactly-once":
            raise ValueError("mode='current' merges by source version: it needs delivery='exactly-once'.")
        if self.mode == "cdc" and self.sink == "files":
            raise ValueError("mode='cdc' needs sink='delta', 'postgres' or 'iceberg': the files sink only appends.")
        if not self.checkpoint:
            raise ValueError("checkpoint_location is required: one checkpoint directory per pipeline.")
        from exactly_once_provider.sinks import dead_letters

        dead_letters.check_policy(
            self.on_bad_record,
            self.max_dead_letters,
            self.max_dead_letter_ratio,
            self.dead_letter_store,
            self.sink,
            self.mode,
            self.delivery,
        )
        if self.on_bad_record == "dead_letter" and self.dead_letter_policy().store in (self.path, self.table):
            raise ValueError(f"dead_letter_store {self.dead_letter_store!r} is the sink itself: name another.")
        return self

    def _validate_iceberg(self) -> None:
        """The Iceberg sink so far: one table, ``on_bad_record="fail"`` (docs/iceberg.md). ``current`` mode builds the
        table from the Delta full load at ``path`` (as the PostgreSQL current table does), at ``<path>_iceberg``."""
        if not self.table or self.table.count(".") < 1 or not self.path:
            raise ValueError(
                "sink='iceberg' needs sink_table (the table in the catalog, 'namespace.table') and sink_path "
                f"(its location, local or s3://), got sink_table={self.table!r}, sink_path={self.path!r}."
            )
        if self.on_bad_record != "fail":
            raise ValueError("sink='iceberg' has no dead-letter store yet: use on_bad_record='fail'.")

    def _validate_routes(self) -> StreamSpec:
        if self.sink == "iceberg":
            raise ValueError("sink='iceberg' writes one table per job so far: it takes no streams.")
        if self.topics or self.path or self.table:
            raise ValueError(
                "routes name each table's topics and sink: leave topics, sink_path and sink_table unset beside them."
            )
        own = [r for r in self.routes if r.checkpoint]
        if self.checkpoint and own:
            raise ValueError(
                f"Routes share the query's checkpoint {self.checkpoint!r}: leave each route's checkpoint unset "
                f"(route {','.join(own[0].topics)} names {own[0].checkpoint!r})."
            )
        if not self.checkpoint and len(own) < len(self.routes):
            raise ValueError("checkpoint_location is required: one for the query all routes share, or one per route.")
        if self.mode == "window":
            raise ValueError("mode='window' runs one query per application: it takes no routes.")
        if self.dead_letter_store:
            raise ValueError(
                "dead_letter_store names one store: with streams, leave it unset (each table gets "
                "'<its table or path>_dead_letters')."
            )
        queries = [q.validate() for q in self.queries()]
        for what, values in (
            ("checkpoint", [] if self.shared else [q.checkpoint for q in queries]),
            ("sink", [q.path or q.table for q in queries]),
            ("topic", [t for q in queries for t in q.topics]),
        ):
            seen = {v for v in values if values.count(v) > 1}
            if seen:
                raise ValueError(
                    f"Two routes share the {what} {sorted(seen)[0]!r}: each query needs its own "
                    "topics, sink and checkpoint (one sink per source table)."
                )
        return self

    def to_json(self) -> dict[str, Any]:
        """Return the spec as JSON (a job spec's ``params``), without the command line's secrets file."""
        return {k: v for k, v in asdict(self).items() if k != "secrets_file" and (k != "routes" or v)}

    @classmethod
    def from_json(cls, params: dict[str, Any]) -> StreamSpec:
        """Return the spec of :meth:`to_json`'s output; refuse unknown settings."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"Unknown stream settings {unknown}.")
        routes = tuple(Route.from_json(r) for r in params.get("routes", ()))
        return cls(**{**params, "topics": tuple(params["topics"]), "routes": routes})


def split_topics(topics: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Return the topic names of a list or a comma-separated string (blanks dropped)."""
    items = [topics] if isinstance(topics, str) else list(topics)
    return tuple(t.strip() for item in items for t in item.split(",") if t.strip())
