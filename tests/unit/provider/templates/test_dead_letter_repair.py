"""The repair template: the trigger form's choice reaches the operator as lists and a bool, a run without a choice
is refused, and the operator's ``accept`` takes the form's rendering."""

from __future__ import annotations

import pytest

from exactly_once_provider.operators.dead_letter_repair import DeadLetterRepairOperator
from exactly_once_provider.templates.dead_letter_repair import dead_letter_repair_dag


def _fix(letter):
    return None, letter["record_value"].decode("utf-8", "replace")


def test_the_form_chooses_the_letters_and_how_and_refuses_no_choice():
    dag = dead_letter_repair_dag(dag_id="t_repair", pipeline="orders", sink_table="orders", mode="cdc", fix=_fix)
    assert dag.schedule is None and dag.max_active_runs == 1
    assert dag.params["how"] == "fix" and dag.params.get_param("how").schema["enum"] == ["fix", "accept"]
    repair = dag.get_task("repair")
    assert (repair.mode, repair.key_field, repair.fix) == ("cdc", "pk", _fix)
    assert dag.get_task("choose").downstream_task_ids == {"repair"}
    params = {"error_classes": ["invalid_utf8"], "offsets": ["t/0@7"], "keys": [], "how": "accept"}
    repair.render_template_fields({"params": params}, jinja_env=dag.get_template_env())
    assert (repair.error_classes, repair.offsets, repair.keys, repair.accept) == (["invalid_utf8"], ["t/0@7"], [], True)
    choose = dag.get_task("choose").python_callable
    assert choose(params={**params, "every_open_letter": False})["offsets"] == ["t/0@7"]
    with pytest.raises(ValueError, match="Choose the letters"):
        choose(params={"error_classes": [], "offsets": [], "keys": [], "every_open_letter": False})
    assert choose(params={"every_open_letter": True}) == {"error_classes": [], "offsets": [], "keys": []}
    without_fix = dead_letter_repair_dag(dag_id="t_repair_accept", pipeline="orders", sink_table="orders")
    assert without_fix.params["how"] == "accept"
    with pytest.raises(ValueError, match="mode='current'"):
        dead_letter_repair_dag(dag_id="t_repair_current", pipeline="p", sink_table="t", mode="current")


@pytest.mark.parametrize(
    ("accept", "fix", "message"),
    [
        ("maybe", _fix, "accept must be true or false"),
        ("False", None, "Give fix"),
        (False, "not a function", "fix must"),
    ],
)
def test_accept_is_checked_before_anything_is_read(accept, fix, message):
    operator = DeadLetterRepairOperator(task_id="r", pipeline="p", sink_table="t", accept=accept, fix=fix)
    with pytest.raises(ValueError, match=message):
        operator.execute({})
