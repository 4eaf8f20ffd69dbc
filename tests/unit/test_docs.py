"""The docs stay true to the code: included examples equal the tested DAGs, links stay inside the repository."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _include_module():
    spec = importlib.util.spec_from_file_location("docs_include", REPO / "docs" / "include.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


INCLUDE = _include_module()


def test_included_examples_equal_the_marked_regions_of_their_sources():
    assert INCLUDE.drifted() == [], "an example in the docs drifted from its DAG: run `make docs`"


def test_every_marked_region_is_included_somewhere():
    included = set()
    for page in INCLUDE.pages():
        included |= {(m["path"], m["name"]) for m in INCLUDE.INCLUDE.finditer(page.read_text())}
    assert included, "no page includes an example"
    marked = set()
    for folder in ("dags", "provider", "operators", "hooks", "plugins"):
        for source in (REPO / folder).rglob("*.py"):
            for name in re.findall(r"^\s*# \[START ([\w.-]+)\]\s*$", source.read_text(), re.MULTILINE):
                marked.add((str(source.relative_to(REPO)), name))
    assert marked - included == set(), "marked regions no page includes"


def test_a_drifted_example_is_detected(tmp_path, monkeypatch):
    page = INCLUDE.pages()[0]
    for page in INCLUDE.pages():
        if INCLUDE.INCLUDE.search(page.read_text()):
            break
    text = page.read_text()
    stale = INCLUDE.INCLUDE.sub(lambda m: f"{m['head']}```python\nold_example()\n```\n{m['tail']}", text, count=1)
    copy = tmp_path / "page.md"
    copy.write_text(stale)
    monkeypatch.setattr(INCLUDE, "pages", lambda: [copy])
    assert INCLUDE.drifted() == [copy]
    assert INCLUDE.render(stale) == text


def _markdown_files() -> list[Path]:
    return [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").rglob("*.md"))]


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        for heading in re.findall(r"^#+ (.+)$", text, re.MULTILINE)
    }


def test_every_relative_link_points_at_a_file_and_heading_inside_the_repository():
    broken = []
    for page in _markdown_files():
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+://|mailto:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            if not path.is_relative_to(REPO) or not path.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert broken == []


def test_every_file_path_the_docs_name_exists():
    """A module that moves must take its docs along: every `folder/.../file.py` a page names exists."""
    folders = ("provider", "hooks", "operators", "plugins", "dags", "tests", "docker", "benchmarks", "docs")
    missing = []
    for page in _markdown_files():
        for path in re.findall(r"`((?:%s)/[\w./-]+\.(?:py|sh|yaml|xml|md))`" % "|".join(folders), page.read_text()):
            if not (REPO / path).exists():
                missing.append(f"{page.relative_to(REPO)}: {path}")
    assert missing == []


def test_no_reference_to_notes_outside_the_repository():
    """Code and docs cite docs/design.md and docs/pitfalls.md, never notes that live outside the repository."""
    folders = ("provider", "hooks", "operators", "plugins", "dags", "docker", "tests", "docs", "benchmarks")
    files = [REPO / name for name in ("README.md", "CONTRIBUTING.md", "Makefile", "setup.cfg", "pyproject.toml")]
    files += [
        path
        for folder in folders
        for path in (REPO / folder).rglob("*")
        if path.suffix in (".py", ".md", ".sh", ".cfg", ".toml", ".yaml", ".xml")
    ]
    cited = []
    for path in files:
        if path == Path(__file__).resolve() or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        for pattern in (r"\.\./shared/", r"/work/shared", r"NOTES §", r"DESIGN\.md"):
            if re.search(pattern, text):
                cited.append(f"{path.relative_to(REPO)}: {pattern}")
    assert cited == []


def test_the_readme_is_a_users_page():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert "make demo" in readme and "make test" in readme


def test_every_place_in_the_guarantee_table_exists():
    """CONTRIBUTING.md names one file and function per guarantee; a refactor that moves one must update it."""
    text = (REPO / "CONTRIBUTING.md").read_text()
    table = text[text.index("## Where each guarantee lives") :]
    sources = {
        path: path.read_text()
        for folder in ("provider", "hooks", "operators", "plugins")
        for path in (REPO / folder).rglob("*.py")
    }
    missing, rows = [], 0
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("guarantee", "---"):
            continue
        rows += 1
        for name in re.findall(r"`([\w./]+)`", cells[1] + " " + cells[2]):
            if name.endswith(".py"):
                if "/" in name and not (REPO / name).exists():
                    missing.append(name)
                continue
            owner, _, member = name.rpartition(".")
            defined = [
                source
                for source in sources.values()
                if re.search(rf"^\s*(?:def|class) {re.escape(member)}\b", source, re.MULTILINE)
                and (not owner or re.search(rf"^class {re.escape(owner)}\b", source, re.MULTILINE))
            ]
            if not defined:
                missing.append(name)
    assert rows >= 15, "the guarantee table was not found"
    assert missing == []
