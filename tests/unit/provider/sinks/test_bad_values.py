"""The typed bad-value kinds' rules (sinks/bad_values.py) without Spark: the regexes read the same in Python and Java,
and :func:`digits_fit` is the very arithmetic Spark evaluates, fed here with Python's counts of the same groups."""

from __future__ import annotations

import re

import pytest

from exactly_once_provider.full_load.columns import Column
from exactly_once_provider.sinks import bad_values

pytestmark = pytest.mark.unit


def _fits(text: str, precision: int, scale: int) -> bool:
    """The rule as :func:`bad_values.decimal_fits` builds it in Spark: the plain pattern, else the digit counts."""
    if re.search(bad_values.plain_pattern(precision, scale), text):
        return True
    found = re.search(bad_values.NUMBER, text)
    if not found:
        return False
    whole, fraction, exponent = (found.group(i) or "" for i in (1, 2, 3))
    digits = whole + fraction
    significant = len(digits.lstrip("0"))
    return bool(
        bad_values.digits_fit(
            len(whole),
            len(fraction),
            int(exponent) if exponent else 0,
            len(digits) - significant,
            len(digits) - len(digits.rstrip("0")),
            significant,
            precision,
            scale,
        )
    )


@pytest.mark.parametrize(
    ("text", "precision", "scale", "fits"),
    [
        ("1234.56", 6, 2, True),
        ("-1234.56", 6, 2, True),
        ("12345.67", 6, 2, False),  # five integer digits: Spark's cast gives NULL (ANSI off) or fails naming no record
        ("12345", 6, 2, False),
        ("0012.50", 6, 2, True),  # leading and trailing zeros are no digits of the value
        ("1.005", 6, 2, False),  # three decimals: Spark's cast would round it to 1.01, ANSI or not
        ("1.500", 6, 2, True),
        (".5", 6, 2, True),
        ("5", 6, 0, True),
        ("5.0", 6, 0, True),
        ("5.1", 6, 0, False),
        ("1.20E-8", 20, 10, True),  # Python's str(Decimal) of a small value: 0.0000000120
        ("1.23E-8", 20, 9, False),  # 0.0000000123 needs 10 decimals
        ("0E-10", 20, 2, True),  # zero at scale 10
        ("100E-2", 6, 0, True),  # 1.00
        ("1E+5", 6, 2, False),  # 100000: six integer digits
        ("1E+3", 6, 2, True),
        ("18446744073709551615", 20, 0, True),  # BIGINT UNSIGNED, loaded as decimal(20,0)
        ("184467440737095516150", 20, 0, False),
        ("abc", 6, 2, False),
        ("", 6, 2, False),  # no digit: no number (the cast would give NULL)
        ("-", 6, 2, False),
        (".", 6, 2, False),
        ("1.2.3", 6, 2, False),
    ],
)
def test_a_decimal_fits_only_when_no_digit_is_lost(text, precision, scale, fits):
    assert _fits(text, precision, scale) is fits


def test_the_decimal_message_names_the_column_its_type_and_the_fix():
    column = Column("amount", "decimal", "decimal(6,2)", 6, 2)

    class Decimal62:  # a DecimalType's two fields, without importing Spark
        precision, scale = 6, 2

    before, after = bad_values.decimal_message(column, Decimal62, "eo.orders")
    message = before + "12345.67" + after
    for part in ("'amount'", "eo.orders", "decimal(6,2)", "4 integer digits and 2 decimals", "12345.67", "full reload"):
        assert part in message, message


def test_the_schema_message_names_the_table_its_columns_and_version():
    columns = [Column(f"c{i}", "int", "int(11)", 10, 0) for i in range(25)]
    message = bad_values.schema_message(columns, 4294971391, "eo.orders")
    assert "eo.orders" in message and "schema version 4294971391" in message and "full reload" in message
    assert "c0, c1" in message and "c19 and 5 more" in message and "c20" not in message, message
    assert "the last schema change it followed" in bad_values.schema_message(columns[:2], None, "eo.orders")
