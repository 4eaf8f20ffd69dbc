"""The tests against the shared stack name their pipelines, topics, tables and DAGs uniquely.

Tests run on several pytest workers against ONE Kafka, MariaDB and PostgreSQL. Two tests (or two
parametrizations of one) that give an operator, a writer or a sink the same fixed pipeline name share a
transactional id and fence each other's producer when they happen to run at once; the same fixed topic or table
mixes their rows. That made CI flaky before (a ledger-migration test whose parametrizations shared ``mig-a``).
So a fixed name given to one of those constructors may appear in one non-parametrized test only; helpers and
parametrized tests build names from a uuid or from their caller's arguments.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
NAME_KEYWORDS = {"pipeline", "topic", "offsets_topic", "transactional_id", "dag_id", "table"}
# what reaches a shared service under those names: operators, writers, sinks, DAG templates
CALLEE_SUFFIXES = ("Operator", "Writer", "Sink", "_dag")


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def fixed_names(source: str) -> list[tuple[str, bool, str, str]]:
    """(function, parametrized, keyword, name) for each string constant passed as a name to such a constructor."""
    found = []
    for func in ast.parse(source).body:
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        parametrized = any("parametrize" in ast.unparse(d) for d in func.decorator_list)
        for call in ast.walk(func):
            if not isinstance(call, ast.Call) or not _callee(call).endswith(CALLEE_SUFFIXES):
                continue
            for keyword in call.keywords:
                if keyword.arg in NAME_KEYWORDS and isinstance(keyword.value, ast.Constant):
                    found.append((func.name, parametrized, keyword.arg, str(keyword.value.value)))
    return found


def shared_names(files: dict[str, str]) -> list[str]:
    """The problems: a fixed name in a helper, in a parametrized test, or in two tests."""
    users: dict[tuple[str, str], set[str]] = defaultdict(set)
    problems = []
    for path, source in files.items():
        for function, parametrized, keyword, name in fixed_names(source):
            where = f"{path}::{function}"
            if not function.startswith("test_"):
                problems.append(f"{where}: a helper passes the fixed {keyword} {name!r} (take it from the caller)")
            elif parametrized:
                problems.append(f"{where}: its parametrizations share the fixed {keyword} {name!r}")
            else:
                users[(keyword, name)].add(where)
    problems += [
        f"the fixed {keyword} {name!r} is used by {sorted(where)}"
        for (keyword, name), where in sorted(users.items())
        if len(where) > 1
    ]
    return problems


def test_no_fixed_name_is_shared_between_tests():
    files = {
        str(path.relative_to(TESTS)): path.read_text()
        for folder in ("integration", "faults")
        for path in sorted((TESTS / folder).rglob("*.py"))
    }
    assert shared_names(files) == []


def test_the_check_finds_a_shared_name_a_helper_and_a_parametrized_test():
    one = 'def test_a():\n    WriterOperator(pipeline="p", topic=f"t-{u}")\n'
    two = 'def test_b():\n    PipelineWriter(pipeline="p")\n'
    helper = 'def _make():\n    return SomeOperator(topic="fixed")\n'
    param = '@pytest.mark.parametrize("x", [1, 2])\ndef test_c(x):\n    some_dag(dag_id="d")\n'
    other = 'def test_d():\n    SimpleNamespace(table="t")\n    SomeOperator(pipeline=name)\n'
    problems = shared_names({"a.py": one, "b.py": two, "h.py": helper, "c.py": param, "d.py": other})
    assert problems == [
        "h.py::_make: a helper passes the fixed topic 'fixed' (take it from the caller)",
        "c.py::test_c: its parametrizations share the fixed dag_id 'd'",
        "the fixed pipeline 'p' is used by ['a.py::test_a', 'b.py::test_b']",
    ]
