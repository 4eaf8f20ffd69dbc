"""Parquet files sink on the storage layer (local disk or S3): data objects first, then an atomic manifest.

Layout under ``root`` (a local path or an ``s3://``/``s3a://`` URI, :mod:`~exactly_once_provider.storage`)::

    data/<checkpoint id>-<batch id>-<nonce>/part-*.parquet       Spark writes a batch here (invisible to readers)
    dead_letters/<checkpoint id>-<batch id>-<nonce>/             its dead letters (``on_bad_record="dead_letter"``)
    windows/<window slug>/<checkpoint id>-<batch id>-<nonce>/    a window version (window mode)
    _manifests/<sequence, 20 digits>.json                        published state; the newest one wins
    _manifests/_latest.json                                      pointer to the newest (a verified hint)

A manifest is the commit: ``{"format": 1, "sequence": n, "pipeline", "checkpoint_id", "batch_id",
"offsets": {topic: {partition: next offset}}, "rows_total", "files": [{"path": "data/...", "rows": n}, ...]}``
with the CUMULATIVE list of published files (and, once a batch had dead letters, ``"dead_letters"``: the
cumulative list of their files, :mod:`~exactly_once_provider.sinks.dead_letters`). It is created with the storage's put-if-absent (locally a fsynced
temporary file hard-linked to its name, on S3 a PutObject with ``If-None-Match: *``), so two writers can never
both publish sequence n. Then the pointer ``_latest.json`` is overwritten (a plain PUT: no rename anywhere) with
the sequence and the commit, and the manifest ``KEEP_MANIFESTS`` behind is deleted. Readers take the pointer's
sequence, check that its manifest exists and step past every newer one that exists (:func:`newest_sequence`),
and read exactly the files the newest lists: a crash leaves at most unreferenced batch folders (orphans), which
readers never see and :meth:`FilesSink.remove_orphans` deletes when the job starts.

Window mode (:meth:`FilesSink.commit_windows`) writes each published window version to its own folder
``windows/<window slug>/<checkpoint id>-<batch id>-<nonce>/`` and publishes one manifest whose ``windows`` map
gives each window its version, rows and files (``files`` stays the flat list of everything published): a new
version replaces the window's entry, the superseded folder becomes an orphan.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import uuid
from pathlib import Path

from exactly_once_provider.errors import PipelineError
from exactly_once_provider.faults import fault_point
from exactly_once_provider.sinks import dead_letters
from exactly_once_provider.sinks.base import (
    UNCHECKED,
    BatchCommit,
    SchemaChange,
    StaleBatchError,
    replayed,
    require_newer_windows,
    require_predecessor,
)
from exactly_once_provider.storage import Storage, open_storage

MANIFEST_FORMAT = 1
MANIFESTS = "_manifests/"
POINTER = "_latest.json"
# Manifests older than the newest KEEP_MANIFESTS are deleted as new ones are published (each publish deletes
# the one KEEP_MANIFESTS behind it). Readers only ever read the newest, each in one read, and look again if it
# vanished; 100 leaves a reader a hundred publishes of slack, and the folder stays small.
KEEP_MANIFESTS = 100
_MANIFEST_KEY = re.compile(r"^_manifests/(\d{20})\.json$")
log = logging.getLogger(__name__)


def sink_storage(root: str | Path | Storage) -> Storage:
    """Return the storage of a files sink's root (a storage is taken as it is)."""
    return root if isinstance(root, Storage) else open_storage(str(root))


def latest_manifest(root: str | Path | Storage) -> dict | None:
    """Return the newest published manifest under ``root`` (None if nothing was published)."""
    storage = sink_storage(root)
    for _ in range(5):
        sequence, _pointer = newest_sequence(storage)
        if sequence is None:
            return None
        data = storage.read(_manifest_key(sequence))
        if data is not None:
            return json.loads(data)
        # retention removed it after a newer one was published: look again
    raise PipelineError(
        f"The newest manifest of {storage.uri(MANIFESTS)} kept disappearing while being read: "
        "is a manifest retention other than this provider's removing manifests?"
    )


