"""Durable writes on local file systems: the one primitive every local commit is built on.

:func:`put_if_absent` is the commit step of every local sink commit: the files sink's manifest, a Delta log
commit written by this provider (:mod:`~exactly_once_provider.sinks.delta_commit`) and the full load's
published table. :func:`replace` is its unconditional sibling for a single progress file that is overwritten
(the full load's staging manifest). Both write the bytes under a temporary name in the same directory and
fsync them first, so a reader never sees a partial file and a crash never leaves a name pointing at bytes that
were not on disk; after the link or rename the directory is fsynced, so the new name survives a crash too.

On object stores the same contract is a conditional PUT (``If-None-Match: *``); callers only rely on "created
whole, or not at all, and False if the name was taken".
"""

from __future__ import annotations

import os
import uuid
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


def _write_temp(path: Path, data: bytes) -> Path:
    """Write ``data`` fsynced to a new temporary file next to ``path`` (a unique name: writers never share it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    return tmp


def put_if_absent(path: str | Path, data: bytes) -> bool:
    """Create ``path`` holding ``data``, atomically and durably; return False (writing nothing) if it exists.

    The bytes are written and fsynced under a temporary name, then hard-linked to ``path``: ``link()`` fails
    if the name exists, so of two writers of the same name exactly one wins (the compare-and-set every local
    commit relies on), and a reader sees the whole file or none. The directory is fsynced after the link.

    :param path: the file to create (its directory is created if missing).
    :param data: the file's content.
    """
    path = Path(path)
    tmp = _write_temp(path, data)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        tmp.unlink()
    fsync_dir(path.parent)
    return True


def replace(path: str | Path, data: bytes) -> None:
    """Replace (or create) ``path`` with ``data`` atomically and durably: a crash leaves the old or the new file.

    :param path: the file to write (its directory is created if missing).
    :param data: the file's content.
    """
    path = Path(path)
    tmp = _write_temp(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
