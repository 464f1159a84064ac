"""What a ``kvckpt chat`` store holds, read without a model: the newest record of each conversation, and the
status line a reply ends with, parsed."""

from __future__ import annotations

import re
from pathlib import Path

from kvckpt_web.durable.catalog import list_names, load_manifest
from kvckpt_web.engine.record import ChatRecord
from kvckpt_web.stores.file import FileStore

from support.kvmodel import run

STATUS = re.compile(r"^\((?P<name>[A-Za-z0-9._-]+) · (?:(?P<prompt>\d+) prompt tokens, (?P<cached>\d+) cached"
                    r"|resumed after (?P<resumed>\d+) reply tokens)(?P<restored> \(restored from the store in "
                    r"\d+ ms\))?(?:, (?P<prefilled>\d+) prefilled in [\d.]+ s)? · (?P<reply>\d+) reply tokens"
                    r"(?:, [\d.]+ tok/s)? · (?P<end>.+)\)$", re.M)
"""The line after each reply (kvckpt_web/cli/chat_terminal.py's ``reply_status``)."""


def saved(store: Path) -> dict[str, ChatRecord]:
    """The newest record of every conversation in the store directory ``store``, by name."""

    async def read() -> dict[str, ChatRecord]:
        files = FileStore(store, read_only=True)
        records = {}
        for name in await list_names(files):
            manifest, _ = await load_manifest(files, name)
            records[name] = ChatRecord.from_app_state(name, manifest.generation, manifest.created_ms,
                                                      manifest.app_state)
        return records

    return run(read())


def statuses(text: str) -> list[re.Match]:
    """Every reply's status line in ``text``."""
    return list(STATUS.finditer(text))
