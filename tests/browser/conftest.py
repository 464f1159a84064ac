"""Fixtures of the browser tests; the harness itself is in browser_harness.py (on the browser benchmark's Chromium)."""

from .browser_harness import (browser_context, browser_prereqs, fresh_wheel, playwright_instance,  # noqa: F401
                              py_page, web_server)
from .chat_page import chat_browser, chat_server  # noqa: F401
