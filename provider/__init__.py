"""airflow-provider-exactly-once: MySQL/MariaDB -> Kafka -> Spark pipelines with exactly-once delivery.

The package is assembled from the repository's top-level folders (see setup.cfg ``package_dir``):
``provider/`` is this package, ``hooks/``, ``operators/`` and ``plugins/`` its sub-packages.
"""

from exactly_once_provider.version import __version__

__all__ = ["__version__"]
