"""One canonical text per value, rendered identically by MariaDB, PostgreSQL, Spark SQL and Python (delta-rs reads).

A row's hash is ``md5`` over its columns' canonical texts joined by the unit separator (``chr(31)``), cut
to its first 15 hex digits (60 bits) so that sums of hashes stay exact on all three engines (DECIMAL in
MariaDB, numeric in PostgreSQL, decimal(38,0) in Spark). The canonical form is chosen by the SOURCE column
type, so a sink that stores a value differently (a JSON string, a Spark timestamp) is cast to it first:

==================  ======================================================
source type         canonical text
==================  ======================================================
integers, YEAR      decimal digits (``-12``)
DECIMAL(p, s)       fixed scale ``s`` (``12.50``)
DATETIME/TIMESTAMP  ``YYYY-MM-DD HH:MM:SS.ffffff`` (UTC for TIMESTAMP)
DATE                ``YYYY-MM-DD``
BLOB/BINARY/BIT     lower-case hex
text, ENUM, SET     the text itself
NULL                ``\\N`` (so ``(NULL, 'a')`` and ``('a', NULL)`` differ)
==================  ======================================================

FLOAT/DOUBLE, JSON and TIME columns are refused: their text forms differ between engines (list the other
columns in ``columns`` to compare without them).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from exactly_once_provider.full_load.columns import Column

INTEGER_TYPES = {"tinyint", "smallint", "mediumint", "int", "bigint", "year"}
DECIMAL_TYPES = {"decimal", "numeric"}
TIME_TYPES = {"datetime", "timestamp"}
BINARY_TYPES = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "bit"}
TEXT_TYPES = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"}
NULL_TEXT = "\\N"
HASH_HEX_DIGITS = 15


def kind_of(column: Column) -> str:
    """Return the canonical kind of a source column, or raise ``ValueError`` for one that cannot be compared."""
    t = column.data_type
    if t in INTEGER_TYPES:
        return "integer"
    if t in DECIMAL_TYPES:
        return "decimal"
    if t in TIME_TYPES:
        return "datetime"
    if t == "date":
        return "date"
    if t in BINARY_TYPES:
        return "binary"
    if t in TEXT_TYPES:
        return "text"
    raise ValueError(
        f"Column {column.name!r} has type {column.column_type}, whose text form differs between MariaDB, "
        "PostgreSQL and Spark (FLOAT/DOUBLE/JSON/TIME); leave it out of `columns` to reconcile the others."
    )


def _bit_bytes(column: Column) -> int:
    """Return the bytes a ``BIT(M)`` value takes as binary (the full load's and every sink's form): ceil(M / 8)."""
    found = re.search(r"\((\d+)\)", column.column_type)
    return (int(found.group(1)) + 7) // 8 if found else 1


@dataclass(frozen=True)
class Dialect:
    """How one engine renders a column's canonical text and the row hash."""

    name: str

    def quote(self, identifier: str) -> str:
        if self.name == "mariadb":
            return "`" + identifier.replace("`", "``") + "`"
        if self.name == "postgres":
            return '"' + identifier.replace('"', '""') + '"'
        return "`" + identifier.replace("`", "``") + "`"  # Spark SQL

    def canonical(self, expr: str, column: Column, from_text: bool = False, binary_encoding: str = "hex") -> str:
        """Return the canonical text of ``expr`` (a column, or its text when ``from_text``, e.g. JSON).

        ``binary_encoding`` says how JSON text carries binary values: ``hex`` (watermark records) or
        ``base64`` (binlog change records).
        """
        kind = kind_of(column)
        scale = column.scale or 0
        m, p = self.name == "mariadb", self.name == "postgres"  # otherwise Spark SQL
        if kind == "integer":
            if p:
                value = f"({expr})::numeric(20,0)" if from_text else expr
                return f"({value})::text"
            return f"CAST(CAST({expr} AS DECIMAL(20,0)) AS {'CHAR' if m else 'STRING'})"
        if kind == "decimal":
            if p:
                return f"(({expr})::numeric(65,{scale}))::text"
            return f"CAST(CAST({expr} AS DECIMAL({65 if m else 38},{scale})) AS {'CHAR' if m else 'STRING'})"
        if kind == "datetime":
            if m:
                return f"DATE_FORMAT({expr}, '%Y-%m-%d %H:%i:%s.%f')"
            if p:
                value = f"({expr})::timestamp" if from_text else expr
                return f"to_char({value}, 'YYYY-MM-DD HH24:MI:SS.US')"
            value = f"CAST({expr} AS TIMESTAMP)" if from_text else expr
            return f"date_format({value}, 'yyyy-MM-dd HH:mm:ss.SSSSSS')"
        if kind == "date":
            if m:
                return f"DATE_FORMAT({expr}, '%Y-%m-%d')"
            if p:
                return f"to_char(({expr})::date, 'YYYY-MM-DD')"
            return f"date_format(CAST({expr} AS DATE), 'yyyy-MM-dd')"
        if kind == "binary":
            if from_text and binary_encoding == "hex":
                return f"lower({expr})"
            if from_text:  # base64 text (the binlog capture's change records)
                return f"encode(decode({expr}, 'base64'), 'hex')" if p else f"lower(hex(unbase64({expr})))"
            if m and column.data_type == "bit":  # HEX() renders a BIT as a number: b'\x01' is "1", not "01"
                return f"LOWER(LPAD(HEX({expr}), {2 * _bit_bytes(column)}, '0'))"
            if m:
                return f"LOWER(HEX({expr}))"
            if p:
                return f"encode({expr}, 'hex')"
            return f"lower(hex({expr}))"
        return f"CAST({expr} AS {'CHAR' if m else 'TEXT' if p else 'STRING'})" if not from_text else expr

    def row_text(self, parts: list[str]) -> str:
        """Join canonical texts (NULL -> ``\\N``) with the unit separator."""
        sep = "CHAR(31)" if self.name == "mariadb" else "chr(31)"
        null = "'\\\\N'" if self.name in ("mariadb", "spark") else "'\\N'"
        return f"CONCAT_WS({sep}, {', '.join(f'COALESCE({part}, {null})' for part in parts)})"

    def row_hash(self, parts: list[str]) -> str:
        """Return the 60-bit integer hash of a row (exact when summed)."""
        text = self.row_text(parts)
        if self.name == "mariadb":
            return f"CAST(CONV(LEFT(MD5({text}), {HASH_HEX_DIGITS}), 16, 10) AS UNSIGNED)"
        if self.name == "postgres":
            return f"(('x' || left(md5({text}), {HASH_HEX_DIGITS}))::bit({HASH_HEX_DIGITS * 4})::bigint)"
        return f"CAST(conv(substring(md5(CAST({text} AS BINARY)), 1, {HASH_HEX_DIGITS}), 16, 10) AS DECIMAL(20,0))"