def newest_sequence(root: str | Path | Storage) -> tuple[int | None, dict | None]:
    """
    Return the newest published sequence under ``root`` and the pointer if it names exactly that one.

    Reads the pointer (``_latest.json``), then checks it against the numbering: its manifest must exist, and
    the next ones are looked for one by one (the pointer is written after its manifest, so after a crash, or
    when two writers' pointer writes land out of order, it may lag behind). Without a usable pointer (a sink
    written before pointers, or one whose pointed manifest is gone) the manifests are listed.

    :param root: the sink's root (or its storage).
    """
    storage = sink_storage(root)
    try:
        pointer = json.loads(storage.read(MANIFESTS + POINTER) or b"null")
        sequence = int(pointer["sequence"])
    except (ValueError, KeyError, TypeError):
        pointer = None
    if pointer is None or not storage.exists(_manifest_key(sequence)):
        sequences = [int(m.group(1)) for key in storage.list(MANIFESTS) if (m := _MANIFEST_KEY.match(key))]
        return (max(sequences) if sequences else None), None
    newest = sequence
    while storage.exists(_manifest_key(newest + 1)):
        newest += 1
    return newest, pointer if newest == sequence else None


def write_pointer(root: str | Path | Storage, manifest: dict) -> None:
    """
    Overwrite the pointer with one naming ``manifest`` and carrying its commit (what :meth:`FilesSink.committed`
    returns), so finding and reading the newest commit costs the same after 10 or 100,000 publishes.

    A hint, never the commit: the manifest's put-if-absent is. A plain overwrite (a local atomic replace, a PUT
    on an object store) suffices because readers verify it against the manifest numbering (:func:`newest_sequence`).

    :param root: the sink's root (or its storage).
    :param manifest: the manifest just published.
    """
    pointer = {
        "format": MANIFEST_FORMAT,
        "sequence": manifest["sequence"],
        **{k: manifest[k] for k in ("pipeline", "checkpoint_id", "batch_id", "offsets", "rows_total")},
    }
    if manifest.get("windows"):
        pointer["windows"] = {w: {"version": v["version"], "rows": v["rows"]} for w, v in manifest["windows"].items()}
    sink_storage(root).put(MANIFESTS + POINTER, json.dumps(pointer, sort_keys=True).encode())


def _manifest_key(sequence: int) -> str:
    return f"{MANIFESTS}{sequence:020d}.json"


def published_files(root: str | Path | Storage) -> list[str]:
    """Return the locations (paths, ``s3://`` URIs) of the files the newest manifest publishes (the ones to read)."""
    storage = sink_storage(root)
    manifest = latest_manifest(storage)
    return [storage.uri(f["path"]) for f in manifest["files"]] if manifest else []


def read_published(root: str | Path | Storage, columns: list[str] | None = None):
    """Return the rows the newest manifest publishes as one Arrow table (None before the first publish).

    :param root: the sink's root (or its storage).
    :param columns: the columns to read (default: all).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    storage = sink_storage(root)
    manifest = latest_manifest(storage)
    if manifest is None:
        return None
    tables = []
    for entry in manifest["files"]:
        filesystem, path = storage.arrow_path(entry["path"])
        tables.append(pq.read_table(path, columns=columns, filesystem=filesystem))
    return pa.concat_tables(tables) if tables else None


def _slug(window_id: str) -> str:
    """Return a folder name for a window id (readable part + hash: ids may hold '/', ':' or '+')."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", window_id)[-80:]
    return f"{readable}-{hashlib.sha256(window_id.encode()).hexdigest()[:12]}"


