"""`HostProcess`: one `swactor` process started inside a test host's namespace.

Theory of operation. The process is `ip netns exec NS python -m swactor.cli ...` (the
`ip` process execs Python, so the pid is the swactor process itself), in its own
session, with stdin closed. Two reader threads collect its stdout JSON lines into
`documents` (non-JSON lines are kept in `stdout_tail`) and the last lines of its stderr
into `stderr_tail`; `wait_for(predicate)` blocks until a collected document satisfies
the predicate, failing with the stderr tail when the process exits or the time is up.
`stop()` sends SIGTERM and waits; it never kills (the topology's teardown does that, so
a test can tell a clean exit from a leftover).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from swactor.cluster.netns import Host

ROOT = Path(__file__).resolve().parents[2]
Document = dict[str, Any]


class HostProcessError(AssertionError):
    """The process did not print what the test waited for; names the process."""


class HostProcess:
    """A `swactor` subcommand running inside one host (module doc)."""

    def __init__(self, label: str, host: Host, args: Sequence[str]) -> None:
        self.label = label
        self.host = host
        self.documents: list[Document] = []
        self.stdout_tail: list[str] = []
        self.stderr_tail: list[str] = []
        self._changed = threading.Condition()
        self.process = subprocess.Popen(
            host.argv([sys.executable, "-m", "swactor.cli", *args]),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, cwd=ROOT, start_new_session=True)
        assert self.process.stdout is not None and self.process.stderr is not None
        self._threads = [
            threading.Thread(target=self._read_stdout, args=(self.process.stdout,), daemon=True),
            threading.Thread(target=self._read_stderr, args=(self.process.stderr,), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read_stdout(self, stream: IO[str]) -> None:
        for line in stream:
            with self._changed:
                try:
                    document = json.loads(line)
                except ValueError:
                    self.stdout_tail = [*self.stdout_tail[-20:], line.rstrip()]
                else:
                    if isinstance(document, dict):
                        self.documents.append(document)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def _read_stderr(self, stream: IO[str]) -> None:
        for line in stream:
            with self._changed:
                self.stderr_tail = [*self.stderr_tail[-40:], line.rstrip()]

    def describe(self) -> str:
        return (f"{self.label} in {self.host.netns} (pid {self.pid}, exit "
                f"{self.process.poll()}): " + " | ".join(self.stderr_tail[-8:]))

    def wait_for(self, predicate: Callable[[Document], bool], timeout_s: float) -> Document:
        """The first collected document satisfying `predicate` (waiting for it)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for document in self.documents:
                    if predicate(document):
                        return document
                if self.process.poll() is not None and not self._threads[0].is_alive():
                    raise HostProcessError(f"exited before printing it: {self.describe()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise HostProcessError(f"timed out after {timeout_s:.0f}s: "
                                           f"{self.describe()}")
                self._changed.wait(min(left, 0.5))

    def finish(self, timeout_s: float) -> int:
        """Wait for the process to exit on its own; its exit code."""
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise HostProcessError(f"still running after {timeout_s:.0f}s: "
                                   f"{self.describe()}") from None
        for thread in self._threads:
            thread.join(5)
        return code

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM and wait; the exit code, or None if it is still running."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None
