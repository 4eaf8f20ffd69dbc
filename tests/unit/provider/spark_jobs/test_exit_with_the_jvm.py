"""The Python driver leaves as soon as the JVM that started it (PythonRunner) is gone, never before."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

# The "JVM": a parent that starts the Python driver, waits until it watches, writes its pid and exits.
PARENT = """
import os, subprocess, sys, time
# Like PythonRunner, the parent reads the driver's output: once the parent is gone, that pipe is broken.
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2] + ".ready"], stdout=subprocess.PIPE)
while not os.path.exists(sys.argv[2] + ".ready"):
    time.sleep(0.1)
open(sys.argv[2], "w").write(str(child.pid))
"""
DRIVER = """
import sys, time
from exactly_once_provider.spark_jobs.kafka_to_sink import exit_with_the_jvm
exit_with_the_jvm()
open(sys.argv[1], "w").close()
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0]
    except FileNotFoundError:
        return False


def _orphan(tmp_path: Path, gateway: bool) -> int:
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_GATEWAY_PORT"}
    if gateway:
        env["PYSPARK_GATEWAY_PORT"] = "1"
    pid_file = tmp_path / "pid"
    subprocess.run([sys.executable, "-c", PARENT, DRIVER, str(pid_file)], env=env, check=True, timeout=60)
    return int(pid_file.read_text())


def test_the_python_driver_exits_when_its_jvm_is_gone(tmp_path):
    pid = _orphan(tmp_path, gateway=True)
    deadline = time.monotonic() + 20
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(pid)


def test_a_job_not_started_by_python_runner_is_left_alone(tmp_path):
    pid = _orphan(tmp_path, gateway=False)
    try:
        time.sleep(3)  # the watch polls every second
        assert _alive(pid)
    finally:
        os.kill(pid, 9)
