"""Keep the code examples in docs/ equal to the tested code they are taken from.

A page marks an included example like this (the fenced block between the two comments is generated)::

    <!-- include: dags/example_eo_kafka_produce.py howto_operator_transactional_produce -->
    ```python
    ...
    ```
    <!-- end include -->

and the source file marks the region with comment lines, as Airflow's own providers do::

    # [START howto_operator_transactional_produce]
    ...
    # [END howto_operator_transactional_produce]

The region is taken without its marker lines (and without nested markers), dedented.

``python docs/include.py`` (``make docs``) rewrites every page; ``python docs/include.py --check`` lists
the pages whose examples drifted and exits 1 (``tests/unit/test_docs.py`` runs the same check).
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = ("README.md", "CONTRIBUTING.md", "docs")

INCLUDE = re.compile(
    r"(?P<head><!-- include: (?P<path>\S+) (?P<name>[\w.-]+) -->\n)"
    r"(?P<body>.*?)"
    r"(?P<tail><!-- end include -->)",
    re.DOTALL,
)
MARKER = re.compile(r"^\s*# \[(START|END) [\w.-]+\]\s*$")


def region(path: str, name: str) -> str:
    """Return the lines between ``# [START name]`` and ``# [END name]`` in ``path`` (relative to the repo)."""
    source = ROOT / path
    if not source.is_file():
        raise ValueError(f"{path}: no such file (include of {name!r}).")
    lines = source.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == f"# [START {name}]"]
    ends = [i for i, line in enumerate(lines) if line.strip() == f"# [END {name}]"]
    if len(starts) != 1 or len(ends) != 1 or ends[0] <= starts[0]:
        raise ValueError(f"{path}: needs exactly one '# [START {name}]' followed by one '# [END {name}]'.")
    body = [line for line in lines[starts[0] + 1 : ends[0]] if not MARKER.match(line)]
    return textwrap.dedent("\n".join(body)).strip("\n") + "\n"


def render(text: str) -> str:
    """Return ``text`` with every include block regenerated from its source region."""

    def block(match: re.Match) -> str:
        code = region(match["path"], match["name"])
        return f"{match['head']}```python\n{code}```\n{match['tail']}"

    return INCLUDE.sub(block, text)


def pages() -> list[Path]:
    found: list[Path] = []
    for entry in PAGES:
        path = ROOT / entry
        found.extend(sorted(path.rglob("*.md")) if path.is_dir() else [path] if path.is_file() else [])
    return found


def drifted() -> list[Path]:
    """Pages whose included examples differ from their source regions."""
    return [page for page in pages() if render(page.read_text()) != page.read_text()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="list drifted pages and exit 1 instead of rewriting")
    args = parser.parse_args(argv)
    if args.check:
        stale = drifted()
        for page in stale:
            print(f"{page.relative_to(ROOT)}: an included example differs from its source; run `make docs`")
        return 1 if stale else 0
    for page in pages():
        text = page.read_text()
        new = render(text)
        if new != text:
            page.write_text(new)
            print(f"rewrote {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
