"""The code blocks of README.md, as its readers copy them."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
NEEDS_API = "# with `kvckpt serve --api"
"""How a Python block that talks to a running ``kvckpt serve --api`` begins (tests/server/test_api_readme.py runs
those against one)."""


def snippets(language: str) -> list[str]:
    """The text of every fenced block of ``language`` (```python, ```js) in README.md, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```$", README.read_text(), flags=re.MULTILINE | re.DOTALL)
