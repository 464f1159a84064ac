"""The text of a reply as it is generated: released once final (a character's UTF-8 complete, no stop string
about to start), cut where the first stop string appears."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .app_state import StopRules

__all__ = ["ReplyText"]


class ReplyText:
    """The reply text of the generated tokens, released as it becomes final, cut at the first stop string."""

    def __init__(self, decode: Callable[[Sequence[int]], str] | None, stop: StopRules) -> None:
        self.decode = decode
        self.stops = stop.stop_strings
        self.eos = frozenset(stop.eos_ids)
        self.final = ""       # text released so far
        self.anchor = 0       # tokens before this index are all in ``final``
        self.released = 0     # characters of the text since ``anchor`` already in ``final``

    def _held(self, text: str) -> int:
        """How many characters at the end of ``text`` may still change: an incomplete UTF-8 character or
        the beginning of a stop string."""
        keep = len(text) - len(text.rstrip("\ufffd"))
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        return keep

    def push(self, generated: Sequence[int], finished: bool) -> tuple[str, bool]:
        """Newly final text after ``generated`` (all tokens so far), and whether a stop string ended it."""
        if self.decode is None:
            return "", False
        tail = self.decode([t for t in generated[self.anchor:] if t not in self.eos])
        cut = min((i for i in (tail.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            end, stopped = cut, True
        else:
            end, stopped = (len(tail) if finished else len(tail) - self._held(tail)), False
        delta = tail[self.released:end] if end > self.released else ""
        self.final += delta
        self.released += len(delta)
        if not stopped and end == len(tail):
            self.anchor, self.released = len(generated), 0
        return delta, stopped
