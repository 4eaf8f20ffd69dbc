"""Which tables of a schema a pipeline follows: names and shell-style patterns, resolved against the server.

A whole database is named by patterns (``tables=["*"]``, ``exclude_tables=["tmp_*"]``), resolved at every run, so
a table created after the DAG was written is followed from the next run on. The rules live here, apart from
the query (:meth:`~exactly_once_provider.hooks.mysql_source.MySqlSourceHook.base_tables`), so they are tested
without a server.

Patterns are :mod:`fnmatch` globs matched case-sensitively against the table name: ``*`` any run of
characters, ``?`` one, ``[abc]`` one of a set (``[*]`` matches a literal ``*``). An entry without those
characters is a plain table name.

Several schemas of one server: an entry ``schema.table`` (split at its FIRST dot) names or matches tables of that
schema; an entry without a dot is one of the DAG's ``schema``. Tables of the DAG's schema keep their bare names,
those of another schema are named ``schema.table`` (:func:`split_name`), everywhere the pipeline names them.
A table whose name holds a dot is named with its schema (``eo.a.b``: table ``a.b`` of ``eo``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from fnmatch import fnmatchcase

PATTERN_CHARACTERS = frozenset("*?[")


def is_pattern(entry: str) -> bool:
    """Return whether ``entry`` is a pattern rather than a plain table name."""
    return any(character in PATTERN_CHARACTERS for character in entry)


def resolve_tables(
    existing: Iterable[str], include: Sequence[str], exclude: Sequence[str] = (), *, schema: str = ""
) -> list[str]:
    """
    Return the tables of ``existing`` that ``include`` names or matches and no ``exclude`` pattern matches, sorted.

    :param existing: the base tables of the schema (views are not followed: they have no binlog rows).
    :param include: table names and patterns.
    :param exclude: table names and patterns to leave out.
    :param schema: the schema, named in the errors.
    :raises ValueError: a plain name that does not exist, a pattern that matches no table, or nothing left.
    """
    tables = sorted(set(existing))
    where = f" of schema {schema!r}" if schema else ""
    missing = [entry for entry in include if not is_pattern(entry) and entry not in tables]
    if missing:
        raise ValueError(f"tables={list(include)!r}: no base table {missing!r}{where} (the server has {len(tables)}).")
    empty = [entry for entry in include if is_pattern(entry) and not any(fnmatchcase(t, entry) for t in tables)]
    if empty:
        raise ValueError(
            f"tables={list(include)!r}: pattern(s) {empty!r} match no base table{where} (the server has "
            f"{len(tables)}: {_sample(tables)}). Fix the pattern, or create the table first."
        )
    chosen = [t for t in tables if any(fnmatchcase(t, entry) for entry in include)]
    kept = [t for t in chosen if not any(fnmatchcase(t, entry) for entry in exclude)]
    if not kept:
        raise ValueError(
            f"tables={list(include)!r} minus exclude_tables={list(exclude)!r} leaves no table{where} "
            f"(matched before the exclusions: {_sample(chosen)})."
        )
    return kept


def _sample(names: Sequence[str], shown: int = 10) -> str:
    """Return up to ``shown`` names for an error message, saying how many more there are."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return (", ".join(names[:shown]) or "none") + more


def split_name(name: str, schema: str) -> tuple[str, str]:
    """Return ``(schema, table)`` of a table as a DAG names it: ``schema.table``, or a bare name of ``schema``."""
    if "." in name:
        owner, table = name.split(".", 1)
        if owner and table:
            return owner, table
        raise ValueError(f"table {name!r}: name a table of another schema as schema.table, both non-empty.")
    return schema, name


def resolve_schema_tables(
    base_tables: Callable[[str], Iterable[str]],
    include: Sequence[str],
    exclude: Sequence[str],
    schema: str,
) -> list[str]:
    """
    Return the tables ``include`` names or matches across schemas, minus ``exclude``: bare names for ``schema``'s,
    ``schema.table`` for another's; those of ``schema`` first, each schema's sorted.

    :param base_tables: lists a schema's base tables (one query per schema an entry names).
    :param include: table names and patterns; ``other.pattern`` for another schema.
    :param exclude: table names and patterns to leave out, qualified the same way.
    :param schema: the DAG's schema.
    :raises ValueError: as :func:`resolve_tables`, naming the schema.
    """
    by_schema: dict[str, tuple[list[str], list[str]]] = {}
    for entries, side in ((include, 0), (exclude, 1)):
        for entry in entries:
            owner, table = split_name(entry, schema)
            by_schema.setdefault(owner, ([], []))[side].append(table)
    kept: list[str] = []
    for owner in sorted(by_schema, key=lambda s: (s != schema, s)):
        wanted, unwanted = by_schema[owner]
        if not wanted:
            continue  # exclusions of a schema nothing includes: nothing to leave out
        for table in resolve_tables(base_tables(owner), wanted, unwanted, schema=owner):
            kept.append(table if owner == schema and "." not in table else f"{owner}.{table}")
    return kept
