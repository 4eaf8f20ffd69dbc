"""A class-data-sharing archive for the Spark drivers that start on the Airflow worker.

A bounded Spark job on a small worker spends seconds of its start loading, verifying and linking the JDK's and
Spark's classes in its driver JVM (spark-submit's own JVM in local and client mode). Java's dynamic class-data
sharing (CDS, JDK 13+) maps them from one file instead: the first driver of a Java + Spark install writes the
archive as it exits (``-XX:ArchiveClassesAtExit``, a few seconds, once), every later driver starts from it
(``-XX:SharedArchiveFile``). It changes how fast the JVM starts, nothing it computes. The JVM checks the archive
against its own JDK and class path and starts as usual when they differ; the archive's name carries a hash of
the Java binary and Spark's jars, so an upgrade of either builds a new one.

Turned on per Spark connection: Extra ``{"driver-class-archive-dir": "/var/cache/airflow/spark-cds"}`` (a
directory on the worker's own disk that the task's user can write). Drivers that run on a cluster's worker
(``deploy_mode="cluster"``) are not affected.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

# The Spark connection's Extra key that turns the archive on.
ARCHIVE_DIR_EXTRA = "driver-class-archive-dir"
# Without these a JVM that cannot use or write the archive says so on stdout, among spark-submit's output.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def chosen_elsewhere(*java_options: str | None) -> bool:
    """Return whether these JVM options (``SPARK_SUBMIT_OPTS``, the driver's) already name a class archive."""
    return any(
        option and ("SharedArchiveFile" in option or "ArchiveClassesAtExit" in option) for option in java_options
    )


def _java_binary() -> Path:
    java_home = os.environ.get("JAVA_HOME")
    java = Path(java_home) / "bin" / "java" if java_home else shutil.which("java")
    if not java or not Path(java).exists():
        raise ValueError(f"no Java found to key the driver class archive on (JAVA_HOME={java_home!r}, PATH)")
    return Path(java).resolve()


def _spark_jars() -> list[str]:
    spark_home = os.environ.get("SPARK_HOME")
    if spark_home:
        jars = Path(spark_home) / "jars"
    else:
        import pyspark

        jars = Path(pyspark.__file__).parent / "jars"
    return sorted(path.name for path in jars.glob("*.jar"))


def install_key() -> str:
    """Return a hash of what the archive depends on: the Java binary (path, size, time) and Spark's jars."""
    java = _java_binary()
    stat = java.stat()
    text = "\n".join([str(java), str(stat.st_size), str(stat.st_mtime_ns), *_spark_jars()])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class DriverClassArchive:
    """The archive one driver starts from, or the file it writes it to when there is none yet.

    :param path: the archive of this Java + Spark install.
    :param partial: the file this driver writes at exit when ``path`` does not exist yet (its own name: two
        drivers building at once do not write into one file); :meth:`publish` moves it to ``path``.
    """

    path: Path
    partial: Path | None

    @classmethod
    def in_directory(cls, directory: str) -> DriverClassArchive:
        """Return the archive of this install in ``directory``: use it if it exists, else write it this time."""
        if not directory or not os.path.isabs(directory):
            raise ValueError(
                f"Spark connection Extra {ARCHIVE_DIR_EXTRA!r} must be an absolute directory path, got {directory!r}"
            )
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"spark-driver-{install_key()}.jsa"
        if path.exists():
            return cls(path, None)
        return cls(path, folder / f"{path.stem}.{uuid.uuid4().hex[:8]}.partial")

    def java_options(self) -> str:
        """Return the driver JVM options that use (or write) the archive."""
        if self.partial is None:
            return f"-XX:SharedArchiveFile={self.path} {QUIET}"
        return f"-XX:ArchiveClassesAtExit={self.partial} {QUIET}"

    def publish(self, succeeded: bool) -> bool:
        """Move a written archive into place after a driver that succeeded; drop it otherwise.

        Whole or absent: a driver killed before it exits writes nothing, and a failed one's class set is not
        trusted. Return whether this call put an archive in place.
        """
        if self.partial is None:
            return False
        try:
            if succeeded and self.partial.exists():
                self.partial.replace(self.path)
                return True
            return False
        finally:
            self.partial.unlink(missing_ok=True)
