"""Bad values of typed change records: the two kinds only the current table's typed conversion finds (issue 41).

* ``decimal_overflow``: a DECIMAL value the table's ``decimal(p,s)`` column cannot hold exactly: more than ``p - s``
  integer digits (Spark's cast gives NULL, or with ANSI mode an error naming no record) or more than ``s`` decimals
  (Spark's cast ROUNDS it, silently, ANSI or not). Either would store another value than the source's.
* ``schema_version``: a change whose row image names a column the table does not hold: a record of a schema
  version the table does not follow (its ``ALTER TABLE``'s schema record was never read, or another producer wrote
  it). Spark's ``from_json`` would drop that column's value silently.

Each kind is a Spark condition over the change's JSON text (no Python per record, no ANSI setting relied on), used
twice: by the dead-letter split (``on_bad_record="dead_letter"``: the record becomes a letter with the message
:func:`decimal_message` / :func:`schema_message` builds) and by the typed conversion itself
(:func:`~exactly_once_provider.spark_jobs.current_changes.typed_changes`: with ``"fail"``, the batch stops before
its commit with the same message and the record's topic, partition and offset). The rule is the same pure
arithmetic in both and in the unit tests (:func:`digits_fit`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # full_load imports sinks: a column is only described here
    from exactly_once_provider.full_load.columns import Column

DECIMAL_OVERFLOW = "decimal_overflow"
SCHEMA_VERSION = "schema_version"
NAMED_COLUMNS = 20  # a message lists at most this many of the table's columns

# Any decimal number as text (the capture writes Python's str(Decimal): "12.30", "-0.5", "1.20E-8", "0E-10"); its
# groups: the digits before the point, after it, and the exponent. Java's regex reads it as Python's does.
NUMBER = r"^[+-]?(?=\.?[0-9])([0-9]*)(?:\.([0-9]*))?(?:[eE]([+-]?[0-9]{1,9}))?$"


def plain_pattern(precision: int, scale: int) -> str:
    """Return the regex of a plain number (no exponent) whose digits fit ``decimal(precision, scale)``: at least
    one digit, leading zeros, at most ``precision - scale`` integer digits, at most ``scale`` decimals, then zeros.

    The cheap test every value takes (a match is a number Spark's cast reads exactly); only a value it refuses
    is measured by :func:`digits_fit` and cast.
    """
    return rf"^[+-]?(?=\.?[0-9])0*[0-9]{{0,{precision - scale}}}(\.[0-9]{{0,{scale}}}0*)?$"


def digits_fit(
    whole: Any, fraction: Any, exponent: Any, leading: Any, trailing: Any, significant: Any, precision: int, scale: int
) -> Any:
    """Return whether a number fits ``decimal(precision, scale)``, from its digit counts (ints or Spark columns).

    The number is ``<whole digits>.<fraction digits> * 10**exponent``; ``leading``/``trailing`` count the zeros
    at either end of all its digits, ``significant`` the digits after the leading zeros (0: the number is zero).

    :param whole: digits before the point.
    :param fraction: digits after the point.
    :param exponent: the power of ten (0 without one).
    """
    point = whole + exponent  # digits before the point once the exponent is applied
    integer_digits = point - leading  # the value's integer digits (0 or less: none)
    decimals = whole + fraction - trailing - point  # the value's decimals (0 or less: none)
    return (significant == 0) | ((integer_digits <= precision - scale) & (decimals <= scale))


def decimal_fits(text: Any, precision: int, scale: int) -> Any:
    """Return the Spark condition: the number ``text`` (a string column) fits ``decimal(precision, scale)``
    exactly (no digit lost); false for text that is no number."""
    from pyspark.sql import functions as F

    def part(group: int) -> Any:
        return F.regexp_extract(text, NUMBER, group)

    whole, fraction, exponent = part(1), part(2), part(3)
    digits = F.concat(whole, fraction)
    significant = F.length(F.regexp_replace(digits, "^0+", ""))
    measured = digits_fit(
        F.length(whole),
        F.length(fraction),
        F.when(exponent == "", F.lit(0)).otherwise(exponent.try_cast("int")),
        F.length(digits) - significant,
        F.length(digits) - F.length(F.regexp_replace(digits, "0+$", "")),
        significant,
        precision,
        scale,
    )
    return F.when(text.rlike(plain_pattern(precision, scale)), F.lit(True)).otherwise(
        F.coalesce(text.rlike(NUMBER) & measured, F.lit(False))
    )


def bad_decimal(text: Any, spark_type: Any) -> Any:
    """Return the Spark condition: ``text`` is a value the ``DecimalType`` ``spark_type`` cannot hold exactly (a
    NULL is no bad value)."""
    from pyspark.sql import functions as F

    plain = text.rlike(plain_pattern(spark_type.precision, spark_type.scale))
    fits = decimal_fits(text, spark_type.precision, spark_type.scale)
    # the usual value is plain and fits: one regex match, no cast, decides it
    return text.isNotNull() & F.when(plain, F.lit(False)).otherwise(text.try_cast(spark_type).isNull() | ~fits)


def decimal_message(column: Column, spark_type: Any, table: str) -> tuple[str, str]:
    """Return a ``decimal_overflow`` message's text before and after the value (Spark puts the value between).

    :param table: ``schema.table`` of the source.
    """
    p, s = spark_type.precision, spark_type.scale
    return (
        f"column {column.name!r} of the current table of {table} is decimal({p},{s}) (the source's "
        f"{column.column_type}: at most {p - s} integer digits and {s} decimals), and the change's value ",
        " does not fit it exactly (stored, it would be rounded or NULL). The source's column is wider than the "
        "table follows (an ALTER TABLE whose schema record the table did not read?) or another producer wrote the "
        "record: run a full reload of the table (full_reload=true) or fix the producer",
    )


def unknown_columns(image: Any, names: list[str]) -> Any:
    """Return the Spark array of the names ``image`` (a row image's JSON text) holds that are not in ``names``."""
    from pyspark.sql import functions as F

    return F.array_except(F.json_object_keys(image), F.array(*[F.lit(n) for n in names]))


def has_unknown_columns(image: Any, names: list[str]) -> Any:
    """Return the Spark condition: ``image`` names a column not in ``names``."""
    from pyspark.sql import functions as F

    return F.coalesce(F.size(unknown_columns(image, names)), F.lit(0)) > 0


def schema_message(columns: list[Column], applied: int | None, table: str) -> str:
    """Return a ``schema_version`` message's text after the unknown column names (:func:`schema_error`).

    :param applied: the version of the last schema change the table followed (its full load's, without one); None:
        not known where the message is built.
    :param table: ``schema.table`` of the source.
    """
    names = [c.name for c in columns]
    more = len(names) - NAMED_COLUMNS
    shown = ", ".join(names[:NAMED_COLUMNS]) + (f" and {more} more" if more > 0 else "")
    state = f"schema version {applied}" if applied is not None else "the last schema change it followed"
    return (
        f" that the current table of {table} does not hold: the record is of a schema version the table does not "
        f"follow (the table's columns are {shown}, as of {state}: its last ALTER TABLE followed, or its full "
        "load). The schema record of that ALTER TABLE was not read, or another producer wrote the record: run a "
        "full reload of the table (full_reload=true) or fix the producer"
    )


def decimal_error(column: Column, spark_type: Any, table: str, value: Any, where: Any = None) -> Any:
    """Return the Spark column of a ``decimal_overflow`` message for ``value`` (the change's text of the column).

    :param where: a Spark column naming the record (the fail mode's message; a letter keeps its place itself).
    """
    from pyspark.sql import functions as F

    before, after = decimal_message(column, spark_type, table)
    return F.concat(F.lit(before), value, *([where] if where is not None else []), F.lit(after))


def schema_error(
    columns: list[Column], applied: int | None, table: str, record: Any, image: Any, where: Any = None
) -> Any:
    """Return the Spark column of a ``schema_version`` message.

    :param record: the change record's JSON text (its ``schema_version`` is named).
    :param image: its row image's JSON text.
    :param where: a Spark column naming the record (the fail mode's message).
    """
    from pyspark.sql import functions as F

    return F.concat(
        F.lit("the change (its schema_version "),
        F.coalesce(F.get_json_object(record, "$.schema_version"), F.lit("?")),
        F.lit(")"),
        *([where] if where is not None else []),
        F.lit(" names column(s) "),
        F.array_join(unknown_columns(image, [c.name for c in columns]), ", "),
        F.lit(schema_message(columns, applied, table)),
    )
