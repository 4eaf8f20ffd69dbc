"""The staging area of a full load: one staged Parquet file per chunk, and the chunk manifest.

Lives next to the sink (``<sink>._eo_full_load`` by default), never inside it, so nothing is visible in the
sink before the publish. It is a location of the storage layer (:mod:`~exactly_once_provider.storage`).

The staged files are written by the executors
(:class:`~exactly_once_provider.full_load.spark_source.StagedFile`): locally fsynced files, on S3 one object
each (complete and durable once its upload returned). The manifest is the load's progress marker, published
only after the staged files it lists were written: each save creates the NEXT numbered manifest
``_manifests/<sequence, 20 digits>.json`` with put-if-absent, never a rename (none is atomic on an object store).
That also fences a second loader of the same table: a save on top of a manifest another loader published
meanwhile fails, and nothing of it is recorded. The newest manifest wins; older ones are deleted
(:data:`KEEP_MANIFESTS`). A load staged by a version before the storage layer (one ``manifest.json``, replaced
in place) is read as sequence -1 and continued.

The publish of a new local table moves the listed files into the sink directory (same filesystem: a rename)
and commits them there; nothing is copied. Anywhere else (a staging area or table on S3) the publish rewrites
the listed files into the table: nothing is renamed on S3.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from exactly_once_provider.errors import PipelineError
from exactly_once_provider.storage import Storage, is_s3, open_storage

MANIFESTS = "_manifests/"
LEGACY_MANIFEST = "manifest.json"
# A reader between listing and reading finds the newest still there unless two saves passed meanwhile.
KEEP_MANIFESTS = 3
_MANIFEST_KEY = re.compile(r"^_manifests/(\d{20})\.json$")


class StagingFencedError(PipelineError):
    """Another loader saved the staging manifest since this one read it: two loads of one table at once."""


class Staging:
    """Staged chunk output and the manifest of one table's full load.

    :param root: the staging location (a local directory, or ``s3://bucket/prefix``).
    :param storage: its storage (default: :func:`~exactly_once_provider.storage.open_storage` of ``root``).
    """

    def __init__(self, root: str, storage: Storage | None = None) -> None:
        self.storage = storage or open_storage(root)
        # A local root stays a Path: the full load's executors write into data_dir, its publish renames from it.
        self.root = self.storage.uri() if is_s3(root) else Path(root.removeprefix("file://"))
        self._sequence: int | None = None  # the sequence of the manifest this object read or saved last

    def _sequences(self) -> list[int]:
        return sorted(int(m.group(1)) for key in self.storage.list(MANIFESTS) if (m := _MANIFEST_KEY.match(key)))

    def load(self) -> dict | None:
        """Return the newest manifest, or None when no load is in progress."""
        for _ in range(5):
            sequences = self._sequences()
            if not sequences:
                legacy = self.storage.read(LEGACY_MANIFEST)
                self._sequence = -1 if legacy is not None else None
                return json.loads(legacy) if legacy is not None else None
            data = self.storage.read(_key(sequences[-1]))
            if data is not None:
                self._sequence = sequences[-1]
                return json.loads(data)
            # deleted by a newer save between the listing and the read: look again
        raise PipelineError(
            f"The staging manifests of {self.root} kept disappearing while being read: is "
            "another full load of this table running?"
        )

    def save(self, manifest: dict) -> None:
        """Publish ``manifest`` as the next numbered manifest (put-if-absent): whole or not at all.

        :raises StagingFencedError: another loader saved a manifest since this object's last load or save.
        """
        sequence = 0 if self._sequence is None else self._sequence + 1
        if not self.storage.put_if_absent(_key(sequence), json.dumps(manifest, sort_keys=True).encode()):
            raise StagingFencedError(
                f"Staging manifest {sequence} of {self.root} was saved by another loader: two full loads of "
                f"{manifest.get('schema')}.{manifest.get('table')} run at once. This one recorded nothing; stop "
                "the other one, then rerun (the load resumes from the staged chunks)."
            )
        self._sequence = sequence
        if sequence - KEEP_MANIFESTS >= 0:
            self.storage.delete(_key(sequence - KEEP_MANIFESTS))
        if sequence == 0:
            self.storage.delete(LEGACY_MANIFEST)  # superseded: the numbered manifests are read from now on

    @property
    def data_dir(self) -> Path | str:
        """The directory the executors write the chunk files into (a Path, or an ``s3://`` URI)."""
        return self.root / "data" if isinstance(self.root, Path) else self.storage.uri("data")

    def remove_unlisted_files(self, manifest: dict) -> list[str]:
        """Delete staged files no manifest entry refers to (a crashed or retried task's); return their names."""
        listed = {entry["data"] for entry in manifest["done"].values()}
        keys = self.storage.list("data/")
        removed = sorted({key.removeprefix("data/").split("/", 1)[0] for key in keys} - listed)
        for name in removed:
            if f"data/{name}" in keys:
                self.storage.delete(f"data/{name}")
            else:  # a folder of files
                self.storage.delete_prefix(f"data/{name}/")
        return removed

    def reset(self) -> None:
        """Forget any load in progress (a deliberate full reload)."""
        if isinstance(self.root, Path):
            shutil.rmtree(self.root, ignore_errors=True)
        else:
            self.storage.delete_prefix("")
        self._sequence = None


def _key(sequence: int) -> str:
    return f"{MANIFESTS}{sequence:020d}.json"
