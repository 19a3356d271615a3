"""Multi-host (netns): 3 stage nodes and 1 orchestrator, each in its own Linux network
namespace, joined by veth pairs to a bridge (in a namespace of its own) that the test
creates and removes. Real addresses, real SWIM between namespaces (the orchestrator
finds the pool through a seed), real QUIC, SmolLM2 over a 10,10,10 split: 16 greedy
tokens equal to the single-stage tokens of the model package, computed here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from swactor.model.gguf_range import open_reader
from swactor.model.llama_role import StageRole
from swactor.model.paths import default_model_path
from swactor.model.tokenizer import Tokenizer
from swactor.transport.identity import NodeIdentity

pytestmark = [
    pytest.mark.multihost,
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2"
    ),
]
ROOT = Path(__file__).resolve().parents[2]
TOKENS = 16
MAX_SEQ = 64
PROMPT = "hello world"
SWIM_PORT = 7946


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def hosts() -> Iterator[tuple[list[str], list[str]]]:
    """([orchestrator ns, node ns x3], [their addresses]) on one bridged subnet."""
    tag = f"{os.getpid() % 100000}"
    subnet = f"10.{90 + os.getpid() % 100}.{os.getpid() % 250}"
    bridge_ns = f"swc{tag}br"
    names = [f"swc{tag}o", *(f"swc{tag}n{i}" for i in range(3))]
    addresses = [f"{subnet}.{10 + i}" for i in range(4)]
    created: list[str] = []
    try:
        for ns in (bridge_ns, *names):
            _ip("netns", "add", ns)
            created.append(ns)
        _ip("-n", bridge_ns, "link", "add", "br0", "type", "bridge")
        _ip("-n", bridge_ns, "link", "set", "br0", "up")
        for i, (ns, address) in enumerate(zip(names, addresses, strict=True)):
            inner, outer = f"sc{tag}h{i}", f"sc{tag}b{i}"
            _ip("link", "add", inner, "type", "veth", "peer", "name", outer)
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", outer, "netns", bridge_ns)
            _ip("-n", bridge_ns, "link", "set", outer, "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "mtu", "1500", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield names, addresses
    finally:
        for ns in reversed(created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _swactor(ns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", ns, sys.executable, "-m", "swactor.cli", *args]


def reference_tokens(path: Path) -> list[int]:
    prompt = tuple(Tokenizer.from_gguf(path).encode(PROMPT))
    whole = StageRole(open_reader(path).load_stage(0, 30, is_first=True, is_last=True),
                      max_seq_len=MAX_SEQ)
    tokens: list[int] = []
    ids = prompt
    for step in range(TOKENS):
        tokens.append(int(whole.step(step, np.array(ids, dtype=np.int32))[0]))
        ids = (tokens[-1],)
    return tokens


def test_three_namespaced_nodes_match_one_stage(
    hosts: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    model = default_model_path()
    if not model.is_file():
        pytest.fail(f"{model} missing: run scripts/setup.sh")
    names, addresses = hosts
    orchestrator_id = NodeIdentity.load_or_create(tmp_path / "orchestrator.key").node_id
    seed = f"{addresses[1]}:{SWIM_PORT}"
    nodes = []
    try:
        for i in range(3):
            address = addresses[1 + i]
            nodes.append(subprocess.Popen(
                _swactor(names[1 + i], "node", "--key", str(tmp_path / f"node{i}.key"),
                         "--bind", address, "--swim", f"{address}:{SWIM_PORT}",
                         "--seed", seed, "--trust-orchestrator", str(orchestrator_id),
                         "--events-file", str(tmp_path / f"node{i}.jsonl"),
                         "--event-verbosity", "-1"),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT))
        orchestrator = subprocess.run(
            _swactor(names[0], "orchestrator", "--key", str(tmp_path / "orchestrator.key"),
                     "--bind", addresses[0], "--seed", seed, "--nodes", "3",
                     "--split", "10,10,10", "--prompt", PROMPT, "--max-tokens", str(TOKENS),
                     "--max-seq-len", str(MAX_SEQ), "--json",
                     "--events-file", str(tmp_path / "orchestrator.jsonl"),
                     "--event-verbosity", "-1"),
            capture_output=True, text=True, cwd=ROOT, timeout=600)
        assert orchestrator.returncode == 0, orchestrator.stderr[-3000:]
        report = json.loads(orchestrator.stdout.strip().splitlines()[-1])
    finally:
        for node in nodes:
            node.terminate()
        outputs = [node.communicate(timeout=60) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0, 0], [e[-2000:] for _, e in outputs]
    assert (report["outcome"], report["teardown"]) == ("Completed", "Clean")
    assert [(s["layer_start"], s["layer_end_exclusive"]) for s in report["stages"]] == [
        (0, 10), (10, 20), (20, 30)]
    assert report["generated_token_ids"] == reference_tokens(model)
    for out, _ in outputs:
        lines = [json.loads(line) for line in out.splitlines()]
        assert lines[0]["kind"] == "available" and lines[0]["quic"][0] in addresses
        finished = [line for line in lines if line["kind"] == "stage_finished"]
        assert len(finished) == 1 and finished[0]["clean"] is True
        assert finished[0]["live_leases"] == []