MARIADB = Dialect("mariadb")
POSTGRES = Dialect("postgres")
SPARK = Dialect("spark")


def python_text(value: Any, column: Column) -> str:
    """Return the canonical text of a value as read from a sink with Arrow (the table above, in Python).

    ``value`` is what pyarrow hands back for the column's full-load type (:func:`~exactly_once_provider.full_load.
    columns.arrow_type`): int, bool, Decimal, datetime (aware: rendered in UTC), date, bytes or str.
    """
    if value is None:
        return NULL_TEXT
    kind = kind_of(column)
    if kind == "integer":
        return str(int(value))
    if kind == "decimal":
        return f"{Decimal(value):.{column.scale or 0}f}"
    if kind == "datetime":
        if value.tzinfo is not None:
            value = value.astimezone(UTC)
        return (
            f"{value.year:04d}-{value.month:02d}-{value.day:02d} "
            f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}.{value.microsecond:06d}"
        )
    if kind == "date":
        value = value.date() if isinstance(value, datetime) else value
        return f"{value.year:04d}-{value.month:02d}-{value.day:02d}" if isinstance(value, date) else str(value)
    if kind == "binary":
        return bytes(value).hex()
    return str(value)


def python_row_hash(values: Any, columns: list[Column]) -> int:
    """Return a row's 60-bit hash, equal to :meth:`Dialect.row_hash` of the same values on every engine."""
    text = chr(31).join(python_text(v, c) for v, c in zip(values, columns, strict=True))
    return int(hashlib.md5(text.encode("utf-8")).hexdigest()[:HASH_HEX_DIGITS], 16)
