"""The key a reconciliation bisects: a single integer key itself, or a 60-bit hash of any other key.

The engine (:mod:`.engine`) bisects one integer. A table whose primary key is one integer column is bisected on
that column: the source answers ranges through its index. Any other key — text, several columns, a DECIMAL or
a date — is bisected on the 60-bit hash of its columns' canonical texts (the row hash of
:mod:`.canonical`, over the key columns only): every engine computes it identically, and hashes spread evenly,
so bisection works the same. The price: a range of hashes is not an index range, so the source answers each
bisection level with a scan of the table instead of index lookups. Differences are reported by hash and named
by the key's text (``label``), e.g. ``"EU, 42"``.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from exactly_once_provider.full_load.columns import Column
from exactly_once_provider.reconcile.canonical import Dialect, kind_of, python_row_hash, python_text

LABEL_SEPARATOR = ", "
# Hashes spread keys evenly over [0, 2**60): a leaf segment this wide holds about rows / 2**16 keys (15 of a
# million), so a bisection reaches its leaves after 3 levels instead of the 12 that leaf_width=16 would take.
HASHED_LEAF_WIDTH = 2**44


@dataclass(frozen=True)
class Key:
    """The key columns of a reconciliation, in key order."""

    columns: tuple[Column, ...]

    def __post_init__(self) -> None:
        if not self.columns:
            raise ValueError("A reconciliation needs a key: the table's primary key or key_column.")
        for column in self.columns:
            kind_of(column)  # refuses a key without one canonical text (FLOAT/DOUBLE/JSON/TIME), naming it

    @classmethod
    def of(cls, columns: Column | Sequence[Column]) -> Key:
        """Return the key of one column or of several."""
        return cls((columns,) if isinstance(columns, Column) else tuple(columns))

    @property
    def hashed(self) -> bool:
        """Whether the engine bisects the key's hash (anything but a single integer column)."""
        return len(self.columns) > 1 or kind_of(self.columns[0]) != "integer"

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def expression(self, dialect: Dialect, sink_name: str | None = None) -> str:
        """Return the integer the engine bisects, as an SQL expression of ``dialect``.

        :param dialect: the engine.
        :param sink_name: a single integer key's column name on this side, if it differs from the source's.
        """
        if not self.hashed:
            name = dialect.quote(sink_name or self.columns[0].name)
            return f"CAST({name} AS BIGINT)" if dialect.name == "spark" else name
        if sink_name and sink_name != self.columns[0].name:
            raise ValueError(
                "A sink key column of another name (sink_key_column) works for a single integer key "
                "only; name the sink's key columns like the source's."
            )
        return dialect.row_hash([dialect.canonical(dialect.quote(c.name), c) for c in self.columns])

    def label_expression(self, dialect: Dialect) -> str | None:
        """Return the key's text (its canonical texts joined by unit separators) as SQL, None for an integer key."""
        if not self.hashed:
            return None
        return dialect.row_text([dialect.canonical(dialect.quote(c.name), c) for c in self.columns])

    def of_values(self, values: Sequence[Any]) -> int:
        """Return the bisected integer of one row's key values (as Arrow or a DB-API driver hands them back)."""
        if not self.hashed:
            return int(values[0])
        return python_row_hash(values, list(self.columns))

    def label(self, values: Sequence[Any]) -> str:
        """Return the key's text for a report, e.g. ``EU, 42``."""
        return LABEL_SEPARATOR.join(python_text(v, c) for v, c in zip(values, self.columns, strict=True))

    def of_record_key(self, record_key: dict[str, Any]) -> int:
        """Return the bisected integer of a change record's JSON key (``{"region": "EU", "id": 42}``).

        :raises KeyError: a key column is missing.
        """
        return self.of_values([from_json(record_key[c.name], c) for c in self.columns])


def from_json(value: Any, column: Column) -> Any:
    """Return a change record's JSON value as the Python value :func:`canonical.python_text` takes.

    The capture writes DECIMAL as exact strings, DATETIME/TIMESTAMP as ISO text (``Z`` = UTC), DATE as ISO,
    binary as base64 (:mod:`exactly_once_provider.capture.change_record`).
    """
    if value is None:
        return None
    kind = kind_of(column)
    if kind == "integer":
        return int(value)
    if kind == "decimal":
        return Decimal(str(value))
    if kind == "datetime":
        return dt.datetime.fromisoformat(value)
    if kind == "date":
        return dt.date.fromisoformat(value)
    if kind == "binary":
        return base64.b64decode(value)
    return value
