"""Where a test's time goes: a pytest plugin that records the fixed costs of each test into the JUnit XML.

For every test (setup, call and teardown) it records the intervals, relative to the test's start, spent in:

- ``spark_app``: a spark-submit process the test process started (an operator's hook, a job helper), from launch
  to exit; ``benchmarks/test_profile.py`` splits it into the application's start-up and its work;
- ``spark_session``: the in-process ``spark`` fixture's SparkSession start;
- ``airflow_start`` / ``airflow_stop``: a real Airflow's start (migrate, four components, healthy) and stop;
- ``airflow_wait``: waiting for a DAG to be parsed, a run or a task to reach a state (REST polling);
- ``stack``: bringing the local stack up, and restarting or killing a service (the fault tests);
- ``sleep``: ``time.sleep`` on the test's main thread (polls and pauses).

Each list goes into the test's JUnit ``<properties>`` as ``profile`` (JSON); ``make test-profile`` reads them.
A recorded interval never changes what a test does: the wrappers call through and only take the time.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import threading
import time

import pytest

_intervals: list[tuple[str, float, float]] = []
_lock = threading.Lock()
_real_sleep = time.sleep


def record(kind: str, start: float, end: float) -> None:
    """Record that ``[start, end]`` (``time.monotonic()``) of the running test went to ``kind``."""
    with _lock:
        _intervals.append((kind, start, end))


def timed(kind: str):
    """Decorate a function so that each call's wall time is recorded as ``kind``."""

    def wrap(func):
        @functools.wraps(func)
        def call(*args, **kwargs):
            start = time.monotonic()
            try:
                return func(*args, **kwargs)
            finally:
                record(kind, start, time.monotonic())

        call.__eo_profiled__ = True
        return call

    return wrap


def _sleep(seconds: float) -> None:
    if threading.current_thread() is not threading.main_thread():
        return _real_sleep(seconds)
    start = time.monotonic()
    try:
        _real_sleep(seconds)
    finally:
        record("sleep", start, time.monotonic())


def _is_spark_submit(args) -> bool:
    first = args[0] if isinstance(args, (list, tuple)) and args else args
    return isinstance(first, (str, os.PathLike)) and os.path.basename(os.fspath(first)) == "spark-submit"


_real_popen_init = subprocess.Popen.__init__


def _popen_init(self, args, *rest, **kwargs):
    _real_popen_init(self, args, *rest, **kwargs)
    if _is_spark_submit(args):
        start = time.monotonic()
        threading.Thread(target=_watch_exit, args=(self.pid, start), daemon=True).start()


def _watch_exit(pid: int, start: float) -> None:
    """Wait for ``pid`` to exit WITHOUT reaping it (WNOWAIT): the Popen that owns it still collects its status."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:  # already reaped by its owner
        pass
    record("spark_app", start, time.monotonic())


def install(stack_module) -> None:
    """Wrap the process-wide entry points once per pytest process (idempotent)."""
    if getattr(time.sleep, "__eo_profiled__", False):
        return
    _sleep.__eo_profiled__ = True
    time.sleep = _sleep
    subprocess.Popen.__init__ = _popen_init
    for name in (
        "up",
        "start_by_name",
        "start_kafka",
        "start_mariadb",
        "start_postgres",
        "start_minio",
        "start_spark_cluster",
    ):
        setattr(stack_module, name, timed("stack")(getattr(stack_module, name)))
    stack_module.Process.kill = timed("stack")(stack_module.Process.kill)
    stack_module.MariadbServer.start = timed("stack")(stack_module.MariadbServer.start)
    stack_module.MariadbServer.kill = timed("stack")(stack_module.MariadbServer.kill)


_STARTED = pytest.StashKey[float]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with _lock:
        _intervals.clear()
    item.stash[_STARTED] = time.monotonic()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    started = item.stash.get(_STARTED, None)
    if call.when != "teardown" or started is None:
        return
    now = time.monotonic()
    with _lock:
        spans = [
            (kind, round(max(s, started) - started, 3), round(min(e, now) - started, 3))
            for kind, s, e in _intervals
            if e > started
        ]
        _intervals.clear()
    outcome.get_result().user_properties.append(("profile", json.dumps(spans, separators=(",", ":"))))
