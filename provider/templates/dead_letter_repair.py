"""Template: repair a pipeline's dead letters from the trigger form, exactly once.

``choose`` (the form's choice, checked) -> ``repair`` (:class:`~exactly_once_provider.operators.dead_letter_repair.
DeadLetterRepairOperator`: the chosen open letters applied to the sink and closed in ONE PostgreSQL transaction).

An operator triggers the DAG from the UI and picks the letters in the form (error classes, offsets, Kafka keys, or
every open letter: a run without any choice is refused, so a click does not repair more than meant) and how: by
the DAG's ``fix`` function, or accepted as they are. A run killed or marked failed applied nothing and closed
nothing; a cleared or repeated run finds the letters it applied closed and does nothing more.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, Param, task

from exactly_once_provider.operators.dead_letter_repair import DeadLetterRepairOperator


def dead_letter_repair_dag(
    *,
    dag_id: str,
    pipeline: str,
    sink_table: str,
    mode: str = "append",
    fix: Callable[[dict[str, Any]], tuple[str | None, str | None] | None] | None = None,
    key_field: str = "pk",
    version_field: str = "version",
    op_field: str = "op",
    dead_letter_store: str | None = None,
    postgres_conn_id: str = "postgres_default",
    start_date: datetime | None = None,
    tags: Sequence[str] = (),
) -> DAG:
    """
    Return a DAG, run from its trigger form, that repairs chosen dead letters of ``pipeline``.

    :param dag_id: the DAG id.
    :param pipeline: the stream's pipeline name (its ``on_bad_record="dead_letter"`` letters).
    :param sink_table: the PostgreSQL sink table the stream writes.
    :param mode: the stream's mode: ``append`` or ``cdc``.
    :param fix: ``fix(letter) -> (key text, value text)`` (None leaves a letter open): what the form's
        ``how="fix"`` applies; without it the form offers ``accept`` only.
    :param key_field: ``cdc``: the stream's ``key_field``.
    :param version_field: ``cdc``: the stream's ``version_field``.
    :param op_field: ``cdc``: the stream's ``op_field``.
    :param dead_letter_store: the stream's ``dead_letter_store``; default ``<sink_table>_dead_letters``.
    :param postgres_conn_id: the ``postgres`` connection of the sink and its store.
    :param start_date: the DAG's start date (it has no schedule; default: now).
    :param tags: extra DAG tags.
    """
    if mode not in ("append", "cdc"):
        raise ValueError(f"mode={mode!r}: the repair is built for the append and cdc modes.")
    if fix is not None and not callable(fix):
        raise ValueError(f"fix must be a function, got {fix!r}.")
    ways = ["fix", "accept"] if fix is not None else ["accept"]
    with DAG(
        dag_id=dag_id,
        schedule=None,  # run from the trigger form only
        start_date=start_date,
        catchup=False,
        max_active_runs=1,  # one repair at a time (the pipeline's advisory lock would serialise them anyway)
        render_template_as_native_obj=True,  # the form's lists reach the operator as lists
        tags=["exactly-once", "dead-letters", *tags],
        params={
            "error_classes": Param([], type="array", items={"type": "string"}, description="e.g. invalid_utf8"),
            "offsets": Param([], type="array", items={"type": "string"}, description="topic/partition@offset"),
            "keys": Param([], type="array", items={"type": "string"}, description="the letters' Kafka keys"),
            "every_open_letter": Param(False, type="boolean", description="no choice above: repair every open one"),
            "how": Param(ways[0], enum=ways, description="apply the DAG's fix, or accept the letters as they are"),
        },
        doc_md=__doc__,
    ) as dag:

        @task
        def choose(params: dict | None = None) -> dict:
            """Refuse a run that chose no letters (unless every open letter is asked for); log the choice."""
            params = params or {}
            chosen = {k: list(params.get(k) or []) for k in ("error_classes", "offsets", "keys")}
            if not any(chosen.values()) and not params.get("every_open_letter"):
                raise ValueError(
                    "Choose the letters to repair (error_classes, offsets or keys), or set every_open_letter."
                )
            print(f"repairing {pipeline}'s dead letters: {chosen or 'every open letter'}, how={params.get('how')}")
            return chosen

        repair = DeadLetterRepairOperator(
            task_id="repair",
            pipeline=pipeline,
            sink_table=sink_table,
            mode=mode,
            key_field=key_field,
            version_field=version_field,
            op_field=op_field,
            dead_letter_store=dead_letter_store,
            error_classes="{{ params['error_classes'] }}",
            offsets="{{ params['offsets'] }}",
            keys="{{ params['keys'] }}",  # not params.keys: Jinja would give the dict's method
            fix=fix,
            accept="{{ params.how == 'accept' }}",
            postgres_conn_id=postgres_conn_id,
        )
        choose() >> repair
    return dag
