"""Source column types -> Spark/Arrow types, and Python values -> Arrow arrays.

Mapping choices (all reversible to the source value):
DECIMAL(p<=38) -> decimal(p,s), wider DECIMAL -> string; BIGINT UNSIGNED -> decimal(20,0); INT UNSIGNED ->
bigint; DATETIME -> timestamp_ntz (wall-clock, no zone); TIMESTAMP -> timestamp (read in a UTC session);
TIME -> string ``[-]HH:MM:SS[.ffffff]``; JSON/TEXT/ENUM/SET -> string; BLOB/BINARY/BIT -> binary.
"""

from __future__ import annotations

import datetime as dt
import decimal
from dataclasses import asdict, dataclass
from typing import Any

import MySQLdb.converters
import pyarrow as pa
import pyarrow.compute as pc
from MySQLdb.constants import FIELD_TYPE

from exactly_once_provider.hooks.mysql_identifiers import quote_table

_TEXT = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "json", "enum", "set"}
_BINARY = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "bit"}


@dataclass(frozen=True)
class Column:
    """A source column as ``information_schema.COLUMNS`` describes it."""

    name: str
    data_type: str
    column_type: str
    precision: int | None
    scale: int | None

    @property
    def unsigned(self) -> bool:
        return "unsigned" in self.column_type.lower()

    def to_json(self) -> dict:
        return asdict(self)


def table_columns(cur: Any, schema: str, table: str) -> list[Column]:
    """Return the table's columns in ordinal order.

    :param cur: an open cursor.
    :param schema: the database name.
    :param table: the table name.
    """
    cur.execute(
        "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, NUMERIC_PRECISION, NUMERIC_SCALE FROM information_schema.COLUMNS"
        " WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
        (schema, table),
    )
    columns = [Column(str(n), str(d).lower(), str(c), p and int(p), s and int(s)) for n, d, c, p, s in cur.fetchall()]
    if not columns:
        raise ValueError(f"Table {quote_table(schema, table)} has no visible columns; check its name and privileges.")
    return columns


def arrow_type(column: Column) -> pa.DataType:
    """Return the Arrow type a column is loaded as."""
    t = column.data_type
    if t in ("tinyint", "smallint", "mediumint", "year"):
        return pa.int32()
    if t == "int":
        return pa.int64() if column.unsigned else pa.int32()
    if t == "bigint":
        return pa.decimal128(20, 0) if column.unsigned else pa.int64()
    if t == "float":
        return pa.float32()
    if t == "double":
        return pa.float64()
    if t == "decimal":
        precision, scale = column.precision or 10, column.scale or 0
        return pa.decimal128(precision, scale) if precision <= 38 else pa.string()
    if t == "datetime":
        return pa.timestamp("us")
    if t == "timestamp":
        return pa.timestamp("us", tz="UTC")
    if t == "date":
        return pa.date32()
    if t in _BINARY:
        return pa.binary()
    if t in _TEXT or t == "time":
        return pa.string()
    raise ValueError(f"Column {column.name!r} has type {column.column_type!r}, which the full load does not map.")


def _time_text(value: dt.timedelta) -> str:
    micros = value.days * 86_400_000_000 + value.seconds * 1_000_000 + value.microseconds
    sign, micros = ("-" if micros < 0 else ""), abs(micros)
    seconds, fraction = divmod(micros, 1_000_000)
    text = f"{sign}{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    return text + (f".{fraction:06d}" if fraction else "")


def _converter(column: Column, target: pa.DataType):
    """Return a per-value conversion for the types Arrow does not take as MySQLdb returns them."""
    if column.data_type == "time":
        return lambda v: None if v is None else _time_text(v)
    if pa.types.is_decimal(target) and column.data_type == "bigint":
        return lambda v: None if v is None else decimal.Decimal(v)
    if pa.types.is_string(target) and column.data_type == "decimal":
        return lambda v: None if v is None else str(v)
    # Text and binary columns need none: pa.array takes str or bytes for both (UTF-8 checked, str encoded).
    if column.data_type == "timestamp":  # naive UTC from the +00:00 session
        return lambda v: None if v is None else v.replace(tzinfo=dt.timezone.utc)
    return None


# Types the reader receives as the server's text (see raw_conversions) and Arrow parses in bulk: creating a
# Python Decimal/datetime per value costs more than the whole rest of the read.
_PARSED_IN_ARROW = {"decimal", "datetime", "timestamp", "date"}


def raw_conversions() -> dict:
    """Return MySQLdb conversions that leave DECIMAL, DATE, DATETIME and TIMESTAMP as bytes for Arrow to parse."""
    conversions = dict(MySQLdb.converters.conversions)
    for field_type in (FIELD_TYPE.DECIMAL, FIELD_TYPE.NEWDECIMAL, FIELD_TYPE.DATE, FIELD_TYPE.DATETIME,
                       FIELD_TYPE.TIMESTAMP):
        conversions.pop(field_type, None)
    return conversions


def _parse(column: Column, values: tuple | pa.Array, target: pa.DataType) -> pa.Array:
    raw = values if isinstance(values, pa.Array) else pa.array(values, pa.binary())
    text = raw.cast(pa.string())
    if pa.types.is_string(target):
        return text
    try:
        if pa.types.is_timestamp(target) and target.tz:
            return pc.cast(text, pa.timestamp(target.unit)).cast(target)  # read in a '+00:00' session
        return pc.cast(text, target)
    except pa.ArrowInvalid as error:
        raise ValueError(
            f"Column {column.name!r} ({column.column_type}) holds a value Arrow cannot represent as {target} "
            f"({error}); zero dates such as '0000-00-00' have no equivalent: fix or NULL them in the source."
        ) from None


def to_arrays(columns: list[Column], rows: list[tuple], raw: bool = False) -> list[pa.Array]:
    """Turn a batch of result rows into one Arrow array per column.

    :param columns: the columns, in row order.
    :param rows: the batch of result rows.
    :param raw: rows were read with :func:`raw_conversions` (text for the types Arrow parses).
    """
    parsed = [raw and c.data_type in _PARSED_IN_ARROW for c in columns]
    targets = [arrow_type(c) for c in columns]
    converters = [None if p else _converter(c, t) for c, t, p in zip(columns, targets, parsed)]
    if rows and all(convert is None for convert in converters):
        # Arrow reads the row tuples as one struct array in C: no per-column transpose of Python objects.
        inputs = pa.struct([pa.field(str(i), pa.binary() if p else t) for i, (t, p) in enumerate(zip(targets, parsed))])
        children = pa.array(rows, type=inputs).flatten()
        return [_parse(c, a, t) if p else a for c, a, t, p in zip(columns, children, targets, parsed)]
    arrays = []
    for column, values, target, is_parsed, convert in zip(
            columns, zip(*rows) if rows else [()] * len(columns), targets, parsed, converters):
        if is_parsed:
            arrays.append(_parse(column, values, target))
            continue
        if convert is not None:
            values = [convert(v) for v in values]
        arrays.append(pa.array(values, type=target))
    return arrays
