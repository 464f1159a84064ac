"""Every Python snippet of README.md and the docs runs as written (the JS ones: tests/browser/test_readme_js.py), and
the README stays a page of one sitting."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from support.readme_snippets import NEEDS_API, PAGES, README, REPO, snippets

PYTHON = [s for s in snippets("python") if not s.startswith(NEEDS_API)]
NOTES = sorted((REPO / "bench" / "notes").glob("*.md"))
LINKING = (*PAGES, REPO / "CONTRIBUTING.md", REPO / "bench" / "README.md", *NOTES)
"""The pages whose relative links are followed: the snippets' pages, the contributors' and the benchmarks'."""
README_LIMIT = 14_000
"""Bytes: what it is, the two commands, install, the quick starts, the measured figures and links; references go
to docs/."""


def test_the_readme_has_a_python_quick_start():
    assert PYTHON and "from kvckpt_web import" in PYTHON[0]


def test_the_readme_reads_in_one_sitting():
    assert len(README.read_bytes()) < README_LIMIT


@pytest.mark.parametrize("page", LINKING, ids=[str(p.relative_to(REPO)) for p in LINKING])
def test_every_relative_link_of_a_page_names_a_file_that_exists(page):
    targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text())
    assert not [t for t in targets if not (page.parent / t).exists()]


def test_the_benchmarks_index_links_every_dated_note():
    index = (REPO / "bench" / "README.md").read_text()
    assert NOTES and all(re.fullmatch(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.md", n.name) for n in NOTES)
    assert [n.name for n in NOTES if f"](notes/{n.name})" not in index] == []


@pytest.mark.parametrize("source", PYTHON, ids=[f"block{i}" for i in range(len(PYTHON))])
def test_python_snippet_runs_as_written(source, device, tmp_path):
    run = subprocess.run([sys.executable, "-c", source], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
