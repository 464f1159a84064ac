"""``kvckpt ARGS...`` that stops once its replies have printed K pieces of text, until a signal comes, so a test
chooses where ``kill -9`` or Ctrl-C lands: ``python chat_paused.py K ARGS...``. It shows ``<paused>`` (a note,
on its own line) when it stops; the reply is printed up to there, and the store holds its last autosave."""

from __future__ import annotations

import signal
import sys

from kvckpt_web.cli.chat_terminal import Terminal
from kvckpt_web.cli.main import main

PAUSED = "<paused>"


def pause_after(pieces: int) -> None:
    """Make every terminal stop after the ``pieces``-th piece of reply text it prints."""
    reply, printed = Terminal.reply, []

    def reply_then_pause(self: Terminal, text: str) -> None:
        reply(self, text)
        if text:
            printed.append(text)
            if len(printed) == pieces:
                self.note(PAUSED)
                signal.pause()  # returns once a signal's handler ran (Ctrl-C); kill -9 ends it here

    Terminal.reply = reply_then_pause


if __name__ == "__main__":
    pause_after(int(sys.argv[1]))
    sys.exit(main(sys.argv[2:]))
