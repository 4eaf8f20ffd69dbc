"""Provider metadata returned through the ``apache_airflow_provider`` entry point.

Connection types are not declared here on purpose: the hooks reuse the standard ``kafka``, ``mysql``,
``spark`` and ``postgres`` types (owned by their providers), so users' existing connections work.
"""

from __future__ import annotations

from exactly_once_provider.version import __version__

INTEGRATION = "Exactly-once pipelines"


def get_provider_info() -> dict:
    """Return the provider's metadata for Airflow's providers manager."""
    return {
        "package-name": "airflow-provider-exactly-once",
        "name": "Exactly-once pipelines (MySQL/MariaDB -> Kafka -> Spark)",
        "description": (
            "Hooks, operators and DAG templates that move MySQL/MariaDB data through Kafka and Spark "
            "into analytics sinks exactly once: nothing lost, nothing duplicated."
        ),
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "tags": ["service"],
            }
        ],
        "hooks": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    "exactly_once_provider.hooks.mysql_source",
                    "exactly_once_provider.hooks.kafka_producer",
                    "exactly_once_provider.hooks.mysql_binlog",
                ],
            }
        ],
        "operators": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    "exactly_once_provider.operators.kafka_produce",
                    "exactly_once_provider.operators.full_load",
                    "exactly_once_provider.operators.watermark_extract",
                    "exactly_once_provider.operators.spark_stream",
                    "exactly_once_provider.operators.reconcile",
                    "exactly_once_provider.operators.backpressure",
                    "exactly_once_provider.operators.binlog_capture",
                ],
            }
        ],
        # The UI plugin itself registers through the ``airflow.plugins`` entry point (setup.cfg) only.
        "extra-links": [
            "exactly_once_provider.plugins.links.PipelineStatusLink",
            "exactly_once_provider.plugins.links.SparkUILink",
        ],
        "triggers": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["exactly_once_provider.triggers.consumer_lag"],
            }
        ],
    }
