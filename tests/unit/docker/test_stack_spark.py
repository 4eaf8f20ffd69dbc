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
