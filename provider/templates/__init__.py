"""DAG templates: factories that compose the provider's operators into the three situations of docs/design.md.

* :func:`exactly_once_provider.templates.settlement.settlement_dag` — nightly settlements over a data interval;
* :func:`exactly_once_provider.templates.history_stream.history_stream_dag` — a full load, then binlog increments;
* :func:`exactly_once_provider.templates.dead_letter_repair.dead_letter_repair_dag` — repair dead letters from the
  trigger form.

Example DAG files built with them: ``example_eo_settlement.py``, ``example_eo_history_stream.py``.
"""
