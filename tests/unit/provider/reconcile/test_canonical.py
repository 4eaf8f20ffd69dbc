"""The canonical text of a BIT column: MariaDB's HEX() renders a BIT as a number, the sinks hold its bytes."""

from __future__ import annotations

import pytest

from exactly_once_provider.full_load.columns import Column
from exactly_once_provider.reconcile.canonical import MARIADB, POSTGRES, python_text

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("column_type", "width"), [("bit(8)", 2), ("bit(1)", 2), ("bit(12)", 4), ("bit(64)", 16)])
def test_mariadb_pads_a_bit_to_its_bytes_as_the_sinks_hex_does(column_type, width):
    column = Column("bt", "bit", column_type, None, None)
    assert MARIADB.canonical("`bt`", column) == f"LOWER(LPAD(HEX(`bt`), {width}, '0'))"
    assert len(python_text(b"\x00" * (width // 2 - 1) + b"\x01", column)) == width  # the sinks' bytes, as hex
    assert POSTGRES.canonical('"bt"', column) == "encode(\"bt\", 'hex')"  # bytea: its bytes already
    assert MARIADB.canonical("`b`", Column("b", "blob", "blob", None, None)) == "LOWER(HEX(`b`))"  # bytes: no pad
