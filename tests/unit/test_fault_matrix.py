"""tests/faults/matrix.py: each run split like ``make test``, the parts of a run joined again for the table."""

from __future__ import annotations

import importlib
import subprocess
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def matrix():
    return importlib.import_module("tests.faults.matrix")


def junit(path: Path, *cases: tuple[str, str | None]) -> None:
    body = "".join(
        f'<testcase classname="tests.faults.test_x" name="{name}" time="2.5">'
        + (f'<failure message="{failure}"/>' if failure else "")
        + "</testcase>"
        for name, failure in cases
    )
    path.write_text(f'<testsuites><testsuite name="pytest">{body}</testsuite></testsuites>')


def test_a_run_is_a_parallel_part_then_the_exclusive_part(matrix, tmp_path, monkeypatch):
    report = tmp_path / "outcomes.jsonl"
    commands = []

    def fake_run(command, cwd, env):
        commands.append(command)
        xml = Path(next(arg for arg in command if arg.startswith("--junitxml=")).split("=", 1)[1])
        if "exclusive" in xml.name:
            return subprocess.CompletedProcess(command, matrix.NO_TESTS_COLLECTED)  # -k chose none of them
        junit(xml, ("test_a", None), ("test_b", "boom"))
        assert env["EO_FAULT_REPORT"] == str(report) and env["EO_FAULT_RUN"] == "1"
        return subprocess.CompletedProcess(command, 1)

    monkeypatch.setattr(matrix.subprocess, "run", fake_run)
    results = matrix.run_once(1, report, ["-k", "zombie"], workers=2)

    assert [c[c.index("tests/faults") + 2] for c in commands] == [
        "not soak and not exclusive",
        "not soak and exclusive",
    ]
    assert commands[0][commands[0].index("-n") + 1] == "2" and "-n" not in commands[1]
    assert all(c[-2:] == ["-k", "zombie"] for c in commands)
    assert [(name, failure) for _, name, _, failure in results] == [("test_a", None), ("test_b", "failure: boom")]


def test_one_worker_runs_one_session(matrix, tmp_path, monkeypatch):
    commands = []

    def fake_run(command, cwd, env):
        commands.append(command)
        return subprocess.CompletedProcess(command, 4)  # a usage error: pytest wrote nothing

    monkeypatch.setattr(matrix.subprocess, "run", fake_run)
    with pytest.raises(SystemExit, match="could not start"):
        matrix.run_once(1, tmp_path / "outcomes.jsonl", [], workers=1)
    assert len(commands) == 1 and commands[0][commands[0].index("tests/faults") + 2] == "not soak"


def test_table_only_joins_the_parts_of_each_run(matrix, tmp_path):
    report = tmp_path / "outcomes.jsonl"
    junit(tmp_path / "outcomes-run1-parallel.xml", ("test_a", None))
    junit(tmp_path / "outcomes-run1-exclusive.xml", ("test_kill", None))
    junit(tmp_path / "outcomes-run2-parallel.xml", ("test_a", "lost 1"))
    junit(tmp_path / "outcomes-run10-parallel.xml", ("test_a", None))

    runs = matrix.earlier_runs(report)

    assert [[name for _, name, _, _ in run] for run in runs] == [["test_a", "test_kill"], ["test_a"], ["test_a"]]
    assert matrix.collect(runs, report)["tests/faults/test_x.py::test_a"].passed == 2
