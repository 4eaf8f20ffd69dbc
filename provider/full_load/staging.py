"""The staging area of a full load: per-wave staged chunk files and the chunk manifest.

Lives next to the sink (``<sink>._eo_full_load`` by default), never inside it, so nothing is visible in the
sink before the publish. The manifest is the load's progress marker: it is replaced atomically
(write + fsync + rename) only after the staged files it lists are committed by Spark.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path


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
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".manifest.{os.getpid()}.tmp"
        with open(tmp, "w") as handle:
            json.dump(manifest, handle, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.manifest_path)
        directory = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def wave_path(self, wave: str) -> str:
        """Return the directory a wave of chunks is staged into."""
        return str(self.root / "waves" / wave)

    def remove_unlisted_waves(self, manifest: dict) -> list[str]:
        """Delete wave directories no manifest entry refers to (left by a crash); return their names."""
        listed = {entry["wave"] for entry in manifest["done"].values()}
        waves = self.root / "waves"
        removed = [p.name for p in waves.iterdir() if p.name not in listed] if waves.is_dir() else []
        for name in removed:
            shutil.rmtree(waves / name)
        return removed

    def reset(self) -> None:
        """Forget any load in progress (a deliberate full reload)."""
        shutil.rmtree(self.root, ignore_errors=True)
