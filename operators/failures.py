"""Fail a task with an ``AirflowException`` for a runtime failure of the code that also runs without Airflow.

The Spark drivers, the capture loop and the code they share (sinks, Kafka writer, source reader...) import no
Airflow, so they raise :class:`~exactly_once_provider.errors.PipelineError`; an operator calling that code in its
task fails with an ``AirflowException`` carrying the same message, chained to the original (its traceback names
it). This is that translation, in one place: every operator entry point (``execute``, ``execute_complete``,
``poke``) is decorated with :func:`fail_task_on_pipeline_error` (``tests/unit/operators/test_failures.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from airflow.sdk.exceptions import AirflowException

from exactly_once_provider.errors import PipelineError


@contextmanager
def fail_task_on_pipeline_error() -> Iterator[None]:
    """Re-raise a :class:`~exactly_once_provider.errors.PipelineError` of the block as an ``AirflowException``.

    The message is the same, the original is its ``__cause__``; any other exception passes unchanged (a
    ``ValueError`` stays a bad input). Use it as a context manager or, called, as a decorator.
    """
    try:
        yield
    except PipelineError as err:
        raise AirflowException(str(err)) from err
