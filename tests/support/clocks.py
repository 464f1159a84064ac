"""A wall clock the test moves: what a retention policy is judged at, and what dates the checkpoints written."""

from __future__ import annotations

import time


class WallClock:
    """Seconds since the epoch (from the real time when made), moved on only by the test (:attr:`now`)."""

    def __init__(self) -> None:
        self.now = float(int(time.time()))

    def __call__(self) -> float:
        return self.now

    def time_ns(self) -> int:
        return int(self.now * 1e9)

    @classmethod
    def dating_checkpoints(cls, monkeypatch) -> "WallClock":
        """A clock that also dates every checkpoint written (``time.time_ns``, which manifests read, replaced)."""
        clock = cls()
        monkeypatch.setattr("time.time_ns", clock.time_ns)
        return clock
