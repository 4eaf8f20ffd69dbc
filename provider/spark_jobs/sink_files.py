"""Parquet files sink: batches are staged, renamed into place, then published by an atomic manifest.

Layout under ``root``::

    _staging/<checkpoint id>-<batch id>-<nonce>/part-*.parquet   Spark writes here (invisible to readers)
    data/<checkpoint id>-<batch id>-<nonce>/part-*.parquet       a staged batch after one directory rename
    _manifests/<sequence, 20 digits>.json                        published state; the newest one wins

A manifest is the commit: ``{"format": 1, "sequence": n, "pipeline", "checkpoint_id", "batch_id",
"offsets": {topic: {partition: next offset}}, "rows_total", "files": [{"path": "data/...", "rows": n}, ...]}``
with the CUMULATIVE list of published files. It is written to a temporary file, fsynced and hard-linked to
its final name (``link`` fails if the name exists, so two writers can never both publish sequence n), then
the directory is fsynced. Readers list ``_manifests``, take the highest sequence and read exactly the files it
lists: a crash leaves at most unreferenced directories (orphans), which readers never see and
:meth:`FilesSink.remove_orphans` deletes when the job starts.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from exactly_once_provider.spark_jobs.batch import BatchCommit

MANIFEST_FORMAT = 1


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def latest_manifest(root: str) -> dict | None:
    """Return the newest published manifest under ``root`` (None if nothing was published)."""
    directory = Path(root.removeprefix("file://")) / "_manifests"
    names = sorted(p.name for p in directory.glob("[0-9]*.json")) if directory.is_dir() else []
    return json.loads((directory / names[-1]).read_text()) if names else None


def published_files(root: str) -> list[str]:
    """Return the absolute paths of the files the newest manifest publishes (the only files to read)."""
    manifest = latest_manifest(root)
    base = Path(root.removeprefix("file://"))
    return [str(base / f["path"]) for f in manifest["files"]] if manifest else []


class FilesSink:
    """Append a pipeline's batches as Parquet files under ``root`` (one pipeline per root).

    :param root: the sink directory (local or mounted file system: rename and link must be atomic).
    :param pipeline: the pipeline's stable name.
    """

    kind = "files"

    def __init__(self, root: str, pipeline: str) -> None:
        self.root = Path(root.removeprefix("file://"))
        self.pipeline = pipeline

    def committed(self) -> BatchCommit | None:
        manifest = latest_manifest(str(self.root))
        if manifest is None:
            return None
        if manifest["pipeline"] != self.pipeline:
            raise ValueError(f"{self.root} holds pipeline {manifest['pipeline']!r}, not {self.pipeline!r}: "
                             "give each pipeline its own files sink directory.")
        return BatchCommit.from_json({k: manifest[k] for k in
                                      ("pipeline", "checkpoint_id", "batch_id", "offsets", "rows_total")})

    def remove_orphans(self) -> list[str]:
        """Delete staged and data directories no published manifest references; return what was removed."""
        manifest = latest_manifest(str(self.root))
        referenced = {Path(f["path"]).parts[1] for f in manifest["files"]} if manifest else set()
        removed = []
        shutil.rmtree(self.root / "_staging", ignore_errors=True)
        data = self.root / "data"
        if data.is_dir() and manifest is not None:
            for child in data.iterdir():
                if child.name not in referenced:
                    shutil.rmtree(child)
                    removed.append(child.name)
        return removed

    def commit(self, df, commit: BatchCommit) -> bool:
        """Stage, rename and publish the batch; return False if this batch is already published."""
        import pyarrow.parquet as pq

        previous = latest_manifest(str(self.root))
        if previous and previous["checkpoint_id"] == commit.checkpoint_id \
                and previous["batch_id"] >= commit.batch_id:
            return False
        name = f"{commit.checkpoint_id}-{commit.batch_id}-{uuid.uuid4().hex[:8]}"
        staged = self.root / "_staging" / name
        df.write.mode("errorifexists").parquet(str(staged))
        published = self.root / "data" / name
        published.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staged, published)
        _fsync_dir(published.parent)
        files = [{"path": f"data/{name}/{part.name}", "rows": pq.read_metadata(part).num_rows}
                 for part in sorted(published.glob("part-*.parquet"))]
        rows = sum(f["rows"] for f in files)
        sequence = previous["sequence"] + 1 if previous else 0
        manifest = {
            "format": MANIFEST_FORMAT, "sequence": sequence, **commit.to_json(),
            "rows_total": (previous["rows_total"] if previous else 0) + rows,
            "files": (previous["files"] if previous else []) + files,
        }
        manifests = self.root / "_manifests"
        manifests.mkdir(parents=True, exist_ok=True)
        tmp = manifests / f".{name}.tmp"
        with open(tmp, "w") as handle:
            json.dump(manifest, handle, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, manifests / f"{sequence:020d}.json")  # the commit point; fails if n exists
        finally:
            tmp.unlink()
        _fsync_dir(manifests)
        return True

    def append(self, df) -> None:
        """At-least-once baseline: Spark writes Parquet straight into ``data/``, no manifest."""
        df.write.mode("append").parquet(str(self.root / "data" / "_at_least_once"))
