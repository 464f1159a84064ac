"""Fixtures of the browser tests; the harness itself is in browser_harness.py (importable by name)."""

from browser_harness import (browser_context, browser_prereqs, playwright_instance, py_page,  # noqa: F401
                             web_server)
