"""What ``kvckpt chat`` shows and reads: the reply streamed to stdout, notes and errors on stderr (dimmed on a
terminal), lines read with line editing, and the one-line summaries of a reply and of a conversation.

Text from the model or the store is shown with its control characters made visible (a reply cannot move the
cursor, clear the screen or retitle the terminal): C0 controls other than newline and tab as their Unicode
control pictures, DEL as its picture, C1 controls as U+FFFD.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from ..engine import ChatChunk, ConversationInfo

__all__ = ["FINISHED", "Terminal", "conversation_row", "reply_status", "visible"]

FINISHED = {"stop": "done", "length": "token limit", "abort": "interrupted: /continue goes on"}
"""How a reply's status line says why it ended."""

_CONTROLS = {**{c: chr(0x2400 + c) for c in range(0x20) if chr(c) not in "\n\t"}, 0x7F: "\u2421",
             **{c: "\ufffd" for c in range(0x80, 0xA0)}}


def _line_editing() -> Any:
    """The ``readline`` module, whose import gives ``input()`` line editing and history (None where Python has
    none: ``input()`` still reads lines). Imported by the chat only, not by every ``kvckpt`` command."""
    try:
        import readline
    except ImportError:
        return None
    return readline


def visible(text: str) -> str:
    """``text`` with its control characters (but newline and tab) made visible."""
    return text.translate(_CONTROLS)


def reply_status(name: str, last: ChatChunk, resumed_after: int | None) -> str:
    """The line after a reply (``last`` its last chunk; ``resumed_after`` the tokens it had when it was
    resumed, None if it was not): its conversation, where its prompt's K/V came from, its speed, why it ended."""
    usage = last.usage
    timings = usage.timings
    restored = f" (restored from the store in {timings.restore_s * 1e3:.0f} ms)" if timings.restore_s > 0 else ""
    reply = f"{usage.completion_tokens} reply tokens"
    if resumed_after is not None:
        prompt = f"resumed after {resumed_after} reply tokens{restored}"
    else:
        prompt = (f"{usage.prompt_tokens} prompt tokens, {usage.cached_tokens} cached{restored}, "
                  f"{timings.prefill_tokens} prefilled in {timings.prefill_s:.2f} s")
        rate = timings.to_json()["decode_tokens_per_s"]
        reply += f", {rate:.1f} tok/s" if rate else ""
    return f"({name} · {prompt} · {reply} · {FINISHED[last.finish_reason]})"


def conversation_row(number: int, info: ConversationInfo, current: bool) -> str:
    """One line of ``/list``: number, name, title, tokens, when it was last saved, and a mark if its last reply
    was cut (or it cannot be continued here)."""
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(info.updated_ms / 1e3)) if info.updated_ms else "-"
    mark = ("unreadable" if info.error is not None else "another model" if not info.same_model
            else "cut" if not info.finished else "")
    title = visible(info.title) or "(no message)"
    return (f"{'>' if current else ' '}{number:3d}  {info.name}  {title[:40]:40}  {info.tokens:6d} tokens  "
            f"{when}  {mark}").rstrip()


class Terminal:
    """The chat's input and output. ``read`` reads a line (``input`` by default: line editing where the
    platform has readline); styling (dim notes) only where the stream is a terminal and ``NO_COLOR`` is unset."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None,
                 read: Callable[[str], str] = input) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.read = read
        self._readline = _line_editing() if read is input else None
        self._at_line_start = True

    def _dim(self, stream: TextIO, text: str) -> str:
        styled = stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
        return f"\x1b[2m{text}\x1b[0m" if styled else text

    def _write(self, stream: TextIO, text: str) -> None:
        self.end_reply()
        stream.write(text)
        stream.flush()

    def read_line(self, prompt: str, prefill: str = "") -> str:
        """A line typed after ``prompt``, starting as ``prefill`` where line editing is available (EOFError at
        the end of input, KeyboardInterrupt on Ctrl-C)."""
        if self._readline is None or not prefill:
            return self.read(prompt)
        self._readline.set_startup_hook(lambda: self._readline.insert_text(prefill))
        try:
            return self.read(prompt)
        finally:
            self._readline.set_startup_hook()

    def reply(self, text: str) -> None:
        """A piece of a reply, as it comes."""
        if text:
            self.out.write(visible(text))
            self.out.flush()
            self._at_line_start = text.endswith("\n")

    def end_reply(self) -> None:
        """End the reply's line (if it has not ended)."""
        if not self._at_line_start:
            self.out.write("\n")
            self.out.flush()
            self._at_line_start = True

    def message(self, role: str, content: str) -> None:
        """A message of the history: the user's after the prompt, a reply as it was streamed, the system's dim."""
        if role == "user":
            self._write(self.out, f"you> {visible(content)}\n")
        elif role == "system":
            self._write(self.out, self._dim(self.out, f"system: {visible(content)}") + "\n")
        else:
            self.reply(content)
            self.end_reply()

    def ctrl_c(self) -> None:
        """Ctrl-C was pressed: a terminal echoes ``^C`` where the cursor is, so what follows starts a new line."""
        self._at_line_start = False

    def newline(self) -> None:
        """End the line typed at the prompt (after Ctrl-D or Ctrl-C there)."""
        self._write(self.out, "\n")

    def line(self, text: str) -> None:
        """A line of a command's answer (``/list``)."""
        self._write(self.out, visible(text) + "\n")

    def note(self, text: str) -> None:
        """A line about the chat (status, what a command did), dimmed."""
        self._write(self.err, self._dim(self.err, visible(text)) + "\n")

    def warning(self, text: str) -> None:
        """A one-line warning: something the reply did without (it goes on)."""
        self._write(self.err, f"warning: {visible(text)}\n")

    def error(self, text: str) -> None:
        """A one-line error; the chat goes on."""
        self._write(self.err, f"error: {visible(text)}\n")
