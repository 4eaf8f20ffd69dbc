"""Assets that announce each sink commit (DAGs scheduled on data arrival) and each new dead letter (alerts).

A DAG that should run when a pipeline's table changed schedules on the Asset this returns::

    from exactly_once_provider.assets import sink_commits

    with DAG(dag_id="refresh_orders_mart", schedule=[sink_commits("delta", "s3://lake/orders", "shop-orders-apply")]):
        ...

The Asset carries an :class:`~airflow.sdk.AssetWatcher` whose trigger
(:class:`~exactly_once_provider.triggers.sink_commits.SinkCommitTrigger`) reads the sink's commit marker in the
triggerer and emits an Asset event per new commit, the batch's figures in the event's ``extra["payload"]`` (Airflow
puts a watcher's event there, next to ``"from_trigger": True``); the DAG reads them from
``triggering_asset_events``. Give ``name`` (and for a Delta or files sink leave ``uri`` to this
function) to share the Asset a template declares as its task's outlet: the templates name theirs
``<dag_id>.table`` (one table) or ``<dag_id>.<table>`` (several).

A DAG that should alert when a pipeline dead-letters records (``on_bad_record="dead_letter"``) schedules on
:func:`dead_letters`: an event per poll that found new open letters, their records and errors in the payload.
"""

from __future__ import annotations

from airflow.sdk import Asset, AssetWatcher

from exactly_once_provider import lineage
from exactly_once_provider.triggers.dead_letters import DeadLetterTrigger
from exactly_once_provider.triggers.sink_commits import SinkCommitTrigger

SINKS = ("delta", "postgres", "files", "iceberg")


def _check(helper: str, location: str, pipeline: str, poll_interval: float) -> None:
    """Raise ValueError for what every watched Asset needs: a location, a pipeline, a positive poll interval."""
    if not location or not pipeline:
        raise ValueError(f"{helper} needs the sink's location and the pipeline's name.")
    if poll_interval <= 0:
        raise ValueError(f"poll_interval={poll_interval!r}: use a positive number of seconds.")


def sink_commits(
    sink: str,
    location: str,
    pipeline: str,
    *,
    name: str | None = None,
    postgres_conn_id: str | None = None,
    aws_conn_id: str | None = None,
    poll_interval: float = 10.0,
    kafka_config_id: str | None = None,
) -> Asset:
    """
    Return the Asset of a pipeline's sink, with a watcher that emits an event per commit.

    :param sink: ``delta``, ``postgres``, ``files`` or ``iceberg``.
    :param location: the Delta table or files directory (absolute path or ``s3://``), the PostgreSQL table, or the
        Iceberg table (``namespace.table`` in the SQL catalog ``eo`` of ``postgres_conn_id``).
    :param pipeline: the Kafka -> sink pipeline's name (the ``pipeline`` of its operator).
    :param name: the Asset's name; default the location's URI (``<pipeline>.<table>`` for PostgreSQL).
    :param postgres_conn_id: ``postgres`` sink: its connection; ``iceberg``: the catalog's database (default
        ``postgres_default``).
    :param aws_conn_id: a Delta or files sink on ``s3://``: its ``aws`` connection (default ``aws_default``); an
        Iceberg table on ``s3://``: name it (the location is the catalog's, not known here).
    :param poll_interval: seconds between two reads of the sink's commit marker.
    :param kafka_config_id: the pipeline's ``kafka`` connection: each event then also holds the binlog position
        and commit time of the newest change applied and the sink's freshness (read from the change records).
    """
    if sink not in SINKS:
        raise ValueError(f"sink={sink!r}: use one of {', '.join(SINKS)}.")
    _check("sink_commits", location, pipeline, poll_interval)
    trigger = SinkCommitTrigger(
        sink=sink,
        sink_location=location,
        sink_pipeline=pipeline,
        postgres_conn_id=postgres_conn_id,
        aws_conn_id=aws_conn_id,
        poll_interval=poll_interval,
        kafka_config_id=kafka_config_id,
    )
    watcher = AssetWatcher(name=f"{pipeline}-commits", trigger=trigger)
    if sink in ("postgres", "iceberg"):  # a table has no URI of its own here; the name identifies it
        return Asset(name=name or f"{pipeline}.{location}", watchers=[watcher])
    uri = lineage.storage_path(location).asset_uri
    return Asset(name=name or uri, uri=uri, watchers=[watcher])


def dead_letters(
    sink: str,
    location: str,
    pipeline: str,
    *,
    store: str | None = None,
    name: str | None = None,
    postgres_conn_id: str | None = None,
    aws_conn_id: str | None = None,
    poll_interval: float = 30.0,
) -> Asset:
    """
    Return the Asset of a pipeline's dead letters, with a watcher that emits an event when new ones are stored.

    :param sink: ``postgres`` or ``delta`` (a files sink lists its letters in its manifest: not watched here).
    :param location: the sink's PostgreSQL table or Delta table location (absolute path or ``s3://``).
    :param pipeline: the Kafka -> sink pipeline's name (the ``pipeline`` of its operator).
    :param store: the operator's ``dead_letter_store``; default the sink's default store.
    :param name: the Asset's name; default ``<pipeline>.dead_letters``.
    :param postgres_conn_id: ``postgres`` sink: its connection (default ``postgres_default``).
    :param aws_conn_id: a Delta sink on ``s3://``: its ``aws`` connection (default ``aws_default``).
    :param poll_interval: seconds between two reads of the store.
    """
    if sink not in ("postgres", "delta"):
        raise ValueError(
            f"sink={sink!r}: dead letters are watched in a postgres or delta store; a files sink's letters are "
            "listed in its manifest (docs/dead-letters.md)."
        )
    _check("dead_letters", location, pipeline, poll_interval)
    trigger = DeadLetterTrigger(
        sink=sink,
        sink_location=location,
        sink_pipeline=pipeline,
        store=store,
        postgres_conn_id=postgres_conn_id,
        aws_conn_id=aws_conn_id,
        poll_interval=poll_interval,
    )
    return Asset(
        name=name or f"{pipeline}.dead_letters", watchers=[AssetWatcher(name=f"{pipeline}-letters", trigger=trigger)]
    )
