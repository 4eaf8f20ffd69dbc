"""Source column types -> Spark/Arrow types, and the server's text -> Arrow arrays, parsed column-wise.

Mapping choices (all reversible to the source value):
DECIMAL(p<=38) -> decimal(p,s), wider DECIMAL -> string; BIGINT UNSIGNED -> decimal(20,0); INT UNSIGNED ->
bigint; DATETIME -> timestamp_ntz (wall-clock, no zone); TIMESTAMP -> timestamp (read in a UTC session);
TIME -> string ``[-]HH:MM:SS[.ffffff]``; JSON/TEXT/ENUM/SET -> string; BLOB/BINARY/BIT -> binary.

Two readers fill these types, value for value the same (tests/integration/provider/full_load/
test_spark_source.py): the native reader (:mod:`exactly_once_provider.source.native_reader`, columns selected with
:func:`native_select`, converted with :func:`from_native`) and the row reader (:func:`raw_conversions`,
:func:`to_arrays`). FLOAT is its stored 32-bit value in both.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import MySQLdb.converters
import pyarrow as pa
import pyarrow.compute as pc

from exactly_once_provider.source.identifiers import quote_identifier, quote_table

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


def is_binary(column: Column) -> bool:
    """Return whether the column is loaded as binary (and travels as base64 in change records)."""
    return column.data_type in _BINARY


def raw_conversions() -> dict:
    """Return MySQLdb conversions that turn no column value into a Python number, date or time.

    Every value arrives as the server's text (``bytes``; character columns as ``str``, binary ones as ``bytes``,
    as MySQLdb decodes them) and :func:`to_arrays` parses whole columns in Arrow: a Python ``int``,
    ``Decimal``, ``datetime`` or ``timedelta`` per value cost more than the rest of the read. Only the
    encoders of query parameters (keys that are Python types) are kept.
    """
    return {key: value for key, value in MySQLdb.converters.conversions.items() if not isinstance(key, int)}


_FRACTION_DIGITS = re.compile(r"^time\((\d)\)", re.IGNORECASE)


def _time_text(column: Column, text: pa.Array) -> pa.Array:
    """Normalise the server's TIME text to ``[-]HH:MM:SS[.ffffff]``: six fraction digits, none when zero.

    The server prints ``[-]HH[H]:MM:SS`` and exactly the column's fractional digits (``TIME(3)`` ->
    ``12:00:00.500``, ``12:00:00.000``); the load's form drops a zero fraction, pads the others to
    microseconds and never signs a zero.
    """
    match = _FRACTION_DIGITS.match(column.column_type)
    digits = int(match.group(1)) if match else 0
    if digits:
        text = pc.replace_substring_regex(text, r"\.0+$", "")
        if digits < 6:
            text = pc.replace_substring_regex(text, r"(\.\d+)$", r"\1" + "0" * (6 - digits))
    return pc.replace_substring_regex(text, r"^-(00:00:00)$", r"\1")


def _parse(column: Column, text: pa.Array, target: pa.DataType) -> pa.Array:
    """Turn one column of server text into ``target`` exactly as the server meant it."""
    t = column.data_type
    try:
        if t == "time":
            return _time_text(column, text)
        if pa.types.is_string(target):  # DECIMAL wider than 38 digits: its exact text
            return text
        if t == "float":  # the exact DOUBLE text of the stored FLOAT (row_select): exact in float64, then float32
            return pc.cast(pc.cast(text, pa.float64()), pa.float32())
        if pa.types.is_timestamp(target) and target.tz:
            return pc.cast(text, pa.timestamp(target.unit)).cast(target)  # read in a '+00:00' session
        return pc.cast(text, target)
    except pa.ArrowInvalid as error:
        raise ValueError(
            f"Column {column.name!r} ({column.column_type}) holds a value Arrow cannot represent as {target} "
            f"({error}); zero dates such as '0000-00-00' have no equivalent: fix or NULL them in the source."
        ) from None


def _passes_through(column: Column) -> bool:
    """Whether the column's values arrive as they are loaded (``str`` for text, ``bytes`` for binary)."""
    return column.data_type in _TEXT or column.data_type in _BINARY


