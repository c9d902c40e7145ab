"""The "admitted" log line says where an admission's time went (issue 37: the benchmark reads it)."""

from __future__ import annotations

from dispatch.controller._reconcile import _steps_ms


def test_each_step_is_the_time_between_its_two_marks() -> None:
    marks = {"began": 10.000, "read": 10.042, "raised": 10.080}
    assert _steps_ms(marks, 10.1125, 9.995) == {
        "gone_to_decision_ms": 5.0, "read_ms": 42.0, "raise_ms": 38.0, "ready_ms": 32.5}


def test_a_step_without_both_marks_is_left_out() -> None:
    assert _steps_ms({"began": 1.0, "raised": 1.05}, 1.06, None) == {"ready_ms": 10.0}
    assert _steps_ms({}, 2.0, None) == {}
