"""The local stack's Spark standalone cluster is shared by parallel tests: it is restarted only when its JVMs run
from a virtualenv that is gone."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from tests.conftest import STACK


def test_only_a_jvm_of_a_deleted_checkout_is_restarted(tmp_path):
    jars = tmp_path / "live" / "pyspark" / "jars"
    jars.mkdir(parents=True)
    (jars / "slf4j-api.jar").write_bytes(b"")
    # spark-class puts pyspark/conf first, which a pip-installed pyspark does not have: not a sign of deletion.
    live = f"{tmp_path}/live/pyspark/conf:{jars}/slf4j-api.jar:{jars}/*"
    gone = f"{tmp_path}/gone/pyspark/conf:{tmp_path}/gone/pyspark/jars/slf4j-api.jar:{tmp_path}/gone/pyspark/jars/*"
    for classpath, deleted in ((live, False), (gone, True)):
        jvm = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-cp", classpath])
        try:
            while b"-cp" not in Path(f"/proc/{jvm.pid}/cmdline").read_bytes():  # until the child has exec'd
                time.sleep(0.01)
            assert STACK._runs_a_deleted_checkout(SimpleNamespace(pid=lambda: jvm.pid)) is deleted, classpath  # noqa: B023 - called here
        finally:
            jvm.kill()
            jvm.wait()


def test_only_the_class_archives_of_deleted_checkouts_are_pruned(tmp_path, monkeypatch):
    import os

    monkeypatch.setattr(STACK, "HOME", tmp_path)
    (tmp_path / "spark").mkdir()
    live_jars = tmp_path / "live" / "pyspark" / "jars"
    live_jars.mkdir(parents=True)
    archives = {name: tmp_path / "spark" / f"driver-classes-{name}.jsa" for name in ("live", "gone", "legacy", "old")}
    for archive in archives.values():
        archive.write_bytes(b"jsa")
    archives["live"].with_suffix(".pyspark").write_text(str(live_jars))
    archives["gone"].with_suffix(".pyspark").write_text(str(tmp_path / "gone" / "pyspark" / "jars"))
    two_days_ago = time.time() - 2 * 86400
    os.utime(archives["old"], (two_days_ago, two_days_ago))  # no owner recorded, untouched for two days
    STACK._prune_class_archives()
    assert sorted(p.name for p in (tmp_path / "spark").iterdir()) == [
        "driver-classes-legacy.jsa",
        "driver-classes-live.jsa",
        "driver-classes-live.pyspark",
    ]


def test_two_processes_resolving_the_jars_at_once_resolve_them_once(tmp_path, monkeypatch):
    # One lock per stack home: the second caller waits, then finds the folder done (it used to delete the first's
    # jars under it: "FileNotFoundError: parquet-encoding-1.16.0.jar"). Threads hold separate flocks as processes do.
    import threading

    monkeypatch.setattr(STACK, "HOME", tmp_path)
    running, resolutions = [], []

    def maven(cmd, **kwargs):  # what Maven's copy-dependencies does, slowly enough for the other caller to arrive
        target = Path(next(arg for arg in cmd if arg.startswith("-DoutputDirectory=")).split("=", 1)[1])
        running.append(1)
        resolutions.append(len(running))
        target.mkdir(parents=True, exist_ok=True)
        for jar in ("delta-spark_2.13-4.4.0.jar", "parquet-encoding-1.16.0.jar", "spark-sql-kafka-0-10_2.13-4.2.0.jar"):
            (target / jar).write_bytes(b"jar")
            time.sleep(0.2)
        running.pop()

    monkeypatch.setattr(STACK, "run", maven)
    found, failed = [], []

    def resolve():
        try:
            found.append([jar.name for jar in STACK._resolved_jars()])
        except Exception as err:  # noqa: BLE001 - reported by the assertion below
            failed.append(err)

    callers = [threading.Thread(target=resolve) for _ in range(2)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(30)
    assert failed == [] and resolutions == [1]  # Maven ran once, never beside another resolution
    # pyspark ships parquet-encoding (another version): its jar is not the connectors' to add
    assert found == [["delta-spark_2.13-4.4.0.jar", "spark-sql-kafka-0-10_2.13-4.2.0.jar"]] * 2
