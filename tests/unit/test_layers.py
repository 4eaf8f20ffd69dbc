"""The package's layers: imports point one way (templates -> operators -> hooks -> domain -> core).

Read from the source with ``ast`` (nothing is imported). ``if TYPE_CHECKING:`` blocks are annotations only and
do not count; a ``__main__`` module is an entry point and sits with the templates on top, but, like the capture
loop, imports neither hooks nor Airflow (:func:`test_drivers_import_neither_hooks_nor_airflow`).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import exactly_once_provider

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"provider": "", "hooks": "hooks", "operators": "operators", "plugins": "plugins"}
CORE = {"errors", "version", "positions", "faults", "connections", "kafka_config", "provider_info", "__init__"}
DOMAIN = {
    "kafka",
    "source",
    "sinks",
    "spark_jobs",
    "full_load",
    "reconcile",
    "capture",
    "storage",
    "lineage",
    "lineage_facets",
}
# Operators use the plugin's extra links and defer to the triggers; the templates compose operators.
LAYER = {
    **dict.fromkeys(CORE, 0),
    **dict.fromkeys(DOMAIN, 1),
    "hooks": 2,
    "triggers": 3,
    "plugins": 3,
    "operators": 4,
    "assets": 4,  # sink_commits: an Asset watched by a trigger, for users' DAGs
    "templates": 5,
    "entry": 5,
}


def _modules():
    for folder, sub in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("").parts
            unit = sub or rel[0]
            if path.name == "__main__.py":
                unit = "entry"
            yield path, unit


def _imports(path: Path):
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("exactly_once_provider"):
            parts = node.module.split(".")[1:]
            if parts:
                yield parts[0]
            else:  # from exactly_once_provider import x
                yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("exactly_once_provider."):
                    yield alias.name.split(".")[1]


def _edges():
    edges: dict[tuple[str, str], list[str]] = {}
    for path, unit in _modules():
        for target in _imports(path):
            if target != unit:
                edges.setdefault((unit, target), []).append(str(path.relative_to(ROOT)))
    return edges


def test_every_unit_has_a_layer():
    assert {unit for _, unit in _modules()} - set(LAYER) == set()


def test_imports_point_down_the_layers():
    upward = {
        f"{a} -> {b}": files
        for (a, b), files in _edges().items()
        if LAYER[b] > LAYER[a] or (LAYER[a] == LAYER[b] and LAYER[a] >= 2)
    }
    assert upward == {}


def test_no_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for a, b in _edges():
        graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}

    def visit(node, trail):
        state[node] = 1
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                raise AssertionError(" -> ".join([*trail, node, nxt]))
            if nxt not in state:
                visit(nxt, [*trail, node])
        state[node] = 2

    for node in list(graph):
        if node not in state:
            visit(node, [])


def test_hooks_folder_holds_hooks_only():
    import importlib

    from airflow.sdk import BaseHook

    for path in sorted((ROOT / "hooks").glob("*.py")):
        if path.name == "__init__.py":
            continue
        module = importlib.import_module(f"exactly_once_provider.hooks.{path.stem}")
        defined = [obj for obj in vars(module).values() if isinstance(obj, type) and obj.__module__ == module.__name__]
        assert defined and all(
            issubclass(obj, BaseHook)
            or not obj.__name__[0].isupper()
            or obj.__module__ != module.__name__
            or obj.__name__ in _RESULT_TYPES
            for obj in defined
        ), path.name


# Small result records a hook returns (its public API), not domain logic.
_RESULT_TYPES = {"ServerInfo", "Snapshot", "Preflight"}


# What runs away from Airflow's connections: every ``__main__`` module (a Spark driver, or a command run on its
# own), and the capture loop (the operator hands it the source). A driver gets its connections' settings from
# the job's 0600 secrets file, resolved by the operator through its hooks (source.server.source_secrets).
DRIVERS = sorted({*(ROOT / "provider").rglob("__main__.py"), ROOT / "provider" / "capture" / "loop.py"})


def _all_imports(path: Path):
    """Every module ``path`` imports, ``if TYPE_CHECKING:`` blocks and function bodies included."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def test_drivers_import_neither_hooks_nor_airflow():
    assert len(DRIVERS) >= 3  # full_load, reconcile, the capture loop
    found = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in DRIVERS
        for name in _all_imports(path)
        if name.split(".")[0] == "airflow" or name.startswith("exactly_once_provider.hooks")
    }
    assert found == set()


