"""Peer liveness: fault a process's rings when it dies, and wake their other sides.

Theory of operation
-------------------
A ring's peer can die at any moment (kill -9, OOM).  Shared memory does not tell: the
survivor would sleep forever on a wake that never comes.  The node learns it on the
worker-control path - the worker is its child, so a `pidfd` (or the asyncio child
watcher, or EOF on the worker's stdout) reports the exit.  The reaction is the same in
every case, `fault_and_wake`: record `RingFaultReason.WorkerProcessExited` in each
ring's shared state word (the first fault reason wins), then notify both wake
directions so a blocked producer or consumer re-checks and raises `RingFaulted`
instead of hanging.

`PeerWatch` packages this for blocking code: a daemon thread polls the peer's pidfd
(and a stop eventfd) and calls `fault_and_wake` when the peer exits.  Asyncio code
(GpuWorkerCtl) calls `fault_and_wake` from its own exit handler.  The watcher faults
rings through its *own* handles (`Ring.open`), never through a handle another thread
is using.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Sequence

from swactor.ring.ring import Ring
from swactor.ring.wake import Wake
from swactor.wire import RingFaultReason


def fault_and_wake(
    rings: Sequence[Ring],
    wakes: Sequence[Wake],
    reason: RingFaultReason = RingFaultReason.WorkerProcessExited,
) -> None:
    """Fault every ring (first reason wins), then notify every wake channel."""
    for ring in rings:
        ring.fault(reason)
    for ring in rings:
        for wake in wakes:
            wake.notify(ring.ring_id)


class PeerWatch:
    """Watches process `pid`; on its exit, `fault_and_wake(rings, wakes, reason)`."""

    def __init__(
        self,
        pid: int,
        rings: Sequence[Ring],
        wakes: Sequence[Wake],
        reason: RingFaultReason = RingFaultReason.WorkerProcessExited,
    ) -> None:
        self.pid = pid
        self.rings = list(rings)
        self.wakes = list(wakes)
        self.reason = reason
        self.exited = threading.Event()
        self._pidfd = os.pidfd_open(pid)
        self._stop = os.eventfd(0, os.EFD_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name=f"peer-watch-{pid}", daemon=True)

    def start(self) -> PeerWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._pidfd, select.POLLIN)
        poller.register(self._stop, select.POLLIN)
        ready = {fd for fd, _ in poller.poll()}
        if self._pidfd in ready:
            self.exited.set()
            fault_and_wake(self.rings, self.wakes, self.reason)

    def stop(self) -> None:
        """Stop watching (idempotent) and close the watcher's fds."""
        if self._stop < 0:
            return
        os.eventfd_write(self._stop, 1)
        if self._thread.ident is not None:
            self._thread.join()
        os.close(self._pidfd)
        os.close(self._stop)
        self._stop = -1

    def __enter__(self) -> PeerWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
