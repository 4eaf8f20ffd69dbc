"""Parquet files sink: batches are staged, renamed into place, then published by an atomic manifest.

Layout under ``root``::

    _staging/<checkpoint id>-<batch id>-<nonce>/part-*.parquet   Spark writes here (invisible to readers)
    data/<checkpoint id>-<batch id>-<nonce>/part-*.parquet       a staged batch after one directory rename
    _manifests/<sequence, 20 digits>.json                        published state; the newest one wins
    _manifests/_latest.json                                      pointer to the newest (a verified hint)

A manifest is the commit: ``{"format": 1, "sequence": n, "pipeline", "checkpoint_id", "batch_id",
"offsets": {topic: {partition: next offset}}, "rows_total", "files": [{"path": "data/...", "rows": n}, ...]}``
with the CUMULATIVE list of published files. It is created with
:func:`~exactly_once_provider.sinks.durable.put_if_absent`: written to a temporary file, fsynced and hard-linked to
its final name (``link`` fails if the name exists, so two writers can never both publish sequence n), then
the directory is fsynced. Then the pointer ``_latest.json`` is replaced with the sequence and the commit, and
the manifest ``KEEP_MANIFESTS`` behind is deleted. Readers take the pointer's sequence, check that its manifest
exists and step past every newer one that exists (:func:`newest_sequence`), and read exactly the files the
newest lists: a crash leaves at most unreferenced directories (orphans), which readers never see and
:meth:`FilesSink.remove_orphans` deletes when the job starts.

Window mode (:meth:`FilesSink.commit_windows`) stages each published window version in its own directory,
renames it to ``windows/<window slug>/<checkpoint id>-<batch id>-<nonce>/`` and publishes one manifest whose
``windows`` map gives each window its version, rows and files (``files`` stays the flat list of everything
published): a new version replaces the window's entry, the superseded directory becomes an orphan.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import uuid
from pathlib import Path

from airflow.sdk.exceptions import AirflowException

from exactly_once_provider.faults import fault_point
from exactly_once_provider.sinks.durable import fsync_dir, put_if_absent, replace
from exactly_once_provider.sinks.base import (UNCHECKED, BatchCommit, StaleBatchError, replayed,
                                              require_newer_windows, require_predecessor)

MANIFEST_FORMAT = 1
POINTER = "_latest.json"
# Manifests older than the newest KEEP_MANIFESTS are deleted as new ones are published (each publish deletes
# the one KEEP_MANIFESTS behind it). Readers only ever read the newest, each in one open + read, and look
# again if it vanished; 100 leaves a reader a hundred publishes of slack, and the directory stays small.
KEEP_MANIFESTS = 100
log = logging.getLogger(__name__)


def latest_manifest(root: str) -> dict | None:
    """Return the newest published manifest under ``root`` (None if nothing was published)."""
    directory = Path(root.removeprefix("file://")) / "_manifests"
    for _ in range(5):
        sequence, _pointer = newest_sequence(directory)
        if sequence is None:
            return None
        try:
            return json.loads((directory / _manifest_name(sequence)).read_text())
        except FileNotFoundError:  # retention removed it after a newer one was published: look again
            continue
    raise AirflowException(f"The newest manifest of {directory} kept disappearing while being read: is a "
                           "manifest retention other than this provider's removing manifests?")


def newest_sequence(directory: Path) -> tuple[int | None, dict | None]:
    """
    Return the newest published sequence in ``directory`` and the pointer if it names exactly that one.

    Reads the pointer (``_latest.json``), then checks it against the numbering: its manifest must exist, and
    the next ones are looked for one by one (the pointer is written after its manifest, so after a crash, or
    when two writers' pointer writes land out of order, it may lag behind). Without a usable pointer (a sink
    written before pointers, or one whose pointed manifest is gone) the directory is listed.

    :param directory: the ``_manifests`` directory.
    """
    try:
        pointer = json.loads((directory / POINTER).read_text())
        sequence = int(pointer["sequence"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        pointer = None
    if pointer is None or not (directory / _manifest_name(sequence)).exists():
        names = sorted(p.name for p in directory.glob("[0-9]*.json")) if directory.is_dir() else []
        return (int(names[-1].removesuffix(".json")) if names else None), None
    newest = sequence
    while (directory / _manifest_name(newest + 1)).exists():
        newest += 1
    return newest, pointer if newest == sequence else None


def write_pointer(root: Path, manifest: dict) -> None:
    """
    Replace the pointer with one naming ``manifest`` and carrying its commit (what :meth:`FilesSink.committed`
    returns), so finding and reading the newest commit costs the same after 10 or 100,000 publishes.

    A hint, never the commit: the manifest's put-if-absent is. A plain atomic replace (a PUT on an object
    store) suffices because readers verify it against the manifest numbering (:func:`newest_sequence`).

    :param root: the sink directory.
    :param manifest: the manifest just published.
    """
    pointer = {"format": MANIFEST_FORMAT, "sequence": manifest["sequence"],
               **{k: manifest[k] for k in ("pipeline", "checkpoint_id", "batch_id", "offsets", "rows_total")}}
    if manifest.get("windows"):
        pointer["windows"] = {w: {"version": v["version"], "rows": v["rows"]} for w, v in manifest["windows"].items()}
    replace(root / "_manifests" / POINTER, json.dumps(pointer, sort_keys=True).encode())


def _manifest_name(sequence: int) -> str:
    return f"{sequence:020d}.json"


def published_files(root: str) -> list[str]:
    """Return the absolute paths of the files the newest manifest publishes (the only files to read)."""
    manifest = latest_manifest(root)
    base = Path(root.removeprefix("file://"))
    return [str(base / f["path"]) for f in manifest["files"]] if manifest else []


def _slug(window_id: str) -> str:
    """Return a directory name for a window id (readable part + hash: ids may hold '/', ':' or '+')."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", window_id)[-80:]
    return f"{readable}-{hashlib.sha256(window_id.encode()).hexdigest()[:12]}"


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
        """Return the newest batch this pipeline published (None before the first); window mode: its windows.

        Reads the pointer when it names the newest manifest (a few hundred bytes, whatever the history),
        else the newest manifest itself.
        """
        _sequence, pointer = newest_sequence(self.root / "_manifests")
        return self._commit_of(pointer if pointer is not None else latest_manifest(str(self.root)))

    def _commit_of(self, manifest: dict | None) -> BatchCommit | None:
        if manifest is None:
            return None
        if manifest["pipeline"] != self.pipeline:
            raise ValueError(f"{self.root} holds pipeline {manifest['pipeline']!r}, not {self.pipeline!r}: "
                             "give each pipeline its own files sink directory.")
        state = BatchCommit.from_json({k: manifest[k] for k in
                                       ("pipeline", "checkpoint_id", "batch_id", "offsets", "rows_total")})
        if manifest.get("windows"):  # as the other sinks report them: version and rows per window
            state.extra["windows"] = {w: {"version": v["version"], "rows": v["rows"]}
                                      for w, v in manifest["windows"].items()}
        return state

    def commit_location(self) -> str:
        """Return ``manifest <n>, <k> files`` of the newest published manifest ("" before the first)."""
        manifest = latest_manifest(str(self.root))
        return f"manifest {manifest['sequence']}, {len(manifest['files'])} files" if manifest else ""

    def prepare(self) -> None:
        """Remove what a crash left unpublished (:meth:`remove_orphans`) before the job's first batch."""
        removed = self.remove_orphans()
        if removed:
            log.warning("files sink: removed %d unpublished batch director(y/ies) left by a crash: %s",
                        len(removed), removed)

    def remove_orphans(self) -> list[str]:
        """Delete staged and data directories no published manifest references; return what was removed."""
        manifest = latest_manifest(str(self.root))
        referenced = {str(Path(f["path"]).parent) for f in manifest["files"]} if manifest else set()
        removed = []
        shutil.rmtree(self.root / "_staging", ignore_errors=True)
        if manifest is None:
            return removed
        batches = list((self.root / "data").glob("*")) + list((self.root / "windows").glob("*/*"))
        for child in batches:
            relative = str(child.relative_to(self.root))
            if child.is_dir() and relative not in referenced:
                shutil.rmtree(child)
                removed.append(relative)
        return removed

    def _stage(self, df, name: str, destination: Path) -> list[dict]:
        """Write ``df`` to a staging directory and rename it to ``destination``; return its files."""
        import pyarrow.parquet as pq

        staged = self.root / "_staging" / name
        df.write.mode("errorifexists").parquet(str(staged))
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staged, destination)
        fsync_dir(destination.parent)
        return [{"path": str(part.relative_to(self.root)), "rows": pq.read_metadata(part).num_rows}
                for part in sorted(destination.glob("part-*.parquet"))]

    def _publish(self, previous: dict | None, fields: dict) -> None:
        """Write the next manifest; its hard link to the final name is the commit point.

        The link fails if another writer published the same sequence number since ``previous`` was read: the
        compare-and-set that keeps two drivers from both publishing on top of one manifest.
        """
        fault_point("files_staged")
        sequence = previous["sequence"] + 1 if previous else 0
        manifest = {"format": MANIFEST_FORMAT, "sequence": sequence, **fields}
        manifests = self.root / "_manifests"
        data = json.dumps(manifest, sort_keys=True).encode()
        if not put_if_absent(manifests / f"{sequence:020d}.json", data):  # the commit point; fails if n exists
            raise StaleBatchError(
                f"Manifest {sequence} of {self.root} was published by another writer while this one was writing "
                f"batch {fields['batch_id']} of checkpoint {fields['checkpoint_id']}: another driver commits "
                f"pipeline {self.pipeline!r}. Nothing of this batch was published (its files are orphans, removed "
                "at the next start); stop the other driver.")
        fault_point("files_manifest_published")
        write_pointer(self.root, manifest)
        fault_point("files_pointer_written")
        (manifests / _manifest_name(sequence - KEEP_MANIFESTS)).unlink(missing_ok=True)

    def _previous(self, commit: BatchCommit, expected: object) -> tuple[dict | None, bool]:
        """Return the newest manifest and whether ``commit`` is already in it; fail if it is not ``expected``.

        The manifest read here is the one :meth:`_publish` publishes on top of (put-if-absent of the next
        sequence), so these checks hold at the commit point.
        """
        previous = latest_manifest(str(self.root))
        found = self._commit_of(previous)
        if replayed(found, commit):
            return previous, True
        require_predecessor(found, expected, commit, self.kind)
        return previous, False

    def commit(self, df, commit: BatchCommit, expected: object = UNCHECKED) -> bool:
        """Stage, rename and publish the batch; return False if this batch is already published.

        :param expected: the sink's commit the batch was planned on; another one fails the batch.
        """
        previous, done = self._previous(commit, expected)
        if done:
            return False
        name = f"{commit.checkpoint_id}-{commit.batch_id}-{uuid.uuid4().hex[:8]}"
        files = self._stage(df, name, self.root / "data" / name)
        self._publish(previous, {
            **commit.to_json(),
            "rows_total": (previous["rows_total"] if previous else 0) + sum(f["rows"] for f in files),
            "files": (previous["files"] if previous else []) + files,
        })
        return True

    def published_windows(self) -> dict[str, int]:
        """Return window id -> version published under ``root`` (window mode)."""
        manifest = latest_manifest(str(self.root))
        return {w: int(v["version"]) for w, v in (manifest or {}).get("windows", {}).items()}

    def commit_windows(self, df, windows: dict[str, int], rows: dict[str, int], commit: BatchCommit,
                       expected: object = UNCHECKED) -> bool:
        """Stage each window version, rename it into ``windows/``, publish versions + offsets in one manifest.

        :param df: the rows of the published window versions (window-mode columns).
        :param windows: window id -> version published by this commit (may be empty: offsets only).
        :param rows: window id -> rows of that version.
        :param commit: the batch identity and the offsets the next read starts from.
        :param expected: the sink's commit the batch was planned on; another one fails the batch.
        :return: False if the batch was already committed.
        """
        from pyspark.sql import functions as F

        previous, done = self._previous(commit, expected)
        if done:
            return False
        name = f"{commit.checkpoint_id}-{commit.batch_id}-{uuid.uuid4().hex[:8]}"
        state = dict((previous or {}).get("windows", {}))
        require_newer_windows(windows, {w: int(v["version"]) for w, v in state.items()}, "the published")
        for window, version in sorted(windows.items()):
            files = self._stage(df.filter(F.col("window_id") == window).coalesce(1), f"{name}-{_slug(window)}",
                                self.root / "windows" / _slug(window) / name)
            state[window] = {"version": version, "rows": rows[window], "files": files}
        self._publish(previous, {
            **commit.to_json(), "rows_total": sum(w["rows"] for w in state.values()), "windows": state,
            "files": [f for w in state.values() for f in w["files"]],
        })
        return True

    def append(self, df) -> None:
        """At-least-once baseline: Spark writes Parquet straight into ``data/``, no manifest."""
        df.write.mode("append").parquet(str(self.root / "data" / "_at_least_once"))
