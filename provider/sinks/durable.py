"""Durability on local file systems: what must be on disk before a rename, link or commit is relied on."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: str | Path) -> None:
    """Flush a directory's entries to disk, so a file created, renamed or linked in it survives a crash.

    :param path: the directory.
    """
    handle = os.open(path, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
