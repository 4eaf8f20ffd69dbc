"""The one place identifiers are quoted for MySQL/MariaDB SQL.

Identifiers (schema, table, column names) cannot be bound as query parameters, so every statement that
names one builds it through :func:`quote_identifier`. Backticks inside a name are doubled, which is how
MySQL escapes them; a hostile name such as ``x`; DROP TABLE y; --`` stays one identifier.

Values are bound as parameters wherever the client can bind them. The one reader that cannot (the native
Arrow reader of the full load, :mod:`exactly_once_provider.source.native_reader`) writes its chunk bounds with
:func:`sql_literal`, which never puts a value's text between quotes unescaped: strings and bytes travel as
hex literals.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from typing import Any


def quote_identifier(name: str) -> str:
    """Return ``name`` as a backtick-quoted identifier.

    :param name: a schema, table or column name, exactly as stored by the server.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"An identifier must be a non-empty string, got {name!r}.")
    if "\x00" in name:
        raise ValueError(f"Identifier {name!r} contains a NUL character, which MySQL does not allow.")
    return "`" + name.replace("`", "``") + "`"


def quote_table(schema: str, table: str) -> str:
    """Return the quoted, schema-qualified name ```schema`.`table```.

    :param schema: the database (schema) name.
    :param table: the table name.
    """
    return f"{quote_identifier(schema)}.{quote_identifier(table)}"


def sql_literal(value: Any) -> str:
    """Return ``value`` as a SQL literal that compares with a key column exactly like the bound parameter would.

    Strings become ``_utf8mb4 X'<hex>'`` (a character string in the connection's character set, compared in the
    column's collation, as a bound string is); bytes ``X'<hex>'``; numbers, dates, datetimes and times their
    exact text. Only chunk-key value types are accepted.

    :param value: an int, Decimal, finite float, str, bytes, date, naive datetime or timedelta.
    """
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{value!r} is not a key value a chunk bound can hold.")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, decimal.Decimal) and value.is_finite():
        return format(value, "f")
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        return "_utf8mb4 X'" + value.encode("utf-8").hex() + "'"
    if isinstance(value, (bytes, bytearray)):
        return "X'" + bytes(value).hex() + "'"
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return "'" + value.isoformat(sep=" ") + "'"
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return "'" + value.isoformat() + "'"
    if isinstance(value, dt.timedelta):
        micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
        sign, micros = ("-" if micros < 0 else ""), abs(micros)
        seconds, fraction = divmod(micros, 1_000_000)
        return f"'{sign}{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}.{fraction:06d}'"
    raise ValueError(f"Key value {value!r} of type {type(value).__name__} cannot be written as a SQL literal.")
