"""Errors that tell the user what to change.

Bad input raises ``ValueError`` (or a subclass below); runtime failures raise ``AirflowException``.
Each message names the setting, object or privilege to fix.
"""

from __future__ import annotations


class SourceConfigurationError(ValueError):
    """Raise when the source database is configured in a way that breaks the exactly-once contract."""
