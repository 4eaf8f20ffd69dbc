"""Errors that tell the user what to change.

Bad input raises ``ValueError`` (or a subclass below); runtime failures raise ``AirflowException``, or
:class:`PipelineError` in the modules that also run without Airflow. Each message names the setting, object or
privilege to fix.
"""

from __future__ import annotations


class SourceConfigurationError(ValueError):
    """Raise when the source database is configured in a way that breaks the exactly-once contract."""


class ServiceAccessError(ValueError):
    """Raise when a server refuses the settings of an Airflow connection (login, TLS trust, rights, protocol).

    A ``ValueError``: the fix is in the connection (or the server's grants), not a retry. The message names the
    connection and what to change, never a secret.
    """


class PipelineError(RuntimeError):
    """Raise for a runtime failure in code that also runs without Airflow: the Spark drivers and the capture loop.

    Those modules import no Airflow, not even indirectly (``tests/unit/test_layers.py``), so they cannot raise
    ``AirflowException``; an operator that calls them fails its task with an ``AirflowException`` carrying the
    same message, chained to it (:func:`~exactly_once_provider.operators.failures.fail_task_on_pipeline_error` on
    each operator's ``execute``).
    """
