"""The browser modules kvckpt_web ships (``kvckpt_web/web/*.mjs``), read as text: errors cross every boundary in the
shape one module describes, and no module carries a hook that only tests use (they bring their own worker:
``kvckpt_web/bench/held_worker.mjs``)."""

from __future__ import annotations

import re
from pathlib import Path

import kvckpt_web.web

MODULES = sorted(Path(kvckpt_web.web.__file__).parent.glob("*.mjs"))
TEST_HOOKS = re.compile(r"\b(hold|unhold|holdAfter|testing|demoHooks)\b")


def code(path: Path) -> str:
    """The module's text without its comments."""
    return re.sub(r"(^|\s)//.*", "", path.read_text())


def test_the_wire_fields_of_an_error_are_listed_in_one_module_only():
    assert [p.name for p in MODULES if '"reason"' in code(p)] == ["errors.mjs"]


def test_no_shipped_module_holds_a_test_hook():
    assert MODULES and {p.name: TEST_HOOKS.findall(code(p)) for p in MODULES if TEST_HOOKS.search(code(p))} == {}
