"""The one version rule's Spark column form over a changes-to-rows join, in the session's Spark."""

from __future__ import annotations

import pytest

from exactly_once_provider.sinks import version_rule


@pytest.mark.parametrize(
    ("replace_equal", "expected"),
    [(False, [True, False, False, True, False]), (True, [True, True, False, True, False])],
)
def test_a_change_wins_only_over_an_older_row_and_never_touches_an_unchanged_one(spark, replace_equal, expected):
    rows = [(5, 3), (5, 5), (3, 5), (7, None), (None, 4)]  # (change version, row version): no change, no row
    frame = spark.createDataFrame(rows, "s_v long, t_v long").selectExpr(
        "named_struct('v', s_v) AS s", "named_struct('v', t_v) AS t"
    )
    assert [r[0] for r in frame.select(version_rule.takes_change("v", replace_equal)).collect()] == expected
