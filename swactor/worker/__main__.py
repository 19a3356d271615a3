"""`python -m swactor.worker`: the GPU worker process (spec §28-§34).

Commands arrive on stdin and events leave on stdout, one JSON line each; logs go to
stderr. The exit status is 0 after WorkerStopped or a closed stdin, 1 after WorkerFatal.
"""

from __future__ import annotations

import logging
import sys

from swactor import faults, heap, memtrace
from swactor.ring import WorkerDoorbells
from swactor.worker.adapter import EventWriter
from swactor.worker.process import WorkerProcess


def main() -> int:
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="worker %(levelname)s %(name)s: %(message)s"
    )
    memtrace.install("worker")  # SWACTOR_MEMTRACE (soak diagnosis; off by default)
    try:
        doorbells = WorkerDoorbells.from_env()
    except (ValueError, OSError) as exc:  # the node's hints would go unheard: refuse
        logging.getLogger("swactor.worker").error("doorbells: %s", exc)
        return 1
    worker = WorkerProcess(EventWriter(sys.stdout.buffer), doorbells, faults.from_env())
    heap.settle()  # imports done: later per-run collections skip them (swactor.heap)
    return worker.run(sys.stdin.buffer)


if __name__ == "__main__":
    sys.exit(main())
