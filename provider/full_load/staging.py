"""The staging area of a full load: one staged Parquet file per chunk, and the chunk manifest.

Lives next to the sink (``<sink>._eo_full_load`` by default), never inside it, so nothing is visible in the
sink before the publish. The manifest is the load's progress marker: it is replaced atomically
(write + fsync + rename) only after the staged files it lists were written and fsynced by the executors.
The publish of a new table moves the listed files into the sink directory (same filesystem: a rename) and
commits them there; nothing is copied.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from exactly_once_provider.sinks import durable


class Staging:
    """Staged chunk output and the manifest of one table's full load.

    :param root: the staging directory.
    """

    def __init__(self, root: str) -> None:
        self.root = Path(root.removeprefix("file://"))

    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"

    def load(self) -> dict | None:
        """Return the manifest, or None when no load is in progress."""
        if not self.manifest_path.exists():
            return None
        return json.loads(self.manifest_path.read_text())

    def save(self, manifest: dict) -> None:
        """Replace the manifest atomically: a crash leaves the old or the new one, never a torn file."""
        durable.replace(self.manifest_path, json.dumps(manifest, sort_keys=True).encode())

    @property
    def data_dir(self) -> Path:
        """The directory the executors write the chunk files into."""
        return self.root / "data"

    def remove_unlisted_files(self, manifest: dict) -> list[str]:
        """Delete staged files no manifest entry refers to (a crashed or retried task's); return their names."""
        listed = {entry["data"] for entry in manifest["done"].values()}
        found = os.listdir(self.data_dir) if self.data_dir.is_dir() else []
        removed = sorted(name for name in found if name not in listed)
        for name in removed:
            path = self.data_dir / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        return removed

    def reset(self) -> None:
        """Forget any load in progress (a deliberate full reload)."""
        shutil.rmtree(self.root, ignore_errors=True)
