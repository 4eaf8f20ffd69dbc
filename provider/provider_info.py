"""Provider metadata returned through the ``apache_airflow_provider`` entry point.

Every hook, operator, sensor, trigger, extra link and the UI plugin is listed (tests/unit/provider/
test_provider_info_complete.py walks the package and fails on a class that is not).

Connection types are not declared on purpose: the hooks reuse the standard ``kafka``, ``mysql``, ``spark``
and ``postgres`` types (owned by their providers), so users' existing connections work. Declaring them here
(``connection-types`` or the older ``hook-class-names``) would make this provider compete with those
providers for the same type.

The plugin is listed here and registered through the ``airflow.plugins`` entry point (setup.cfg), as the
official Kafka provider does with its ``kafka_event_producer`` plugin: with the default
``[core] lazy_discover_providers = True`` Airflow loads plugins from entry points only; with ``False`` it also
reads this list and skips the second registration (it then notes "already registered" for both providers).
"""

from __future__ import annotations

from exactly_once_provider.version import __version__

INTEGRATION = "Exactly-once pipelines"
PACKAGE = "exactly_once_provider"


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
                    f"{PACKAGE}.hooks.kafka_client",
                    f"{PACKAGE}.hooks.kafka_producer",
                    f"{PACKAGE}.hooks.mysql_binlog",
                    f"{PACKAGE}.hooks.mysql_source",
                    f"{PACKAGE}.hooks.spark_submit",
                ],
            }
        ],
        "operators": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    f"{PACKAGE}.operators.backpressure",
                    f"{PACKAGE}.operators.binlog_capture",
                    f"{PACKAGE}.operators.dead_letter_repair",
                    f"{PACKAGE}.operators.full_load",
                    f"{PACKAGE}.operators.kafka_produce",
                    f"{PACKAGE}.operators.reconcile",
                    f"{PACKAGE}.operators.settlement_report",
                    f"{PACKAGE}.operators.spark_stream",
                    f"{PACKAGE}.operators.spark_submit",
                    f"{PACKAGE}.operators.watermark_extract",
                ],
            }
        ],
        # ConsumerLagSensor lives next to the retention guard it is used with (both are backpressure).
        "sensors": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [f"{PACKAGE}.operators.backpressure"],
            }
        ],
        "triggers": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    f"{PACKAGE}.triggers.consumer_lag",
                    f"{PACKAGE}.triggers.sink_commits",
                    f"{PACKAGE}.triggers.dead_letters",
                ],
            }
        ],
        "extra-links": [
            f"{PACKAGE}.plugins.links.PipelineStatusLink",
            f"{PACKAGE}.plugins.links.SparkUILink",
        ],
        "plugins": [
            {
                "name": "exactly_once",
                "plugin-class": f"{PACKAGE}.plugins.plugin.ExactlyOncePlugin",
            }
        ],
    }
