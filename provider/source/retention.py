"""Binlog retention headroom: how far the capture's committed position is from what the server still keeps.

The server purges the oldest binlog files (``binlog_expire_logs_seconds``, ``PURGE BINARY LOGS``). If the
file holding the capture's committed position is purged, the capture cannot resume and the pipeline needs a
new full load. The guard compares that position with ``SHOW BINARY LOGS``:

* ``purged``: the file is gone -> fail, and ask for a ``full_reload`` run (never skip silently);
* ``files_before_purge``: how many retained files are older than the committed one; the committed file is
  the next to go when this is 0 -> warn below ``warn_files``;
* ``bytes_behind``: binlog bytes written after the committed position, i.e. what the capture still has to
  read -> warn above ``warn_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass

from exactly_once_provider.positions import BinlogPosition


@dataclass(frozen=True)
class Headroom:
    """Where the committed position stands in the server's retained binlog files."""

    position: BinlogPosition
    oldest_file: str | None
    newest_file: str | None
    purged: bool
    files_before_purge: int
    bytes_behind: int

    def warnings(self, warn_files: int, warn_bytes: int) -> list[str]:
        """Return human-readable warnings for the thresholds (empty when there is headroom)."""
        found = []
        if self.files_before_purge < warn_files:
            found.append(
                f"the capture's binlog file {self.position.file} has only {self.files_before_purge} older file(s) "
                f"before it in the server's retention (oldest {self.oldest_file}): it is purged next; let the "
                "capture catch up or raise binlog_expire_logs_seconds"
            )
        if self.bytes_behind > warn_bytes:
            found.append(
                f"the capture is {self.bytes_behind} binlog bytes behind the server's end "
                f"({self.newest_file}), above {warn_bytes}"
            )
        return found

    def to_json(self) -> dict:
        return {
            "position": str(self.position),
            "oldest_file": self.oldest_file,
            "newest_file": self.newest_file,
            "purged": self.purged,
            "files_before_purge": self.files_before_purge,
            "bytes_behind": self.bytes_behind,
        }


def headroom(position: BinlogPosition, logs: list[tuple[str, int]]) -> Headroom:
    """Return the headroom of ``position`` among the retained binlog files ``logs`` (``SHOW BINARY LOGS``).

    :param position: the capture's committed position.
    :param logs: ``(file, size)`` of the retained files.
    """
    ordered = sorted(logs, key=lambda item: BinlogPosition(item[0], 0).sort_key)
    names = [name for name, _ in ordered]
    oldest, newest = (names[0], names[-1]) if names else (None, None)
    if position.file not in names:
        return Headroom(position, oldest, newest, True, 0, 0)
    index = names.index(position.file)
    behind = max(0, ordered[index][1] - position.pos) + sum(size for _, size in ordered[index + 1 :])
    return Headroom(position, oldest, newest, False, index, behind)
