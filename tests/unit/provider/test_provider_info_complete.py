"""get_provider_info() lists every hook, operator, sensor, trigger, extra link and plugin the package defines.

The test walks the installed package and imports every module, so a class added anywhere (not only in the
folder where it belongs) and not listed fails here; a listed entry that no longer exists fails too.
"""

from __future__ import annotations

import configparser
import importlib
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
from airflow.plugins_manager import AirflowPlugin
from airflow.sdk import BaseHook, BaseOperator, BaseOperatorLink, BaseSensorOperator
from airflow.triggers.base import BaseTrigger

import exactly_once_provider
from exactly_once_provider.provider_info import get_provider_info

REPO = Path(__file__).resolve().parents[3]
KINDS = {  # section of provider_info -> the base class its entries derive from
    "hooks": BaseHook,
    "sensors": BaseSensorOperator,
    "operators": BaseOperator,  # sensors excluded (checked first)
    "triggers": BaseTrigger,
    "extra-links": BaseOperatorLink,
    "plugins": AirflowPlugin,
}


def _modules() -> list[str]:
    """Every module of every package setup.cfg ships (hooks/, operators/, plugins/ are mapped folders, so an
    editable install's ``exactly_once_provider.__path__`` alone does not reach them)."""
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    packages = setup["options"]["packages"].split()
    assert exactly_once_provider.__name__ in packages
    names = set(packages)
    for package in packages:
        for info in pkgutil.iter_modules(importlib.import_module(package).__path__, f"{package}."):
            if not info.name.endswith(".__main__"):  # a job's command line, not a library module
                names.add(info.name)
    return sorted(names)


def _kind(cls: type) -> str | None:
    for section, base in KINDS.items():
        if issubclass(cls, base) and cls is not base:
            return section
    return None


def _defined_classes() -> dict[str, set[str]]:
    """Section -> ``module.Class`` of every class of that kind defined in the package."""
    found: dict[str, set[str]] = {section: set() for section in KINDS}
    for name in _modules():
        module = importlib.import_module(name)
        for value in vars(module).values():
            if isinstance(value, type) and value.__module__ == name and (kind := _kind(value)):
                found[kind].add(f"{name}.{value.__qualname__}")
    return found


def _listed(section: str) -> list[str]:
    """What provider_info lists in ``section``: module names (hooks, operators, ...) or class paths."""
    entries = get_provider_info().get(section, [])
    if section == "extra-links":
        return list(entries)
    if section == "plugins":
        return [entry["plugin-class"] for entry in entries]
    return [module for entry in entries for module in entry["python-modules"]]


DEFINED = _defined_classes()


def test_the_walk_finds_the_known_classes():
    # Guards the test itself: a walk that found nothing would pass everything below.
    assert "exactly_once_provider.hooks.kafka_producer.TransactionalProducerHook" in DEFINED["hooks"]
    assert "exactly_once_provider.operators.backpressure.ConsumerLagSensor" in DEFINED["sensors"]
    assert "exactly_once_provider.operators.spark_stream.SparkKafkaToSinkOperator" in DEFINED["operators"]
    assert "exactly_once_provider.triggers.consumer_lag.ConsumerLagTrigger" in DEFINED["triggers"]
    assert "exactly_once_provider.plugins.links.PipelineStatusLink" in DEFINED["extra-links"]
    assert DEFINED["plugins"] == {"exactly_once_provider.plugins.plugin.ExactlyOncePlugin"}


@pytest.mark.parametrize("section", ["hooks", "operators", "sensors", "triggers"])
def test_every_class_module_is_listed_and_every_listed_module_defines_one(section):
    listed = _listed(section)
    assert len(listed) == len(set(listed)), f"{section}: listed twice: {listed}"
    missing = {path for path in DEFINED[section] if path.rsplit(".", 1)[0] not in listed}
    assert not missing, f"{section} not listed in provider_info: {sorted(missing)}"
    empty = {module for module in listed if not any(p.rsplit(".", 1)[0] == module for p in DEFINED[section])}
    assert not empty, f"provider_info lists {section} modules that define none: {sorted(empty)}"


@pytest.mark.parametrize("section", ["extra-links", "plugins"])
def test_every_link_and_plugin_class_is_listed_exactly(section):
    listed = _listed(section)
    assert len(listed) == len(set(listed))
    assert set(listed) == DEFINED[section]
    for path in listed:  # and each one imports as the class it names
        module, name = path.rsplit(".", 1)
        assert issubclass(getattr(importlib.import_module(module), name), KINDS[section])


def test_plugin_name_matches_the_plugin_class():
    (entry,) = get_provider_info()["plugins"]
    module, name = entry["plugin-class"].rsplit(".", 1)
    assert getattr(importlib.import_module(module), name).name == entry["name"]


def test_operators_declare_the_extra_links_listed():
    """Each listed link is offered by at least one operator (else it would be listed for nothing)."""
    offered = set()
    for path in DEFINED["operators"] | DEFINED["sensors"]:
        module, name = path.rsplit(".", 1)
        for link in getattr(importlib.import_module(module), name).operator_extra_links:
            offered.add(f"{type(link).__module__}.{type(link).__qualname__}")
    assert set(_listed("extra-links")) <= offered


def test_airflow_loads_the_plugin_once(tmp_path):
    """Listed in provider_info and registered by entry point, Airflow still loads the plugin once.

    With ``lazy_discover_providers = False`` Airflow also reads provider_info's list and skips the second
    registration, noting it as the official Kafka provider's ``kafka_event_producer`` plugin is noted.
    """
    probe = (  # one Airflow import for both settings (the loader is cached and reads the setting at import)
        "import json\n"
        "from airflow import plugins_manager, settings\n"
        "for lazy in (True, False):\n"
        "    settings.LAZY_LOAD_PROVIDERS = lazy\n"
        "    plugins_manager._get_plugins.cache_clear()\n"
        "    plugins, errors = plugins_manager._get_plugins()\n"
        "    print(json.dumps({'lazy': lazy, 'names': [p.name for p in plugins], 'errors': errors}))\n"
    )
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lazy, eager = (json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"lazy"'))
    assert lazy["lazy"] is True and eager["lazy"] is False
    for loaded in (lazy, eager):
        assert loaded["names"].count("exactly_once") == 1
    assert "exactly_once" not in lazy["errors"]
    assert eager["errors"].get("exactly_once") in (None, "Plugin 'exactly_once' already registered, skipping")
