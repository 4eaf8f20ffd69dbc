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
