"""End-to-end benchmark: SmolLM2 through 1, 2 and 3 stage nodes, and where the time goes.

Theory of operation
-------------------
Every figure comes from real runs of the shipped commands, side by side in one
invocation: ``swactor run --nodes N --prompt "hello world" --max-tokens 64 --json``
(N local node processes on loopback, each with its own worker process, plus the
orchestrator), CPU, greedy. The runs are interleaved (1, 2, 3, 1, 2, 3, ...) so that
the load of this shared machine falls on every stage count alike; each figure is
min / median / max over ``--repeat`` runs.

From each run: the session's own time to first token and decode tokens/s (over every
decode token), and, from the lifecycle events every process wrote (`_lifecycle`), the
steady decode rate (tokens past ``--warmup``, after tinygrad compiled the decode
kernels), the per-stage split of a token's time (compute / inbound: ring copies + QUIC /
control / waiting) and the bring-up intervals; while it runs, `_cputime` reads the CPU
time of every process of the run across the steady decode tokens (CPU ms per token, a
figure the machine's load hardly moves). The 3-stage/1-stage ratios are taken per
repeat (the runs next to each other) and summarised.

Then, once each: the same 3-stage run with every host in its own network namespace on a
bridge (`swactor.cluster.netns`; skipped with the reason when namespaces are not
available), the bytes each stage's load path reads from the GGUF against the stage's
share of tensor bytes (`_weights`), and a py-spy profile of one stage's worker and
node during decode (`_profile`).

``main`` prints the figures; ``measure`` returns them as a JSON-able dict for
``bench.report``.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bench._lifecycle import (
    EventsError,
    RunEvents,
    Spread,
    bring_up,
    read_events,
    split_inbound,
    stage_breakdown,
    token_periods_ms,
)

PROMPT = "hello world"
RUN_TIMEOUT_S = 600.0
BOOT_TIMEOUT_S = 180.0


class RunFailed(Exception):
    """A benchmark run did not complete; the message names the command and its stderr tail."""


@dataclass
class Run:
    """One completed run: its session report (the `--json` object) and its events."""

    label: str
    stages: int
    report: dict[str, Any]
    events: RunEvents
    wall_s: float


def _swactor(*args: str) -> list[str]:
    return [sys.executable, "-m", "swactor.cli", *args]


def _last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.splitlines()):
        with contextlib.suppress(ValueError):
            document = json.loads(line)
            if isinstance(document, dict):
                return document
    raise ValueError("no JSON object in the output")


def _finish(label: str, stages: int, process: subprocess.Popen[str], events_dir: Path,
            started: float) -> Run:
    try:
        out, err = process.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise RunFailed(f"{label}: no result within {RUN_TIMEOUT_S:.0f}s") from None
    wall = time.monotonic() - started
    try:
        report = _last_json(out)
    except ValueError:
        tail = " | ".join(err.strip().splitlines()[-4:])
        raise RunFailed(f"{label}: exit {process.returncode}, no report: {tail}") from None
    if report.get("outcome") != "Completed":
        raise RunFailed(f"{label}: outcome {report.get('outcome')} fault {report.get('fault')}")
    records = read_events(sorted(events_dir.glob("*.jsonl")))
    return Run(label, stages, report, RunEvents(records, int(report["run_id"])), wall)


def run_loopback(stages: int, tokens: int, events_dir: Path,
                 during: Callable[[Path, int], None] | None = None) -> Run:
    """`swactor run --nodes stages` on loopback; `during(events_dir, pid)` runs while it
    does (pid: the `swactor run` process)."""
    events_dir.mkdir(parents=True, exist_ok=True)
    argv = _swactor("run", "--nodes", str(stages), "--prompt", PROMPT, "--max-tokens",
                    str(tokens), "--json", "--events-dir", str(events_dir))
    started = time.monotonic()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        if during is not None:
            during(events_dir, process.pid)
        return _finish(f"loopback {stages}-stage", stages, process, events_dir, started)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _read_available(process: subprocess.Popen[str], name: str) -> dict[str, Any]:
    assert process.stdout is not None
    line = process.stdout.readline()
    try:
        document = json.loads(line)
        if document.get("kind") != "available":
            raise ValueError
        return dict(document)
    except ValueError:
        raise RunFailed(f"netns node {name} did not boot (exit {process.poll()})") from None


def run_netns(tokens: int, workdir: Path) -> Run | str:
    """The 3-stage run with orchestrator and nodes each in a network namespace; or why not."""
    from swactor.cluster import netns
    from swactor.membership.admission import add_member
    from swactor.transport.identity import NodeIdentity

    reason = netns.available()
    if reason is not None:
        return reason
    netns.sweep_stale()
    pid = os.getpid()
    subnet = ipaddress.IPv4Network(f"10.{150 + pid % 50}.{pid % 250}.0/24")
    names = ("n0", "n1", "n2")
    keys, events = workdir / "keys", workdir / "events"
    keys.mkdir(parents=True, mode=0o700)
    events.mkdir(parents=True)
    orchestrator_key = NodeIdentity.load_or_create(keys / "orchestrator.key")
    orchestrator = orchestrator_key.node_id
    pool = keys / "pool.txt"  # every process pins the others' full public keys
    add_member(pool, orchestrator_key, "orchestrator", "orch")
    for name in names:
        add_member(pool, NodeIdentity.load_or_create(keys / f"{name}.key"), "node", name)
    nodes: list[subprocess.Popen[str]] = []
    with netns.NetnsTopology(["orch", *names], subnet) as hosts:
        try:
            for name in names:
                host = hosts[name]
                nodes.append(subprocess.Popen(
                    host.argv(_swactor(
                        "node", "--key", str(keys / f"{name}.key"), "--bind", host.address,
                        "--trust-orchestrator", str(orchestrator), "--pool", str(pool),
                        "--arena-ceiling", "256MiB", "--event-verbosity", "-1", "--events-file",
                        str(events / f"{name}.jsonl"))),
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
            members = []
            for name, process in zip(names, nodes, strict=True):
                available = _read_available(process, name)
                host_addr, port = available["quic"]
                members += ["--node", f"{int(available['node_id'])}@{host_addr}:{port}"]
            orch = hosts["orch"]
            started = time.monotonic()
            process = subprocess.Popen(
                orch.argv(_swactor(
                    "orchestrator", "--key", str(keys / "orchestrator.key"), "--bind",
                    orch.address, *members, "--pool", str(pool), "--prompt", PROMPT,
                    "--max-tokens", str(tokens), "--json", "--event-verbosity", "-1",
                    "--events-file", str(events / "orchestrator.jsonl"))),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            return _finish("netns 3-stage", 3, process, events, started)
        finally:
            for process in nodes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in nodes:
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


# -- figures -------------------------------------------------------------------------------


def run_figures(run: Run, warmup: int, ring_gbps: float,
                cpu: dict[str, Any] | None = None) -> dict[str, Any]:
    """One run's figures (module doc); ms unless named otherwise."""
    timings = run.report.get("timings", {})
    periods = token_periods_ms(run.events, warmup)
    steady = 1e3 * len(periods) / sum(periods) if periods else None
    breakdown = []
    for stage, parts in enumerate(stage_breakdown(run.events, warmup)):
        extent = Spread.of(parts["extent"]).median if parts["extent"] else 0.0
        row = {k: Spread.of(v).median for k, v in parts.items() if k != "extent"}
        ring, quic = split_inbound(row["inbound"], extent, ring_gbps)
        breakdown.append({"stage": stage, "extent_bytes": extent, "ring_ms": ring,
                          "quic_ms": quic, **{f"{k}_ms": v for k, v in row.items()}})
    return {
        "label": run.label, "stages": run.stages, "run_id": run.report["run_id"],
        "generated": len(run.report.get("generated_token_ids", [])),
        "ttft_s": timings.get("ttft_s"), "session_tokens_per_s": timings.get("tokens_per_s"),
        "load_s": timings.get("load_s"), "wall_s": run.wall_s,
        "steady_tokens_per_s": steady,
        "token_period_ms": Spread.of(periods).to_json() if periods else None,
        "per_stage_ms": breakdown, "bring_up": bring_up(run.events), "cpu": cpu,
        "cpu_ms_per_token": cpu["total_cpu_ms_per_token"] if cpu else None,
        "layer_ranges": [(s["layer_start"], s["layer_end_exclusive"])
                         for s in run.report.get("stages", [])],
        "generated_token_ids": run.report.get("generated_token_ids", []),
    }


