"""Moved to :mod:`exactly_once_provider.storage.durable` (the storage layer); kept for the Delta commit's imports."""

from exactly_once_provider.storage.durable import fsync_dir, put_if_absent, replace  # noqa: F401
