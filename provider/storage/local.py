"""Local (POSIX) storage: put-if-absent is a fsynced temporary file hard-linked to its name."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from exactly_once_provider.storage.durable import put_if_absent, replace


class LocalStorage:
    """Objects as files under a directory (keys are relative paths).

    :param root: the directory (created on the first write).
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in Path(key).parts:
            raise ValueError(f"A storage key is relative and stays below its root, got {key!r}.")
        return self.root / key

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return put_if_absent(self._path(key), data)

    def put(self, key: str, data: bytes) -> None:
        replace(self._path(key), data)

    def read(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        # Walk only the deepest directory the prefix names, then filter by the rest of it (like S3's prefix).
        head = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self._path(head) if head else self.root
        if not start.is_dir():
            return []
        keys = []
        for directory, _dirs, files in os.walk(start):
            for name in files:
                key = (Path(directory) / name).relative_to(self.root).as_posix()
                # put_if_absent's temporary files (".<name>.<hex>.tmp") are never objects
                if (
                    key.startswith(prefix)
                    and not (name.startswith(".") and name.endswith(".tmp"))
                    and (start_after is None or key > start_after)
                ):
                    keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def delete_prefix(self, prefix: str) -> None:
        for key in self.list(prefix):
            self.delete(key)
        if prefix.endswith("/"):  # a directory's worth: remove the emptied directories too
            shutil.rmtree(self._path(prefix.rstrip("/")), ignore_errors=True)

    def arrow_path(self, key: str) -> tuple[Any, str]:
        from pyarrow import fs

        return fs.LocalFileSystem(), str(self._path(key))

    def uri(self, key: str = "") -> str:
        return str(self._path(key)) if key else str(self.root)

    spark_uri = uri

    def __repr__(self) -> str:
        return f"LocalStorage({str(self.root)!r})"
