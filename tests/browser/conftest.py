"""Fixtures of the browser tests; the harness itself is in browser_harness.py (bench/browser.py imports it too)."""

from .browser_harness import (browser_context, browser_prereqs, playwright_instance, py_page,  # noqa: F401
                             web_server)
