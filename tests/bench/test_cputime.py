"""CPU time per token from /proc, on real child processes that burn a known amount of CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from bench._cputime import CpuSampler, cpu_s, main_thread_s, tree

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def test_tree_and_cpu_seconds_of_a_real_child() -> None:
    child = subprocess.Popen([sys.executable, "-c", BURN.format(s=0.3)])
    try:
        assert child.pid in tree(os.getpid())
        child.wait(30)
    finally:
        child.kill()
    # a reaped child is gone: no CPU figure, no tree entry
    assert cpu_s(child.pid) is None
    assert child.pid not in tree(os.getpid())
    own = cpu_s(os.getpid())
    assert own is not None and own > 0


def test_main_thread_seconds_leave_out_a_busy_helper_thread() -> None:
    import threading

    before_main, before_all = main_thread_s(os.getpid()), cpu_s(os.getpid())
    assert before_main is not None and before_all is not None

    def burn() -> None:
        started = time.thread_time()
        while time.thread_time() - started < 0.3:
            pass

    helper = threading.Thread(target=burn)
    helper.start()
    helper.join()
    after_main, after_all = main_thread_s(os.getpid()), cpu_s(os.getpid())
    assert after_main is not None and after_all is not None
    assert after_all - before_all >= 0.25  # the process counts the helper's 0.3 s
    assert after_main - before_main < 0.1  # its main thread only waited for it
    assert main_thread_s(2**22 + 12345) is None  # no such process


CHILD = """
import json, sys, time
log = sys.argv[1]
def token(sequence):
    with open(log, "a") as handle:
        handle.write(json.dumps({"event": "token_received", "sequence": sequence}) + "\\n")
token(0)
time.sleep(1.0)  # the sampler reads the CPU times now
t = time.process_time()
while time.process_time() - t < 0.4:
    pass
for sequence in range(1, 5):
    token(sequence)
time.sleep(30)
"""


def test_sampler_divides_the_cpu_of_a_window_by_its_tokens(tmp_path: Path) -> None:
    # the run process writes token 0, idles, burns 0.4 CPU-s, then writes tokens 1..4
    log = tmp_path / "orchestrator.jsonl"
    log.write_text("")
    root = subprocess.Popen([sys.executable, "-c", CHILD, str(log)])
    try:
        sampler = CpuSampler(start=1, stop=5)
        sampler(tmp_path, root.pid)
    finally:
        root.kill()
        root.wait()
    assert sampler.result is not None
    assert sampler.result["tokens"] == 4
    (row,) = sampler.result["processes"]
    assert row["role"] == "orchestrator" and row["pid"] == root.pid
    # 0.4 CPU-s over 4 tokens, whatever the machine's load (clock ticks: +-10 ms / 4)
    assert 90 < row["cpu_ms_per_token"] < 130, row
