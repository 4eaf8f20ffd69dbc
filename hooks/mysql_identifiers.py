"""The one place identifiers are quoted for MySQL/MariaDB SQL.

Identifiers (schema, table, column names) cannot be bound as query parameters, so every statement that
names one builds it through :func:`quote_identifier`. Backticks inside a name are doubled, which is how
MySQL escapes them; a hostile name such as ``x`; DROP TABLE y; --`` stays one identifier.
"""

from __future__ import annotations


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
