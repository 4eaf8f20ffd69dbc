"""Tables by name and pattern: what is followed, and the errors that say what to fix."""

from __future__ import annotations

import pytest

from exactly_once_provider.source.table_patterns import is_pattern, resolve_tables

TABLES = ["audit_log", "customers", "orders", "orders_2025", "orders_2026", "tmp_x", "we*ird"]


def test_names_and_patterns_resolve_to_the_sorted_base_tables_minus_the_exclusions():
    assert resolve_tables(TABLES, ["*"], ["tmp_*", "audit_log"]) == [
        "customers",
        "orders",
        "orders_2025",
        "orders_2026",
        "we*ird",
    ]
    assert resolve_tables(TABLES, ["orders_*", "customers"]) == ["customers", "orders_2025", "orders_2026"]
    assert resolve_tables(TABLES, ["orders_202?"], ["*5"]) == ["orders_2026"]
    assert resolve_tables(TABLES, ["we[*]ird"]) == ["we*ird"]  # a literal * in a name, by a set of one
    with pytest.raises(ValueError, match="match no base table"):
        resolve_tables(TABLES, ["Orders*"])  # case-sensitive, as the binlog names the tables


def test_is_pattern():
    assert [is_pattern(e) for e in ("orders", "orders_*", "t?", "[ab]c", "a.b")] == [False, True, True, True, False]


@pytest.mark.parametrize(
    ("include", "exclude", "message"),
    [
        (["orders", "ghost"], [], r"no base table \['ghost'\] of schema 'shop'"),
        (["orders_*", "sales_*"], [], r"pattern\(s\) \['sales_\*'\] match no base table of schema 'shop'"),
        (["orders_*"], ["orders_*"], r"leaves no table of schema 'shop' \(matched before the exclusions: orders_2025"),
    ],
)
def test_a_missing_name_an_empty_pattern_or_nothing_left_is_refused(include, exclude, message):
    with pytest.raises(ValueError, match=message):
        resolve_tables(TABLES, include, exclude, schema="shop")


def test_the_error_lists_at_most_ten_tables():
    many = [f"t{i:03d}" for i in range(25)]
    with pytest.raises(ValueError, match=r"t009 and 15 more"):
        resolve_tables(many, ["x*"])


def test_entries_of_another_schema_are_resolved_there_and_named_with_it():
    from exactly_once_provider.source.table_patterns import resolve_schema_tables, split_name

    servers = {
        "eo": ["orders", "tmp_x", "users", "v.2"],
        "billing": ["invoices", "invoice_lines", "tmp_y"],
        "x": ["a.b"],
    }
    asked = []

    def base_tables(schema):
        asked.append(schema)
        return servers[schema]

    found = resolve_schema_tables(base_tables, ["*", "billing.invoice*", "x.a.b"], ["tmp_*", "billing.tmp_*"], "eo")
    assert found == ["orders", "users", "eo.v.2", "billing.invoice_lines", "billing.invoices", "x.a.b"]
    assert asked == ["eo", "billing", "x"]
    assert split_name("x.a.b", "eo") == ("x", "a.b") and split_name("orders", "eo") == ("eo", "orders")
    with pytest.raises(ValueError, match="of schema 'billing'"):
        resolve_schema_tables(base_tables, ["billing.nope*"], [], "eo")
    with pytest.raises(ValueError, match="schema.table"):
        split_name(".orders", "eo")
