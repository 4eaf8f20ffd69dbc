"""``pip install .`` and ``pip install -e .`` both produce ONE import package, exactly_once_provider.

tests/integration/test_wheel.py builds the wheel, installs it with its dependencies in a clean venv and
builds the DAG templates from it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.packaging_support import clean_copy, shipped_modules

REPO = Path(__file__).resolve().parents[2]
UV = str(Path(sys.executable).parent / "uv")
SUBPACKAGES = ("hooks", "operators", "plugins")

pytestmark = pytest.mark.slow


def _run(*cmd: str, **kwargs) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_regular_install_maps_the_card_folders_into_one_package(tmp_path):
    target = tmp_path / "site"
    source = clean_copy(tmp_path / "clone")
    _run(UV, "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(source))

    expected = shipped_modules()  # every module of every mapped folder (hooks, operators, plugins, templates...)
    assert "exactly_once_provider/templates/settlement.py" in expected
    installed = {path.relative_to(target).as_posix() for path in (target / "exactly_once_provider").rglob("*.py")}
    assert installed == set(expected)
    for stray in ("hooks", "operators", "plugins", "provider", "dags", "tests", "docker"):
        assert not (target / stray).exists(), f"{stray}/ must not be installed as a top-level module"

    # -S: no site-packages, so nothing but the target can answer the import.
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import exactly_once_provider, importlib.metadata as md\n"
        "assert exactly_once_provider.__file__.startswith(sys.argv[1]), exactly_once_provider.__file__\n"
        "(ep,) = [e for e in md.entry_points(group='apache_airflow_provider') if e.value.startswith('exactly_once')]\n"
        "print(ep.load()()['package-name'])\n"
    )
    assert _run(sys.executable, "-S", "-c", probe, str(target)).strip() == "airflow-provider-exactly-once"


def test_editable_install_imports_from_the_checkout(tmp_path):
    venv = tmp_path / "venv"
    _run(UV, "venv", "--quiet", "-p", sys.executable, str(venv))
    python = str(venv / "bin" / "python")
    _run(UV, "pip", "install", "--quiet", "--no-deps", "-p", python, "-e", str(REPO))
    probe = (
        "import exactly_once_provider as p, exactly_once_provider.hooks as h,"
        " exactly_once_provider.operators as o, exactly_once_provider.plugins as g\n"
        "print(p.__file__); print(h.__file__); print(o.__file__); print(g.__file__)\n"
    )
    files = _run(python, "-c", probe, cwd=tmp_path).split()
    assert files == [str(REPO / folder / "__init__.py") for folder in ("provider", *SUBPACKAGES)]
