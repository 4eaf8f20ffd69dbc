"""Operator: re-apply chosen dead letters to their sink and close them in the same commit (issue 41)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from exactly_once_provider.connections import postgres_connection
from exactly_once_provider.operators.failures import fail_task_on_pipeline_error
from exactly_once_provider.plugins.links import PipelineStatusLink
from exactly_once_provider.sinks import dead_letters, repair


class DeadLetterRepairOperator(BaseOperator):
    """
    Re-apply chosen open dead letters of a pipeline to its sink, exactly once: each letter applied is closed in
    the same PostgreSQL transaction (:mod:`~exactly_once_provider.sinks.repair`), so a repair that dies before
    its commit applied and closed nothing, and a rerun never applies a letter twice.

    Built for the PostgreSQL sink in append and CDC mode (docs/dead-letters.md). Choose the letters by ``error_classes``,
    ``offsets`` and/or ``keys`` (every given criterion must hold; none: every open letter), and either ``fix``
    them with a function or ``accept`` them as they are. Returns ``{"applied": [...], "left_open": [...],
    "resolution": ..., "superseded": [...]}`` with each letter as ``topic/partition@offset`` (CDC: a repaired change
    older than its key's row in the table is closed as superseded, not applied).

    :param pipeline: the stream's pipeline name (its letters, its advisory lock).
    :param sink_table: the sink table the stream appends to.
    :param sink: ``postgres`` (the only one built so far).
    :param mode: the stream's mode: ``append`` (rows of key and value) or ``cdc`` (change records by key, the
        newer version wins, as the stream writes them).
    :param key_field: ``cdc``: the stream's ``key_field`` (JSON path(s) of the key in the record).
    :param version_field: ``cdc``: the stream's ``version_field``.
    :param op_field: ``cdc``: the stream's ``op_field`` (``d`` / ``delete``: a delete).
    :param dead_letter_store: the store table; default ``<sink_table>_dead_letters``.
    :param error_classes: repair only letters of these classes (e.g. ``["invalid_utf8"]``).
    :param offsets: repair only these letters: ``"topic/partition@offset"`` strings or ``(topic, partition,
        offset)``.
    :param keys: repair only letters with these raw Kafka keys (``str``: its UTF-8 bytes).
    :param fix: ``fix(letter) -> (key text, value text)`` of the sink's row, or None to leave that letter open;
        ``letter`` is a dict of the store's columns, its key and value as ``bytes``.
    :param accept: apply the letters as they are (their bytes must be UTF-8 text without NUL); when true, ``fix``
        is not used (a trigger form chooses between them: :func:`~exactly_once_provider.templates.
        dead_letter_repair.dead_letter_repair_dag`). Templated: ``True``/``False`` or their text.
    :param postgres_conn_id: the ``postgres`` connection of the sink and its store.
    """

    template_fields: Sequence[str] = (
        "pipeline",
        "sink_table",
        "dead_letter_store",
        "error_classes",
        "offsets",
        "keys",
        "accept",
    )
    ui_color = "#f4e8e8"
    operator_extra_links = (PipelineStatusLink(),)

    def __init__(
        self,
        *,
        pipeline: str,
        sink_table: str,
        sink: str = "postgres",
        mode: str = "append",
        key_field: str = "pk",
        version_field: str = "version",
        op_field: str = "op",
        dead_letter_store: str | None = None,
        error_classes: Sequence[str] | None = None,
        offsets: Sequence[str | Sequence[Any]] | None = None,
        keys: Sequence[str | bytes] | None = None,
        fix: Callable[[dict[str, Any]], tuple[str | None, str | None] | None] | None = None,
        accept: bool = False,
        postgres_conn_id: str = "postgres_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline, self.sink_table, self.sink = pipeline, sink_table, sink
        self.mode, self.key_field, self.version_field, self.op_field = mode, key_field, version_field, op_field
        self.dead_letter_store = dead_letter_store
        self.error_classes, self.offsets, self.keys = error_classes, offsets, keys
        self.fix, self.accept = fix, accept
        self.postgres_conn_id = postgres_conn_id

    @property
    def status_pipeline(self) -> str:
        return self.pipeline

    def _selection(self) -> repair.Selection:
        offsets = []
        for given in self.offsets or ():
            if isinstance(given, str):
                topic, _, rest = given.rpartition("/")
                partition, _, offset = rest.partition("@")
                if not (topic and partition.isdigit() and offset.isdigit()):
                    raise ValueError(f"offsets: {given!r} is not 'topic/partition@offset'.")
                offsets.append((topic, int(partition), int(offset)))
            else:
                topic, partition, offset = given
                offsets.append((str(topic), int(partition), int(offset)))
        keys = tuple(k.encode() if isinstance(k, str) else bytes(k) for k in self.keys or ())
        return repair.Selection(tuple(self.error_classes or ()), tuple(offsets), keys)

    @fail_task_on_pipeline_error()
    def execute(self, context: Any) -> dict[str, Any]:
        if self.sink != "postgres":
            raise ValueError(
                f"sink={self.sink!r}: the repair is built for the postgres sink (append and cdc modes) only so far "
                "(docs/dead-letters.md)."
            )
        if self.mode not in ("append", "cdc"):
            raise ValueError(
                f"mode={self.mode!r}: the repair is built for the append and cdc modes; the current table's "
                "typed apply is not (docs/dead-letters.md)."
            )
        if not self.pipeline or not self.sink_table:
            raise ValueError("pipeline and sink_table must be non-empty.")
        accept = self.accept
        if isinstance(accept, str):
            if accept.strip().lower() not in ("true", "false"):
                raise ValueError(f"accept must be true or false, got {accept!r}.")
            accept = accept.strip().lower() == "true"
        if not accept and self.fix is None:
            raise ValueError("Give fix (a function returning each letter's text) or accept=True.")
        fix = None if accept else self.fix
        if fix is not None and not callable(fix):
            raise ValueError(f"fix must be a function, got {fix!r}.")
        selection = self._selection()
        store = self.dead_letter_store or dead_letters.default_store("postgres", self.sink_table)
        import psycopg2

        conn = postgres_connection(self.postgres_conn_id)
        try:
            cdc = repair.CdcFields(self.key_field, self.version_field, self.op_field) if self.mode == "cdc" else None
            result = repair.repair_postgres(conn, self.sink_table, store, self.pipeline, selection, fix, cdc)
        except psycopg2.Error as err:
            raise AirflowException(
                f"The repair of {self.pipeline}'s dead letters in {store} failed and was rolled back (nothing "
                f"applied, nothing closed): {type(err).__name__}: {err}"
            ) from err
        finally:
            conn.close()
        applied = [f"{t}/{p}@{o}" for t, p, o in result.applied]
        left = [f"{t}/{p}@{o}" for t, p, o in result.left_open]
        superseded = [f"{t}/{p}@{o}" for t, p, o in result.superseded]
        self.log.info(
            "%d dead letter(s) of %s %s into %s and closed in the same transaction: %s; %d left open by the fix: %s",
            len(applied),
            self.pipeline,
            result.resolution,
            self.sink_table,
            ", ".join(applied[:50]) or "none",
            len(left),
            ", ".join(left[:50]) or "none",
        )
        if superseded:
            self.log.info(
                "%d closed as superseded (older than their key's row: not applied): %s",
                len(superseded),
                ", ".join(superseded[:50]),
            )
        return {"applied": applied, "left_open": left, "resolution": result.resolution, "superseded": superseded}
