"""Binlog positions: the version every change carries and the resume point every reader stores."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_BINLOG_INDEX = re.compile(r"\.(\d+)$")


@dataclass(frozen=True, order=False)
class BinlogPosition:
    """A position in the server's binary log: ``file`` (e.g. ``binlog.000042``) and byte offset ``pos``.

    Positions order by the numeric suffix of the file name, then by offset, so they can be compared
    across log rotations (``binlog.000009`` < ``binlog.000010``).
    """

    file: str
    pos: int

    def __post_init__(self) -> None:
        if not _BINLOG_INDEX.search(self.file):
            raise ValueError(f"Binlog file name {self.file!r} has no numeric suffix like '.000001'.")
        if self.pos < 0:
            raise ValueError(f"Binlog position must be >= 0, got {self.pos}.")

    @property
    def sort_key(self) -> tuple[int, int]:
        """Return ``(file index, offset)``, the total order of positions on one server."""
        match = _BINLOG_INDEX.search(self.file)
        assert match is not None  # checked in __post_init__
        return int(match.group(1)), self.pos

    def __lt__(self, other: BinlogPosition) -> bool:
        return self.sort_key < other.sort_key

    def __le__(self, other: BinlogPosition) -> bool:
        return self.sort_key <= other.sort_key

    def __gt__(self, other: BinlogPosition) -> bool:
        return self.sort_key > other.sort_key

    def __ge__(self, other: BinlogPosition) -> bool:
        return self.sort_key >= other.sort_key

    def __str__(self) -> str:
        return f"{self.file}:{self.pos}"


def position_from_offset(offset: Any) -> BinlogPosition:
    """Return the binlog position stored in a capture's offsets-ledger ``offset``.

    Accepts ``{"file": f, "pos": p}`` (also ``log_file``/``log_pos``, ``binlog_file``/``binlog_pos``, or
    nested under ``"position"``) and ``"file:pos"``.

    :param offset: the ``offset`` field of the ledger record.
    """
    if isinstance(offset, str) and ":" in offset:
        file, _, pos = offset.rpartition(":")
        return BinlogPosition(file, int(pos))
    if isinstance(offset, dict):
        if isinstance(offset.get("position"), (dict, str)):
            return position_from_offset(offset["position"])
        for file_key, pos_key in (("file", "pos"), ("log_file", "log_pos"), ("binlog_file", "binlog_pos")):
            if file_key in offset and pos_key in offset:
                return BinlogPosition(str(offset[file_key]), int(offset[pos_key]))
    raise ValueError(f"The capture's ledger offset {offset!r} holds no binlog position (file and pos).")
