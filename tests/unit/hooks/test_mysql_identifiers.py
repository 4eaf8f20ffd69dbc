"""Identifier quoting: a hostile name stays one identifier."""

from __future__ import annotations

import pytest

from exactly_once_provider.hooks.mysql_identifiers import quote_identifier, quote_table


@pytest.mark.parametrize("name,quoted", [
    ("orders", "`orders`"),
    ("a`b", "`a``b`"),
    ("x`; DROP TABLE y; --", "`x``; DROP TABLE y; --`"),
    ("it's \"q\"", "`it's \"q\"`"),
])
def test_quote_identifier_doubles_backticks(name, quoted):
    assert quote_identifier(name) == quoted


def test_quote_table_qualifies_with_schema():
    assert quote_table("s`1", "t") == "`s``1`.`t`"


@pytest.mark.parametrize("bad", ["", None, "a\x00b"])
def test_bad_identifiers_are_refused(bad):
    with pytest.raises(ValueError, match="identifier|Identifier"):
        quote_identifier(bad)
