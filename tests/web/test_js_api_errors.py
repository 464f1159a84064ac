"""How kvckpt.mjs's toError describes a Python exception (js_api.describe_error), without a browser.

Pyodide keeps the last exception that reached JavaScript in ``sys.last_exc`` and gives JavaScript its formatted
traceback; these tests set both as Pyodide would.
"""

from __future__ import annotations

import json
import sys
import traceback

from kvckpt_web.errors import FieldError, NotFoundError, UnusableCheckpointError
from kvckpt_web.web.js_api import describe_error


def thrown(exc: BaseException, monkeypatch) -> dict:  # type: ignore[no-untyped-def]
    """describe_error of ``exc`` as Pyodide hands it to JavaScript (raised, kept in sys.last_exc)."""
    try:
        raise exc
    except BaseException as raised:
        text = "".join(traceback.format_exception(raised))
        monkeypatch.setattr(sys, "last_exc", raised, raising=False)
    return json.loads(describe_error(text))


def test_a_field_error_gives_its_class_one_line_message_field_expected_and_got(monkeypatch):
    assert thrown(FieldError("layers[0].k.nbytes", 224, 192), monkeypatch) == {
        "name": "FieldError", "message": "layers[0].k.nbytes: expected 224, got 192",
        "field": "layers[0].k.nbytes", "expected": 224, "got": 192}


def test_another_kvckpt_error_gives_its_class_and_message_only(monkeypatch):
    assert thrown(NotFoundError("no checkpoint 'chat'"), monkeypatch) == {
        "name": "NotFoundError", "message": "no checkpoint 'chat'"}


def test_an_unusable_checkpoint_error_gives_its_reason(monkeypatch):
    assert thrown(UnusableCheckpointError("model", "app_state.model: another model's"), monkeypatch) == {
        "name": "UnusableCheckpointError", "message": "app_state.model: another model's", "reason": "model"}


def test_values_json_cannot_carry_arrive_as_text(monkeypatch):
    got = thrown(FieldError("x", (1, float("nan")), b"\x01"), monkeypatch)
    assert (got["expected"], got["got"]) == ([1, "nan"], "b'\\x01'")


def test_a_python_exception_gives_the_name_python_error_and_the_tracebacks_last_line(monkeypatch):
    assert thrown(TypeError("unsupported operand"), monkeypatch) == {
        "name": "PythonError", "message": "TypeError: unsupported operand"}


def test_a_traceback_of_another_exception_than_the_last_one_gives_only_its_last_line(monkeypatch):
    older = "".join(traceback.format_exception(FieldError("a", 1, 2)))
    thrown(FieldError("b", 3, 4), monkeypatch)
    assert json.loads(describe_error(older)) == {"name": "PythonError",
                                                 "message": "kvckpt_web.errors.FieldError: a: expected 1, got 2"}
