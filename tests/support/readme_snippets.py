"""The code blocks of the user's documentation (README.md, docs/*.md, examples/chat/README.md), as its readers copy
them."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
PAGES = (README, *sorted((REPO / "docs").glob("*.md")), REPO / "examples" / "chat" / "README.md")
"""Every page whose snippets the tests run: the README first (its first Python block is the quick start), then the
references it links to."""
NEEDS_API = "# with `kvckpt serve --api"
"""How a Python block that talks to a running ``kvckpt serve --api`` begins (tests/server/test_api_readme.py runs
those against one)."""


def snippets(language: str) -> list[str]:
    """The text of every fenced block of ``language`` (```python, ```js) in the pages, in order."""
    return [block for page in PAGES
            for block in re.findall(rf"^```{language}\n(.*?)^```$", page.read_text(), flags=re.MULTILINE | re.DOTALL)]