def summarise(runs: list[dict[str, Any]], key: str) -> dict[str, float] | None:
    values = [float(r[key]) for r in runs if r.get(key) is not None]
    return Spread.of(values).to_json() if values else None


def measure(repeat: int = 2, tokens: int = 64, stage_counts: tuple[int, ...] = (1, 2, 3),
            warmup: int = 2, ring_gbps: float = 0.0, netns: bool = True,
            profile: bool = True, log: IO[str] = sys.stdout) -> dict[str, Any]:
    """Every end-to-end figure (module doc) as a JSON-able dict."""
    from bench._cputime import CpuSampler
    from bench._profile import profile_stage
    from bench._weights import weight_bytes

    result: dict[str, Any] = {"prompt": PROMPT, "tokens": tokens, "repeat": repeat,
                              "warmup_tokens": warmup, "ring_gbps_for_split": ring_gbps,
                              "runs": {str(n): [] for n in stage_counts}, "errors": []}
    with tempfile.TemporaryDirectory(prefix="swactor-bench-e2e-") as scratch:
        root = Path(scratch)
        for rep in range(repeat):
            for count in stage_counts:
                print(f"e2e: repeat {rep + 1}/{repeat}, {count} stage(s) ...", file=log,
                      flush=True)
                sampler = CpuSampler(warmup + 2, tokens - 3)
                try:
                    run = run_loopback(count, tokens, root / f"r{rep}-n{count}", sampler)
                    figures = run_figures(run, warmup, ring_gbps, sampler.result)
                except (RunFailed, EventsError) as error:
                    result["errors"].append(str(error))
                    print(f"e2e: {error}", file=log, flush=True)
                    continue
                result["runs"][str(count)].append(figures)
                print(f"e2e:   ttft {figures['ttft_s']:.2f} s, session "
                      f"{figures['session_tokens_per_s']:.2f} tok/s, steady "
                      f"{figures['steady_tokens_per_s']:.2f} tok/s, CPU "
                      f"{figures['cpu_ms_per_token'] or 0:.1f} ms/token", file=log, flush=True)
        result["summary"] = {
            count: {key: summarise(runs, key) for key in
                    ("ttft_s", "session_tokens_per_s", "steady_tokens_per_s", "load_s",
                     "cpu_ms_per_token")}
            for count, runs in result["runs"].items()}
        result["ratio_3_to_1"] = _ratios(result["runs"].get("1", []),
                                         result["runs"].get("3", []))
        if netns:
            print("e2e: netns 3-stage ...", file=log, flush=True)
            try:
                outcome = run_netns(tokens, root / "netns")
                result["netns"] = (outcome if isinstance(outcome, str)
                                   else run_figures(outcome, warmup, ring_gbps))
            except (RunFailed, EventsError, OSError) as error:
                result["netns"] = f"failed: {error}"
        else:
            result["netns"] = "not run (--no-netns)"
        three = result["runs"].get("3") or result["runs"].get(str(max(stage_counts)))
        if three:
            try:
                result["weights"] = weight_bytes([tuple(r) for r in three[0]["layer_ranges"]])
            except Exception as error:  # a reader failure is a figure we could not take
                result["weights"] = f"failed: {type(error).__name__}: {error}"
        if profile:
            print("e2e: profiled 3-stage run (py-spy on stage 1) ...", file=log, flush=True)
            result["profile"] = profile_stage(
                lambda during: run_loopback(3, tokens, root / "profile", during),
                stage=1, warmup=warmup)
    return result


