"""The one version rule's SQL forms: Spark SQL and PostgreSQL (the Spark columns' form: the integration test)."""

from __future__ import annotations

from exactly_once_provider.sinks import version_rule


def test_the_sql_forms_name_the_newer_side_and_quote_the_column():
    assert version_rule.sql_condition("_eo_version") == "s.`_eo_version` > t.`_eo_version`"
    assert version_rule.sql_condition("v`x", replace_equal=True, source="c", target="r") == "c.`v``x` >= r.`v``x`"
    from psycopg2 import sql

    rendered = version_rule.postgres_condition(sql.Identifier("a", "t"), "source_version")
    assert repr(rendered).count("EXCLUDED") == 1 and "<" in repr(rendered)
