"""Errors that tell the user what to change.

Bad input raises ``ValueError`` (or a subclass below); runtime failures raise ``AirflowException``.
Each message names the setting, object or privilege to fix.
"""

from __future__ import annotations


class SourceConfigurationError(ValueError):
    """Raise when the source database is configured in a way that breaks the exactly-once contract."""


class ServiceAccessError(ValueError):
    """Raise when a server refuses the settings of an Airflow connection (login, TLS trust, rights, protocol).

    A ``ValueError``: the fix is in the connection (or the server's grants), not a retry. The message names the
    connection and what to change, never a secret.
    """
