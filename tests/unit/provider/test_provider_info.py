"""get_provider_info() is registered, valid against Airflow's schema, and names importable modules."""

from __future__ import annotations

import importlib
import json
from importlib.metadata import entry_points
from pathlib import Path

import airflow
import jsonschema

from exactly_once_provider.provider_info import get_provider_info


def test_entry_point_returns_provider_info():
    (entry,) = [ep for ep in entry_points(group="apache_airflow_provider") if ep.value.startswith("exactly_once")]
    assert entry.load() is get_provider_info


def test_provider_info_validates_against_airflow_schema():
    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)


def test_listed_modules_import_and_hooks_declare_connection_attributes():
    info = get_provider_info()
    for section in ("hooks", "operators"):
        for entry in info[section]:
            for module_name in entry["python-modules"]:
                module = importlib.import_module(module_name)
                if section == "hooks":
                    hooks = [
                        v
                        for v in vars(module).values()
                        if isinstance(v, type) and hasattr(v, "conn_type") and v.__module__ == module_name
                    ]
                    assert hooks, f"{module_name} defines no hook"
                    for hook in hooks:
                        # Standard connection types, so users' existing connections work.
                        assert hook.conn_type in {"kafka", "mysql", "spark", "postgres"}
                        assert hook.conn_name_attr and hook.default_conn_name and hook.hook_name


def test_provider_reuses_standard_connection_types_instead_of_declaring_its_own():
    assert not get_provider_info().get("connection-types")