# Imported in a fresh interpreter where every import statement is watched: what a driver imports through the
# modules it imports counts too (a domain module raising AirflowException would pull Airflow into a Spark driver).
# builtins.__import__, not a meta-path finder: a finder is asked once per module, so the second importer of an
# already loaded Airflow module would go unseen.
_WATCHED_IMPORTS = """
import builtins, importlib, importlib.util, sys, traceback

roots, allowed = sys.argv[1].split(","), set(filter(None, sys.argv[2].split(",")))
real_import = builtins.__import__


def watched(name, globals=None, locals=None, fromlist=(), level=0):
    importer, source = (globals or {}).get("__name__", "?"), str((globals or {}).get("__file__") or "")
    full = importlib.util.resolve_name("." * level + name, (globals or {}).get("__package__")) if level else name
    ours = source.startswith(tuple(roots)) and importer not in allowed  # Airflow's own imports are its business
    for target in (full, *(f"{full}.{item}" for item in fromlist or ())):
        if ours and (target.split(".")[0] == "airflow" or target.startswith("exactly_once_provider.hooks")):
            raise ImportError(f"{importer} imports {target}")
    return real_import(name, globals, locals, fromlist, level)


builtins.__import__ = watched
failed = {}
for module in sys.argv[3:]:
    try:
        importlib.import_module(module)
    except ImportError as err:
        failed[module] = str(err)
print(failed)
sys.exit(1 if failed else 0)
"""
# Modules still importing Airflow under a driver, each with the change that removes it. Remove an entry once done.
_NOT_YET_FREE_OF_AIRFLOW: set[str] = set()


def _driver_module(path: Path) -> str:
    return ".".join(("exactly_once_provider", *path.relative_to(ROOT / "provider").with_suffix("").parts))


def _import_watched(modules: list[str], allowed: set[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    # The package's own files (the .venv sits in the checkout too: Airflow's imports are not watched).
    roots = [f"{cwd}/"] if cwd else [f"{ROOT / folder}/" for folder in FOLDERS]
    return subprocess.run(
        [sys.executable, "-c", _WATCHED_IMPORTS, ",".join(roots), ",".join(sorted(allowed)), *modules],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


# What a driver imports only when it runs (a sink opened by name, a job's step, the capture loop's resume
# decision), and the ledger migration, a command run on its own: checked like the drivers.
DRIVER_SIDE = sorted(
    [
        *(
            p
            for folder in ("sinks", "spark_jobs")
            for p in (ROOT / "provider" / folder).glob("*.py")
            if p.name != "__main__.py"
        ),
        ROOT / "provider" / "capture" / "resume.py",
        ROOT / "provider" / "kafka" / "ledger_migration.py",
    ]
)


def test_drivers_import_neither_hooks_nor_airflow_even_indirectly():
    modules = [_driver_module(path) for path in (*DRIVERS, *DRIVER_SIDE)]
    result = _import_watched(modules, _NOT_YET_FREE_OF_AIRFLOW)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]


def test_the_indirect_check_catches_an_import_two_modules_down(tmp_path):
    # The second importer of a module Airflow is already loaded for is caught too.
    (tmp_path / "eo_layer_driver.py").write_text("import eo_layer_first\nimport eo_layer_domain\n")
    (tmp_path / "eo_layer_first.py").write_text("import airflow.sdk.exceptions\n")
    (tmp_path / "eo_layer_domain.py").write_text("from airflow.sdk.exceptions import AirflowException\n")
    result = _import_watched(["eo_layer_driver"], {"eo_layer_first"}, cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "eo_layer_domain imports airflow.sdk.exceptions" in result.stdout, result.stdout + result.stderr


def test_the_driver_check_catches_a_hook_import(tmp_path):
    driver = tmp_path / "__main__.py"
    driver.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from exactly_once_provider import hooks\n"
        "def f():\n    import airflow.sdk\n"
    )
    assert {"exactly_once_provider.hooks", "airflow.sdk"} <= set(_all_imports(driver))


def test_package_root_is_the_provider_folder():
    assert Path(exactly_once_provider.__file__).parent == ROOT / "provider"
