"""UDP send calls per decode token of each process of a run, counted with strace.

Theory of operation
-------------------
A token's QUIC datagrams leave from each process's main thread (its event loop: the
orchestrator's token edges, a node's edges), one `sendto` per datagram aioquic builds and
one `sendmmsg` per batch the C bulk path seals (a token object is one datagram, so one
call). `SendCounter` is a run's ``during`` hook like `_cputime.CpuSampler`: once
``start`` tokens arrived it attaches ``strace -c`` to the main thread of the `swactor
run` process (the orchestrator) and of each stage's node, and detaches when ``stop``
tokens arrived; calls per token = each process's calls over the tokens received
meanwhile (counted from the moment every strace reported it attached). Only the main
threads are traced (``-p PID`` without ``-f``): a node's SWIM thread, which probes the
pool on its own timer, is left out. strace stops the traced thread at every system
call, so the run is slower while it counts: the counts are the figure, not the run's
timing (an ACK that waits for the answer may wait in vain when the answer comes later,
so they lean to more datagrams, not fewer).
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

from bench._cputime import _stages, _tokens, wait_tokens

SYSCALLS = ("sendto", "sendmsg", "sendmmsg", "recvfrom", "recvmsg", "recvmmsg")
_ROW = re.compile(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$")


def available() -> str | None:
    """None if strace can count here, else why not."""
    if shutil.which("strace") is None:
        return "strace is not installed"
    return None


def parse_summary(text: str) -> dict[str, int]:
    """syscall -> calls, from `strace -c`'s table (its 'total' row left out)."""
    calls: dict[str, int] = {}
    for line in text.splitlines():
        match = _ROW.match(line)
        if match and match.group(2) != "total":
            calls[match.group(2)] = int(match.group(1))
    return calls


class SendCounter:
    """UDP system calls per token of each process's main thread (module doc)."""

    def __init__(self, start: int, stop: int) -> None:
        self.start, self.stop = start, stop
        self.result: dict[str, Any] | None = None

    def __call__(self, events_dir: Path, root: int) -> None:
        wait_tokens(events_dir, self.start, root)
        names = {root: "orchestrator"} | {
            pid: f"node {stage}" for pid, stage in sorted(_stages(events_dir).items(),
                                                          key=lambda item: item[1])}
        traces = {name: subprocess.Popen(
            ["strace", "-c", "-e", "trace=" + ",".join(SYSCALLS), "-p", str(pid)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for pid, name in names.items()}
        for trace in traces.values():  # counting starts once each strace has attached
            assert trace.stderr is not None
            while (line := trace.stderr.readline()) and "attached" not in line:
                pass
        first = _tokens(events_dir)
        last = wait_tokens(events_dir, self.stop, root)
        for trace in traces.values():
            trace.send_signal(signal.SIGINT)
        calls = {name: parse_summary(trace.communicate()[1]) for name, trace in traces.items()}
        tokens = last - first
        if tokens <= 0:
            return
        per_token = {name: {k: v / tokens for k, v in found.items()}
                     for name, found in calls.items()}
        sends = {name: sum(v for k, v in found.items() if k.startswith("send"))
                 for name, found in per_token.items()}
        self.result = {"tokens": tokens, "calls_per_token": per_token,
                       "sends_per_token": sends, "sends_per_token_total": sum(sends.values())}


__all__ = ["SendCounter", "available", "parse_summary"]
