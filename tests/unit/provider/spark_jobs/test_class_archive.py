"""The driver class archive: one file per Java + Spark install, written whole by one driver, used by the rest."""

from __future__ import annotations

import pytest

from exactly_once_provider.spark_jobs import class_archive
from exactly_once_provider.spark_jobs.class_archive import DriverClassArchive, chosen_elsewhere

pytestmark = pytest.mark.unit


def test_the_first_driver_writes_a_partial_file_that_publish_moves_into_place(tmp_path):
    archive = DriverClassArchive.in_directory(str(tmp_path / "cds"))
    assert archive.partial is not None and not archive.path.exists()
    assert archive.java_options().startswith(f"-XX:ArchiveClassesAtExit={archive.partial} ")
    archive.partial.write_bytes(b"classes")  # what the JVM writes as it exits
    assert archive.publish(succeeded=True)
    assert archive.path.read_bytes() == b"classes" and not archive.partial.exists()

    later = DriverClassArchive.in_directory(str(tmp_path / "cds"))
    assert later == DriverClassArchive(archive.path, None)
    assert later.java_options().startswith(f"-XX:SharedArchiveFile={archive.path} ")
    assert not later.publish(succeeded=True)


def test_a_failed_driver_leaves_no_archive(tmp_path):
    archive = DriverClassArchive.in_directory(str(tmp_path))
    archive.partial.write_bytes(b"classes")
    assert not archive.publish(succeeded=False)
    assert list(tmp_path.iterdir()) == []


def test_two_drivers_building_at_once_write_separate_files(tmp_path):
    first, second = (DriverClassArchive.in_directory(str(tmp_path)) for _ in range(2))
    assert first.path == second.path and first.partial != second.partial


def test_another_java_or_spark_names_another_archive(tmp_path, monkeypatch):
    before = DriverClassArchive.in_directory(str(tmp_path)).path
    monkeypatch.setattr(class_archive, "_spark_jars", lambda: ["spark-core_2.13-9.9.9.jar"])
    assert DriverClassArchive.in_directory(str(tmp_path)).path != before


@pytest.mark.parametrize("directory", ["", "relative/dir"])
def test_the_directory_must_be_absolute(directory):
    with pytest.raises(ValueError, match="driver-class-archive-dir.*absolute"):
        DriverClassArchive.in_directory(directory)


def test_options_that_already_name_an_archive_win():
    assert chosen_elsewhere(None, "-Xmx1g -XX:SharedArchiveFile=/x.jsa")
    assert chosen_elsewhere("-XX:ArchiveClassesAtExit=/y.jsa", None)
    assert not chosen_elsewhere("-Xmx1g", None, "")