def _ratios(one: list[dict[str, Any]], three: list[dict[str, Any]]) -> dict[str, Any] | None:
    """3-stage/1-stage decode rate, pairing the runs of the same repeat."""
    out: dict[str, Any] = {}
    for key in ("steady_tokens_per_s", "session_tokens_per_s", "cpu_ms_per_token"):
        # for CPU per token, 1-stage over 3-stage: the rate ratio if CPU were the only limit
        pairs = [(b[key] / a[key]) if key.endswith("_per_s") else (a[key] / b[key])
                 for a, b in zip(one, three, strict=False) if a.get(key) and b.get(key)]
        if pairs:
            out[key] = Spread.of(pairs).to_json()
    return out or None


# -- text ------------------------------------------------------------------------------------


def _fmt(spread: dict[str, float] | None, digits: int = 2) -> str:
    if not spread:
        return "n/a"
    return (f"{spread['median']:.{digits}f} [{spread['min']:.{digits}f}.."
            f"{spread['max']:.{digits}f}]")


def print_figures(result: dict[str, Any], out: IO[str] = sys.stdout) -> None:
    print(f"end to end, '{result['prompt']}', {result['tokens']} tokens, greedy, CPU; "
          f"median [min..max] of {result['repeat']} run(s)", file=out)
    for count, summary in result["summary"].items():
        print(f"  {count} stage(s): ttft {_fmt(summary['ttft_s'])} s, decode "
              f"{_fmt(summary['session_tokens_per_s'])} tok/s (session), "
              f"{_fmt(summary['steady_tokens_per_s'])} tok/s (steady), CPU "
              f"{_fmt(summary['cpu_ms_per_token'], 1)} ms/token (all processes)", file=out)
    ratios = result.get("ratio_3_to_1") or {}
    steady = ratios.get("steady_tokens_per_s")
    if steady:
        verdict = "met" if steady["median"] >= 0.9 else "missed"
        print(f"  3-stage / 1-stage steady decode {_fmt(steady)} (goal >= 0.90: {verdict})",
              file=out)
    for error in result["errors"]:
        print(f"  error: {error}", file=out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench e2e", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=2, help="runs per stage count")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--stages", default="1,2,3", help="stage counts to run")
    parser.add_argument("--warmup", type=int, default=2, help="decode tokens left out")
    parser.add_argument("--no-netns", action="store_true")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    result = measure(args.repeat, args.tokens, tuple(int(s) for s in args.stages.split(",")),
                     args.warmup, netns=not args.no_netns, profile=not args.no_profile)
    print_figures(result)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return 0 if not result["errors"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