class FilesSink:
    """Append a pipeline's batches as Parquet files under ``root`` (one pipeline per root).

    :param root: the sink's root: a local path, ``file://``, or ``s3://bucket/prefix`` (``s3a://`` alike).
    :param pipeline: the pipeline's stable name.
    :param storage: the root's storage (default: :func:`~exactly_once_provider.storage.open_storage` of ``root``,
        which on S3 takes the settings the process registered).
    """

    kind = "files"

    def __init__(self, root: str, pipeline: str, storage: Storage | None = None) -> None:
        self.storage = storage or open_storage(root)
        self.root = self.storage.uri()
        self.pipeline = pipeline

    def committed(self) -> BatchCommit | None:
        """Return the newest batch this pipeline published (None before the first); window mode: its windows.

        Reads the pointer when it names the newest manifest (a few hundred bytes, whatever the history),
        else the newest manifest itself.
        """
        _sequence, pointer = newest_sequence(self.storage)
        return self._commit_of(pointer if pointer is not None else latest_manifest(self.storage))

    def _commit_of(self, manifest: dict | None) -> BatchCommit | None:
        if manifest is None:
            return None
        if manifest["pipeline"] != self.pipeline:
            raise ValueError(
                f"{self.root} holds pipeline {manifest['pipeline']!r}, not {self.pipeline!r}: "
                "give each pipeline its own files sink directory."
            )
        state = BatchCommit.from_json(
            {k: manifest[k] for k in ("pipeline", "checkpoint_id", "batch_id", "offsets", "rows_total")}
        )
        if manifest.get("windows"):  # as the other sinks report them: version and rows per window
            state.extra["windows"] = {
                w: {"version": v["version"], "rows": v["rows"]} for w, v in manifest["windows"].items()
            }
        return state

    def commit_location(self) -> str:
        """Return ``manifest <n>, <k> files`` of the newest published manifest ("" before the first)."""
        manifest = latest_manifest(self.storage)
        return f"manifest {manifest['sequence']}, {len(manifest['files'])} files" if manifest else ""

    def prepare(self) -> None:
        """Remove what a crash left unpublished (:meth:`remove_orphans`) before the job's first batch."""
        removed = self.remove_orphans()
        if removed:
            log.warning("files sink: removed %d unpublished batch folder(s) left by a crash: %s", len(removed), removed)

    def remove_orphans(self) -> list[str]:
        """Delete the batch folders no published manifest references; return what was removed.

        ``_staging/`` (where sinks written before the storage layer staged batches) goes whole.
        """
        manifest = latest_manifest(self.storage)
        published = (manifest["files"] + manifest.get("dead_letters", [])) if manifest else []
        referenced = {str(Path(f["path"]).parent) for f in published}
        self.storage.delete_prefix("_staging/")
        if manifest is None:
            return []
        # a batch folder is data/<batch>/, dead_letters/<batch>/ or windows/<window>/<batch>/: the key's parent
        letters = f"{dead_letters.FILES_FOLDER}/"
        keys = self.storage.list("data/") + self.storage.list(letters) + self.storage.list("windows/")
        folders = {key.rsplit("/", 1)[0] for key in keys}
        folders = {f for f in folders if f.count("/") == (2 if f.startswith("windows/") else 1)}
        removed = sorted(folders - referenced)
        for folder in removed:
            self.storage.delete_prefix(folder + "/")
        return removed

    def _write(self, df, folder: str) -> list[dict]:
        """Write ``df`` as Parquet into the new batch folder ``folder``; return its files and their rows.

        Not visible to any reader until a manifest names the files, so no rename is needed (none is atomic
        on an object store); the row counts come from each file's Parquet footer.
        """
        import pyarrow.parquet as pq

        df.write.mode("errorifexists").parquet(self.storage.spark_uri(folder))
        files = []
        for key in self.storage.list(folder + "/"):
            name = key.removeprefix(folder + "/")
            # the folder's own part files only: not what a failed task attempt left under _temporary/
            if "/" not in name and name.startswith("part-") and name.endswith(".parquet"):
                filesystem, path = self.storage.arrow_path(key)
                files.append({"path": key, "rows": pq.read_metadata(path, filesystem=filesystem).num_rows})
        return files

    def _publish(self, previous: dict | None, fields: dict) -> None:
        """Write the next manifest with put-if-absent: the commit point.

        It fails if another writer published the same sequence number since ``previous`` was read: the
        compare-and-set that keeps two drivers from both publishing on top of one manifest.
        """
        fault_point("files_staged")
        sequence = previous["sequence"] + 1 if previous else 0
        manifest = {"format": MANIFEST_FORMAT, "sequence": sequence, **fields}
        data = json.dumps(manifest, sort_keys=True).encode()
        if not self.storage.put_if_absent(_manifest_key(sequence), data):  # the commit point; fails if n exists
            raise StaleBatchError(
                f"Manifest {sequence} of {self.root} was published by another writer while this one was writing "
                f"batch {fields['batch_id']} of checkpoint {fields['checkpoint_id']}: another driver commits "
                f"pipeline {self.pipeline!r}. Nothing of this batch was published (its files are orphans, removed "
                "at the next start); stop the other driver."
            )
        fault_point("files_manifest_published")
        write_pointer(self.storage, manifest)
        fault_point("files_pointer_written")
        if sequence >= KEEP_MANIFESTS:
            self.storage.delete(_manifest_key(sequence - KEEP_MANIFESTS))

    def _previous(self, commit: BatchCommit, expected: object) -> tuple[dict | None, bool]:
        """Return the newest manifest and whether ``commit`` is already in it; fail if it is not ``expected``.

        The manifest read here is the one :meth:`_publish` publishes on top of (put-if-absent of the next
        sequence), so these checks hold at the commit point.
        """
        previous = latest_manifest(self.storage)
        found = self._commit_of(previous)
        if replayed(found, commit):
            return previous, True
        require_predecessor(found, expected, commit, self.kind)
        return previous, False

    def commit(
        self,
        df,
        commit: BatchCommit,
        expected: object = UNCHECKED,
        letters: dead_letters.DeadLetters | None = None,
        schema: SchemaChange | None = None,
    ) -> bool:
        """Write the batch's files (and its dead letters' file), then publish them; return False if this batch is
        already published.

        :param expected: the sink's commit the batch was planned on; another one fails the batch.
        :param letters: the batch's dead letters (``on_bad_record="dead_letter"``): one Parquet file under
            ``dead_letters/``, listed in the same manifest; ``letters.written`` is set to their number.
        :param schema: refused: the files sink has no current mode (:class:`~.base.SchemaChange`).
        """
        if schema is not None:
            raise ValueError("The files sink has no current mode: a batch with a schema (SchemaChange) is refused.")
        previous, done = self._previous(commit, expected)
        if done:
            return False
        name = f"{commit.checkpoint_id}-{commit.batch_id}-{uuid.uuid4().hex[:8]}"
        files = self._write(df, f"data/{name}")
        fields = {
            **commit.to_json(),
            "rows_total": (previous["rows_total"] if previous else 0) + sum(f["rows"] for f in files),
            "files": (previous["files"] if previous else []) + files,
        }
        held = (previous or {}).get("dead_letters", [])
        if letters is not None and letters.rows:
            frame = dead_letters.spark_frame(df.sparkSession, letters.rows)
            held = held + self._write(frame, f"{dead_letters.FILES_FOLDER}/{name}")
            letters.written = len(letters.rows)
        if held:
            fields["dead_letters"] = held
        # EO_FAULT_AT=sink_written_<batch>: the batch's files (and letters) written, its manifest not published
        fault_point(f"sink_written_{commit.batch_id}")
        self._publish(previous, fields)
        return True

    def published_windows(self) -> dict[str, int]:
        """Return window id -> version published under ``root`` (window mode)."""
        manifest = latest_manifest(self.storage)
        return {w: int(v["version"]) for w, v in (manifest or {}).get("windows", {}).items()}

    def commit_windows(
        self, df, windows: dict[str, int], rows: dict[str, int], commit: BatchCommit, expected: object = UNCHECKED
    ) -> bool:
        """Write each window version into ``windows/``, publish versions + offsets in one manifest.

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
            files = self._write(df.filter(F.col("window_id") == window).coalesce(1), f"windows/{_slug(window)}/{name}")
            state[window] = {"version": version, "rows": rows[window], "files": files}
        self._publish(
            previous,
            {
                **commit.to_json(),
                "rows_total": sum(w["rows"] for w in state.values()),
                "windows": state,
                "files": [f for w in state.values() for f in w["files"]],
            },
        )
        return True

    def append(self, df) -> None:
        """At-least-once baseline: Spark writes Parquet straight into ``data/``, no manifest."""
        df.write.mode("append").parquet(self.storage.spark_uri("data/_at_least_once"))
