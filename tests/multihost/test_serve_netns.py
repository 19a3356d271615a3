"""Multi-host serving (spec §41 layer c): `swactor orchestrator --serve` over 3 stage hosts,
each its own network namespace on one bridge, found by SWIM through the first node.

The orchestrator host serves the OpenAI-compatible API on its own subnet address; the
client (the `openai` package, `tests.serve.api_checks`) runs in that host's namespace
too and reaches it over the bridge's veth, so requests, QUIC between the stages and SWIM
all cross real links. The API suite of the loopback tests runs against the 3-stage
pipeline (split 10,10,10): models and health, completion and chat streamed and not
(greedy: a stream equals its non-streamed answer), 4 concurrent streams each equal to
its prompt asked alone, and OpenAI's error object for bad requests. Then SIGTERM: the
orchestrator and every node exit 0 and no process is left in any namespace.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from swactor.cluster.netns import NetnsTopology
from swactor.model.paths import default_model_path
from swactor.testing.netns_pool import STAGES, pool_file, seed, start_node, wait_available
from swactor.testing.serve_process import ROOT, ServeProcess
from swactor.transport.identity import NodeIdentity
from tests.multihost.pool import MARKS
from tests.serve import api_checks

pytestmark = [*MARKS, pytest.mark.timeout(1500)]

HTTP_PORT = 8000
BOOT_S = 900.0


def test_the_api_across_four_namespaces(topology: NetnsTopology, tmp_path: Path) -> None:
    if not default_model_path().is_file():
        pytest.fail(f"{default_model_path()} missing: run scripts/setup.sh")
    keys, events = tmp_path / "keys", tmp_path / "events"
    keys.mkdir(mode=0o700)
    events.mkdir()
    orchestrator_id = NodeIdentity.load_or_create(keys / "orchestrator.key").node_id
    nodes = [start_node(topology, name, keys, events, orchestrator_id) for name in STAGES]
    orch = topology["orch"]
    serve: ServeProcess | None = None
    try:
        wait_available(nodes)
        serve = ServeProcess([
            "orchestrator", "--key", str(keys / "orchestrator.key"), "--bind", orch.address,
            "--seed", seed(topology), "--nodes", str(len(STAGES)),
            "--pool", str(pool_file(keys)), "--split", "10,10,10", "--max-seq-len", "256",
            "--serve", f"{orch.address}:{HTTP_PORT}", "--slots", "4", "--warm-prompt-tokens", "0",
            "--warm-batch-rows", "0",
            "--event-verbosity", "-1", "--events-file", str(events / "orchestrator.jsonl")],
            prefix=orch.argv([]))
        url = serve.wait_url(BOOT_S)
        assert url == f"http://{orch.address}:{HTTP_PORT}"
        done = subprocess.run(orch.argv([sys.executable, "-m", "tests.serve.api_checks", url]),
                              capture_output=True, text=True, cwd=ROOT, timeout=900,
                              check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads(done.stdout.splitlines()[-1])
    finally:
        code = serve.stop() if serve is not None else 0
        node_codes = [node.stop(30) for node in nodes]
    assert code == 0, serve.describe() if serve is not None else ""
    assert node_codes == [0, 0, 0], [node.describe() for node in nodes]
    for name in topology.hosts:
        assert topology.pids(name) == [], f"processes left in {name}"

    assert report["health"][0] == 200 and report["health"][1]["state"] == "Serving"
    assert len(report["models"]) == 1
    alone = report["alone"]
    assert all(answer["text"] for answer in alone.values())
    assert report["stream"]["text"] == alone[api_checks.PROMPTS[0]]["text"]
    assert len(report["stream"]["pieces"]) > 1
    assert api_checks.CHAT[1] in report["chat"]["text"]
    assert report["stream_chat"]["text"] == report["chat"]["text"]
    assert [s["text"] for s in report["concurrent"]] == [
        alone[p]["text"] for p in api_checks.PROMPTS]
    bad = report["bad"]
    assert {name: row[0] for name, row in bad.items()} == dict.fromkeys(bad, 400)
    assert bad["prompt_over_context"][2] == "context_length_exceeded"
