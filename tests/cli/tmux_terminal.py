"""A real terminal for tests: a tmux server of the test's own (its own socket), each command in a window of it.

Keys go in with ``send-keys``; the screen comes out with ``capture-pane`` (wrapped lines joined, the whole
scrollback). A test waits for what it expects by polling the screen until it is there, under a generous
deadline (the machine is shared), never by sleeping a fixed time. Windows stay after their command ends, so
its last screen and exit status can be read.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

DEADLINE = 300.0
"""Seconds a wait may take before the test fails (the model loads and the replies run on a shared CPU)."""
POLL = 0.1


class Window:
    """One command running in the terminal."""

    def __init__(self, tmux: "Tmux", target: str) -> None:
        self.tmux = tmux
        self.target = target

    def send(self, text: str) -> None:
        """Type ``text`` and press Enter."""
        self.tmux.run("send-keys", "-t", self.target, "-l", text)
        self.keys("Enter")

    def keys(self, *keys: str) -> None:
        """Press ``keys`` (tmux key names: ``C-c``, ``C-d``, ``Enter``)."""
        self.tmux.run("send-keys", "-t", self.target, *keys)

    def screen(self) -> str:
        """Everything the window's command has shown, wrapped lines joined, trailing blanks dropped (and tmux's
        own line saying the command ended)."""
        text = self.tmux.run("capture-pane", "-p", "-J", "-S", "-", "-t", self.target)
        lines = [line.rstrip() for line in text.splitlines() if not line.startswith("Pane is dead (")]
        return "\n".join(lines).rstrip("\n")

    def wait(self, ready: Callable[[str], bool], what: str) -> str:
        """The screen once ``ready(screen)`` holds; fails the test naming ``what`` after :data:`DEADLINE`."""
        deadline = time.monotonic() + DEADLINE
        while True:
            screen = self.screen()
            if ready(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"waited {DEADLINE:.0f} s for {what}; the screen:\n{screen}")
            time.sleep(POLL)

    def value(self, name: str) -> str:
        """A tmux format variable of the window's pane (``pane_pid``, ``pane_dead``, ...)."""
        return self.tmux.run("display-message", "-p", "-t", self.target, f"#{{{name}}}").strip()

    @property
    def pid(self) -> int:
        return int(self.value("pane_pid"))

    def exit_status(self) -> int:
        """The command's exit status once it has ended (minus the signal's number if a signal ended it).

        tmux 3.3 may mark a pane dead when its terminal closes and leave its process unreaped, with no status
        (tmux/tmux#4841); the status is then read from the zombie's ``/proc`` entry (Linux)."""
        pid = self.pid
        self.wait(lambda _: self.value("pane_dead") == "1", "the command to end")
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            status = self.value("pane_dead_status") or (f"-{self.value('pane_dead_signal')}"
                                                        if self.value("pane_dead_signal") else "")
            if status:
                return int(status)
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except FileNotFoundError:
                continue  # reaped since: tmux has its status now
            if fields[0] == "Z":
                return os.waitstatus_to_exitcode(int(fields[49]))  # field 52, exit_code
            time.sleep(POLL)
        raise AssertionError(f"no exit status of process {pid} within {DEADLINE:.0f} s")


class Tmux:
    """A tmux server of its own; :meth:`start` runs a command in a new window of it."""

    def __init__(self, width: int = 160, height: int = 50) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="kvckpt-tmux-"))  # short: a socket path has ~100 bytes
        config = self.directory / "tmux.conf"
        config.write_text("set -g remain-on-exit on\nset -g history-limit 50000\n")
        self.base = ["tmux", "-S", str(self.directory / "socket"), "-f", str(config)]
        self.size = (width, height)
        self.windows = 0

    def run(self, *args: str) -> str:
        return subprocess.run([*self.base, *args], check=True, capture_output=True, text=True,
                              env={k: v for k, v in os.environ.items() if k != "TMUX"}).stdout

    def start(self, argv: list[str], env: dict[str, str]) -> Window:
        """Run ``argv`` with ``env`` added to this process's environment, as the window's process itself."""
        self.windows += 1
        name = f"w{self.windows}"
        command = "exec env " + shlex.join([f"{k}={v}" for k, v in env.items()] + argv)
        if self.windows == 1:
            width, height = self.size
            self.run("new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height), "-n", name, command)
        else:
            self.run("new-window", "-d", "-t", "t", "-n", name, command)
        return Window(self, f"t:{name}")

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True)
        shutil.rmtree(self.directory, ignore_errors=True)
