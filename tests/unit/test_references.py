"""Every Sphinx cross-reference to ``exactly_once_provider.<...>`` in the product's docstrings names something that
exists: a function or module that moved left references to its old home behind."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = re.compile(r":(?:func|mod|class|meth|data|attr|exc):`~?(exactly_once_provider(?:\.\w+)+)`")


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attr in parts[split:]:
            if not hasattr(target, attr):
                return False
            target = getattr(target, attr)
        return True
    return False


def test_every_qualified_reference_resolves():
    stale = []
    for folder in ("provider", "hooks", "operators", "plugins"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text()
            for match in REFERENCE.finditer(text):
                if not _resolves(match.group(1)):
                    line = text.count("\n", 0, match.start()) + 1
                    stale.append(f"{path.relative_to(ROOT)}:{line} {match.group(1)}")
    assert stale == []
