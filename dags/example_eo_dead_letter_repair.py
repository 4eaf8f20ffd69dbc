"""Example: repair the dead letters of a PostgreSQL append stream from the trigger form.

Trigger ``eo_dead_letter_repair`` from the UI, choose the letters (error classes, offsets, keys, or every open one)
and how (the fix below, or accept them as they are); each chosen letter is applied once and closed in the same
transaction (docs/dead-letters.md).
"""

from __future__ import annotations

# [START howto_template_dead_letter_repair]
# An Airflow DAG file: Airflow's DAG discovery (safe mode, its default) parses only the files that mention both
# "airflow" and "dag", and a file that only calls a template may mention neither: keep this line.
import pendulum

from exactly_once_provider.templates.dead_letter_repair import dead_letter_repair_dag


def fix(letter: dict) -> tuple[str | None, str | None]:
    """Decode what the sink could not store: bytes that are not UTF-8 as Latin-1, NUL characters dropped."""
    key, value = (
        None if data is None else data.decode("latin-1").replace("\x00", "")
        for data in (letter["record_key"], letter["record_value"])
    )
    return key, value


dag = dead_letter_repair_dag(
    dag_id="eo_dead_letter_repair",
    pipeline="orders-append",
    sink_table="orders_events",
    fix=fix,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
)
# [END howto_template_dead_letter_repair]
