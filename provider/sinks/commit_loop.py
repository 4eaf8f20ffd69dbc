"""Where a batch is committed and retried: THE commit loop of every sink commit that can lose a race.

The Delta own append (:func:`~exactly_once_provider.sinks.delta_commit.append_with_files`), the Delta current
table's own MERGE (:func:`~exactly_once_provider.sinks.delta_merge.merge_newer`) and the Iceberg keyed modes
(:meth:`~exactly_once_provider.sinks.iceberg.IcebergSink._commit_changes`) each commit a batch on the exact
snapshot they planned it on (no library rebases it: delta-rs with ``max_commit_retries=0``, pyiceberg with
``commit.retry.num-retries=0``). When another writer commits first, the table is read again and everything is
decided again on the newer state, by :func:`commit_batch`:

1. the fence (the caller's ``committed``): the batch's ``(app id, version)`` already in the state is a replay (or a
   zombie that committed it first): nothing is written; a state the batch was not planned on (a newer version of
   the pipeline, another driver's commit) is refused with the caller's error, nothing written;
2. the plan and its conditional commit (the caller's ``plan_and_commit``): the files chosen and written on that
   state, committed only as its direct successor;
3. a lost race: the loser's files are gone (the caller deletes them), the table is read again, back to 1;
4. after ``attempts`` plans lost in a row: :class:`LostRacesError`, nothing of the batch committed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from exactly_once_provider.errors import PipelineError

log = logging.getLogger(__name__)

# Plans of one batch when other writers keep committing first: a keyed batch's plan rewrites files (a Spark job
# each), so a table that keeps moving fails the batch after a few rather than spinning.
ATTEMPTS = 3

State = TypeVar("State")
Result = TypeVar("Result")


class LostRacesError(PipelineError):
    """Raise when other writers committed first on every plan of a batch; nothing of it was committed."""


def commit_batch(
    table: str,
    app_id: str,
    version: int,
    state: State,
    committed: Callable[[State], Result | None],
    plan_and_commit: Callable[[State], Result | None],
    read_again: Callable[[State], State],
    attempts: int = ATTEMPTS,
) -> tuple[Result, bool]:
    """Commit batch ``(app_id, version)`` to ``table`` on the state it is planned on; plan it again after a lost race.

    :param table: the table's name or location, for the log and the error.
    :param app_id: the writer's stable id (``<pipeline>:<checkpoint id>``).
    :param version: the batch's version for that id (the batch id).
    :param state: the table's state read for the first plan.
    :param committed: the fence on a state: the result of the commit that already holds the batch (a replay:
        nothing is written), or None; it raises (nothing written) for a state the batch must not commit on.
    :param plan_and_commit: plan the batch on a state and commit it as that state's direct successor; return the
        result, or None when another writer committed first (having removed whatever it wrote).
    :param read_again: read the table again after ``state`` lost its race (the newer state).
    :param attempts: plans before giving up.
    :return: ``(result, written)``: ``written`` is False for a replay.
    :raises LostRacesError: every plan lost its race.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}.")
    for attempt in range(1, attempts + 1):
        if attempt > 1:
            state = read_again(state)
        done = committed(state)
        if done is not None:
            return done, False
        result = plan_and_commit(state)
        if result is not None:
            return result, True
        if attempt < attempts:
            log.info(
                "Another writer committed to %s first: (%s, %d) planned again on the newer state (attempt %d of %d).",
                table,
                app_id,
                version,
                attempt + 1,
                attempts,
            )
    raise LostRacesError(
        f"Other writers committed to {table} first {attempts} times in a row while ({app_id}, {version}) was "
        "committed; nothing of it was committed: stop the other writers (maintenance jobs, a second driver of the "
        "pipeline) and restart the stream."
    )