def to_arrays(columns: list[Column], rows: list[tuple]) -> list[pa.Array]:
    """Turn a batch of result rows read with :func:`raw_conversions` into one Arrow array per column.

    Arrow reads the row tuples as one struct array in C (no per-value Python work); the columns that
    arrived as text (numbers, dates, times) are then parsed column-wise by Arrow's casts.

    :param columns: the columns, in row order.
    :param rows: the batch of result rows.
    """
    targets = [arrow_type(c) for c in columns]
    # Text to parse is read as binary and checked as UTF-8 by one cast per column: pa.string() would check
    # each value as Arrow reads it, measured 0.34-0.56 s against 0.21 s per 1M rows of the benchmark table.
    inputs = [t if _passes_through(c) else pa.binary() for c, t in zip(columns, targets)]
    if not rows:
        return [pa.array([], type=t) for t in targets]
    struct = pa.array(rows, type=pa.struct([pa.field(str(i), t) for i, t in enumerate(inputs)]))
    return [
        a if _passes_through(c) else _parse(c, a.cast(pa.string()), t)
        for c, a, t in zip(columns, struct.flatten(), targets)
    ]


def row_select(column: Column) -> str:
    """Return the SQL expression the row reader selects ``column`` with.

    FLOAT is widened to DOUBLE by the server: the text of a FLOAT keeps 6 significant digits, not always enough
    to give back the stored 32 bits; the DOUBLE's text always does.
    """
    name = quote_identifier(column.name)
    return f"CAST({name} AS DOUBLE) AS {name}" if column.data_type == "float" else name


# connectorx reads DECIMAL as decimal128(38,10) (wrong past 10 fraction digits, refused past 38 digits) and
# refuses negative TIME: the native reader has the server send those as text and parses it like the row reader.
# A DECIMAL of up to 18 digits travels as its unscaled BIGINT instead (exact: an integer below 10**18), which
# Arrow reinterprets with the column's scale: parsing the text cost ~0.75 CPU-s per 10M values.
_NATIVE_AS_TEXT = {"decimal", "time"}
_UNSCALED_DIGITS = 18


def _travels_unscaled(column: Column) -> bool:
    return column.data_type == "decimal" and (column.precision or 10) <= _UNSCALED_DIGITS


def native_select(column: Column) -> str:
    """Return the SQL expression the native reader selects ``column`` with."""
    name = quote_identifier(column.name)
    if _travels_unscaled(column):
        scaled = f"{name} * {10**column.scale}" if column.scale else name
        return f"CAST({scaled} AS SIGNED) AS {name}"
    return f"CAST({name} AS CHAR) AS {name}" if column.data_type in _NATIVE_AS_TEXT else name


def _from_unscaled(column: Column, array: pa.Array, target: pa.DataType) -> pa.Array:
    """Return the BIGINT unscaled values of a DECIMAL(p <= 18, s) column as ``target`` (decimal128(p, s))."""
    ints = array.cast(pa.int64())
    bounds = pc.min_max(ints)
    limit = 10**target.precision
    if bounds["min"].is_valid and not (-limit < bounds["min"].as_py() and bounds["max"].as_py() < limit):
        raise pa.ArrowInvalid(
            f"Column {column.name!r} ({column.column_type}) read an unscaled value outside "
            f"{target.precision} digits ({bounds['min']} .. {bounds['max']})."
        )
    # decimal128(19, 0) holds the same 128-bit integers as decimal128(p, s) does: only the scale is read anew.
    wide = ints.cast(pa.decimal128(19, 0))
    return pa.Array.from_buffers(target, len(wide), wide.buffers(), null_count=wide.null_count, offset=wide.offset)


def from_native(column: Column, array: pa.Array) -> pa.Array:
    """Return connectorx's array of ``column`` (selected with :func:`native_select`) as the loaded Arrow type.

    connectorx gives each integer its own width and sign (int8 ... uint64), binary as large_binary, DATETIME
    and TIMESTAMP (a UTC session) as timestamp[us]: each is cast safely to :func:`arrow_type`, so a value
    that does not fit raises instead of changing.
    """
    target = arrow_type(column)
    if _travels_unscaled(column):
        return _from_unscaled(column, array, target)
    if column.data_type in _NATIVE_AS_TEXT:
        return _parse(column, array.cast(pa.string()), target)
    return array if array.type == target else array.cast(target)
