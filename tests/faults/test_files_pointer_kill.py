"""SIGKILL the files sink's committer at each step of a publish, restart: every row once, exact resume.

The committer (``files_sink_process.py``) runs as a subprocess and kills itself at a step of its 3rd batch
(``EO_FAULT_AT``): after staging (nothing published), after the manifest's put-if-absent (the pointer lags
one manifest), after the pointer. The second run resumes from ``committed()``: the batch after the last
published one, exactly. The oracle reads the published files: rows 1..10*BATCHES once each.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from exactly_once_provider.sinks.files import newest_sequence, published_files
from tests.fault_support import check

SCRIPT = Path(__file__).with_name("files_sink_process.py")
REPO = Path(__file__).resolve().parents[2]
BATCHES = 6


def _run(root: Path, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("EO_FAULT_AT", None)
    if fault:
        env["EO_FAULT_AT"] = fault
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(root), str(BATCHES)], env=env, capture_output=True, text=True, timeout=300
    )


# The default suite keeps the kill between the manifest and the pointer (the pointer lags); make faults-matrix
# adds the kills before the manifest and after the pointer.
@pytest.mark.parametrize(
    "step, resume",
    [
        pytest.param("files_staged:3", 2, marks=pytest.mark.matrix),
        ("files_manifest_published:3", 3),
        pytest.param("files_pointer_written:3", 3, marks=pytest.mark.matrix),
    ],
)
def test_committer_killed_at_each_publish_step_resumes_exactly(tmp_path, fault_outcome, step, resume):
    killed = _run(tmp_path, step)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    newest, pointer = newest_sequence(tmp_path)
    assert newest == resume - 1  # what the kill left published
    if step == "files_manifest_published:3":
        assert pointer is None  # the pointer lags; the reader stepped past it
    finished = _run(tmp_path)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert f"RESUME {resume}\n" in finished.stdout
    rows = [n for f in published_files(str(tmp_path)) for n in pq.read_table(f)["n"].to_pylist()]
    check(fault_outcome, range(1, 10 * BATCHES + 1), rows, "rows")
    assert newest_sequence(tmp_path)[0] == BATCHES - 1
