"""Airflow UI plugin and operator extra links of the exactly-once provider."""
