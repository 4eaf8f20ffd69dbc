"""Which tables of a schema a pipeline follows: names and shell-style patterns, resolved against the server.

A whole database is named by patterns (``tables=["*"]``, ``exclude_tables=["tmp_*"]``), resolved at every run, so
a table created after the DAG was written is followed from the next run on. The rules live here, apart from
the query (:meth:`~exactly_once_provider.hooks.mysql_source.MySqlSourceHook.base_tables`), so they are tested
without a server.

Patterns are :mod:`fnmatch` globs matched case-sensitively against the table name: ``*`` any run of
characters, ``?`` one, ``[abc]`` one of a set (``[*]`` matches a literal ``*``). An entry without those
characters is a plain table name.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
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
