"""A py-spy profile of one stage's worker and node process during decode.

Theory of operation
-------------------
`profile_stage(start_run, stage, warmup)` starts a run through `start_run(during)` and,
in `during(events_dir)`, waits until the orchestrator's event log shows ``warmup + 2``
tokens (prefill and the kernel-compiling first decode steps are over), finds the node
whose ``stage_ready`` names ``stage`` (its ``pid`` field) and that node's worker child
(``python -m swactor.worker``), and samples both with ``py-spy record --nonblocking``
(no pauses of the sampled process) at 100 Hz for ``seconds``, in raw (collapsed stack)
form. Idle samples (a thread blocked in a read) are not recorded, so the shares are of
the time a process was running Python or native code.

`summarise` folds the collapsed stacks into self time (the innermost frame) and inclusive
time (every distinct frame of a stack) per function (``name (file)``, line dropped).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

RATE_HZ = 100
SECONDS = 5
WAIT_S = 300.0


def _pyspy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def _tokens(path: Path) -> int:
    try:
        return path.read_text().count('"token_received"')
    except OSError:
        return 0


def _stage_pid(events_dir: Path, stage: int) -> int | None:
    for path in sorted(events_dir.glob("node-*.jsonl")):
        for line in path.read_text().splitlines():
            if '"stage_ready"' in line:
                record = json.loads(line)
                if record.get("stage_index") == stage:
                    return int(record["pid"])
    return None


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as handle:
            kids += [int(k) for k in handle.read().split()]
    return kids


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        return handle.read().replace(b"\0", b" ").decode(errors="replace")


_REPO = f"{Path(__file__).resolve().parents[1]}/"
"""This checkout's root: frames of its own files are shown relative to it."""


def _short(frame: str) -> str:
    """'fn (/x/site-packages/tinygrad/a.py:12)' -> 'fn (tinygrad/a.py)'."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", _REPO, "lib/python3.11/"):
        if marker in where:
            where = where.split(marker, 1)[1]
    return f"{name} ({where})" if where else name


def summarise(raw: str, top: int = 8) -> dict[str, Any]:
    """Self and inclusive sample shares per function from py-spy raw output."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_short(f) for f in stack.split(";")]
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    if total == 0:
        return {"samples": 0, "self": [], "inclusive": []}
    return {
        "samples": total,
        "self": [{"function": f, "share": c / total} for f, c in own.most_common(top)],
        "inclusive": [{"function": f, "share": c / total}
                      for f, c in inclusive.most_common(top + 12)],
    }


def profile_stage(start_run: Callable[[Callable[[Path, int], None]], Any], stage: int,
                  warmup: int, seconds: int = SECONDS) -> dict[str, Any]:
    """Profile stage `stage`'s worker and node during decode (module doc)."""
    pyspy = _pyspy()
    if pyspy is None:
        return {"error": "py-spy is not installed (pip install py-spy)"}
    found: dict[str, Any] = {}

    def during(events_dir: Path, _root: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while _tokens(events_dir / "orchestrator.jsonl") < warmup + 2:
            if time.monotonic() > deadline:
                found["error"] = f"fewer than {warmup + 2} tokens within {WAIT_S:.0f}s"
                return
            time.sleep(0.1)
        node = _stage_pid(events_dir, stage)
        if node is None:
            found["error"] = f"no stage_ready for stage {stage}"
            return
        workers = [p for p in _children(node) if "swactor.worker" in _cmdline(p)]
        if not workers:
            found["error"] = f"node {node} has no swactor.worker child"
            return
        with tempfile.TemporaryDirectory(prefix="swactor-pyspy-") as tmp:
            outs = {"worker": Path(tmp) / "worker.txt", "node": Path(tmp) / "node.txt"}
            pids = {"worker": workers[0], "node": node}
            spies = {
                name: subprocess.Popen(
                    [pyspy, "record", "--pid", str(pids[name]), "--duration", str(seconds),
                     "--rate", str(RATE_HZ), "--nonblocking", "--format", "raw",
                     "-o", str(outs[name])],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                for name in outs}
            for name, spy in spies.items():
                _, err = spy.communicate(timeout=seconds + 60)
                if spy.returncode == 0 and outs[name].exists():
                    found[name] = summarise(outs[name].read_text())
                    found[name]["pid"] = pids[name]
                else:
                    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("note:")]
                    found[name] = {"error": (lines or ["no output"])[0][:300]}
        found.update(seconds=seconds, rate_hz=RATE_HZ, stage=stage)

    try:
        start_run(during)
    except Exception as error:  # the profile is one figure; its run failing is reported
        found.setdefault("error", f"profiled run: {type(error).__name__}: {error}")
    return found
