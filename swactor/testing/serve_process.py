"""`ServeProcess`: a real `swactor serve` (or `swactor orchestrator --serve`) subprocess
for the end-to-end tests: started, its URL read from stdout, stopped with SIGTERM.

The process runs this checkout's interpreter (`sys.executable`, the worktree's venv), in
its own session. A reader thread keeps its stdout and the last lines of its stderr; the
URL is the `serving on http://...` line. `stop()` sends SIGTERM and returns the exit
status; a process still running after the wait is killed (its group), so no test leaves
nodes behind, and the test then fails on the status.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_URL = re.compile(r"^serving on (http://\S+)$")


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children first, then theirs)."""
    found: list[int] = []
    frontier = [pid]
    while frontier:
        parent = frontier.pop(0)
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except FileNotFoundError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as handle:
                    children = [int(c) for c in handle.read().split()]
            except FileNotFoundError:
                continue
            found += children
            frontier += children
    return found


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except FileNotFoundError:
        return ""


class ServeProcess:
    """One serving process (module doc)."""

    def __init__(self, argv: Sequence[str], *, prefix: Sequence[str] = ()) -> None:
        self.argv = [*prefix, sys.executable, "-m", "swactor.cli", *argv]
        self.process = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True)
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.url = ""
        self._seen = threading.Condition()
        assert self.process.stdout is not None and self.process.stderr is not None
        self._threads = [threading.Thread(target=self._read, args=(stream, sink), daemon=True)
                         for stream, sink in ((self.process.stdout, self.stdout),
                                              (self.process.stderr, self.stderr))]
        for thread in self._threads:
            thread.start()

    def _read(self, stream: object, sink: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            with self._seen:
                sink.append(line.rstrip("\n"))
                del sink[:-400]
                self._seen.notify_all()

    def describe(self) -> str:
        return (f"{' '.join(self.argv)} (exit {self.process.poll()})\nstderr:\n"
                + "\n".join(self.stderr[-40:]))

    def wait_url(self, timeout_s: float) -> str:
        """The served URL, once printed; AssertionError with the stderr tail otherwise."""
        deadline = time.monotonic() + timeout_s
        with self._seen:
            while True:
                for line in self.stdout:
                    match = _URL.match(line)
                    if match:
                        self.url = match.group(1)
                        return self.url
                left = deadline - time.monotonic()
                assert left > 0 and self.process.poll() is None, (
                    f"no 'serving on' line: {self.describe()}")
                self._seen.wait(min(left, 1.0))

    def stop(self, timeout_s: float = 90.0) -> int:
        """SIGTERM, wait; kill the group if it is still there. The exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            raise AssertionError(f"did not stop within {timeout_s}s: {self.describe()}") \
                from None
        finally:
            for thread in self._threads:
                thread.join(5)
