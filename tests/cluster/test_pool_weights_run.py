"""Weights from the pool, end to end (slow): 3 `swactor node` processes with empty,
separate model caches and an orchestrator that offers SmolLM2 (`offer_model`), so the
plan names no path and the only way for weights to reach a node is to fetch its own
ranges over QUIC. The greedy tokens equal the single-stage ones; each stage fetches at
most 1.05x its share; the second run fetches nothing (the orchestrator serves 0 bytes).
A third run with a new split needs new ranges for stages 1 and 2 (stage 0 keeps a prefix of
its cached range) while the orchestrator flips a byte of every range it serves
(`artifact.range` fault): the run faults WeightLoadFailed at whichever of stages 1 and 2
checks its fetch first, and that node names the file's digest; the nodes still exit 0.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from swactor import faults
from swactor.cluster.launcher import LocalCluster
from swactor.events.emitter import configure
from swactor.model.fetch import offer_file
from swactor.model.paths import default_model_path
from swactor.model.tokenizer import Tokenizer
from swactor.orchestrator.session import SessionOptions, run_session
from swactor.wire import RunFaultReason, RunOutcome, TeardownOutcome
from tests import single_stage

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TOKENS = 6
MAX_SEQ = 64
PROMPT = "hello world"


async def scenario(tmp: Path) -> None:
    shipped = default_model_path()
    if not shipped.is_file():
        pytest.fail(f"{shipped} missing: run scripts/setup.sh")
    model = tmp / "orchestrator-only" / "model.gguf"  # a path no node is told about
    model.parent.mkdir()
    shutil.copyfile(shipped, model)
    caches = [tmp / f"cache-{i}" for i in range(3)]
    for cache in caches:
        cache.mkdir()
    cluster = LocalCluster(3, tmp / "keys", models_dirs=caches, log_level="INFO")
    emitter = configure("orchestrator-test", str(tmp / "orchestrator.jsonl"), verbosity=None)
    sha = offer_file(model).sha256
    try:
        members = await cluster.start()
        base = SessionOptions(identity=cluster.orchestrator, nodes=members, model=model,
                              admission=cluster.admission,  # pins the nodes' full keys
                              prompt=PROMPT, max_tokens=TOKENS, max_seq_len=MAX_SEQ,
                              offer_model=True)
        prompt = tuple(Tokenizer.from_gguf(model).encode(PROMPT))
        expected = single_stage.reference_tokens(model, 30, prompt, TOKENS, MAX_SEQ)
        served = []
        for run in (1, 2):
            report = await run_session(replace(base, run_id=run), emitter, io.StringIO(),
                                       io.StringIO())
            result = report.result
            assert result.outcome is RunOutcome.Completed, report.summary_lines()
            assert result.teardown is TeardownOutcome.Clean, report.summary_lines()
            assert result.generated_token_ids == expected, f"run {run}"
            served.append(report.weights_served_bytes)
            await cluster.wait_reports(run, timeout_s=60)
            for node in cluster.nodes:
                last = [r for r in node.reports if r["kind"] == "stage_finished"][-1]
                fetched = last["weights_fetched"]
                if run == 1:
                    ratio = fetched["fetched_bytes"] / fetched["share_bytes"]
                    print(f"node {node.index}: fetched {fetched['fetched_bytes']} bytes "
                          f"for a {fetched['share_bytes']}-byte share ({ratio:.3f})")
                    assert fetched["manifest_fetched"] and 0 < ratio <= 1.05, fetched
                else:
                    assert (fetched["fetched_bytes"], fetched["manifest_fetched"]) == (0, False)
        assert served[0] > 0 and served[1] == 0, served
        assert sum(len(list(c.rglob("*.gguf"))) for c in caches) == 0
        for cache in caches:
            assert (cache / "fetched" / sha / "data").is_file()
        progress = [line for node in cluster.nodes for line in node.stderr_tail
                    if "fetched" in line and "bytes" in line]
        assert progress, "no progress line"
        # run 3: a new split needs new chunks for stages 1 and 2, and the orchestrator flips
        # a byte in every range it serves: the first of them to check its fetch faults
        # WeightLoadFailed naming the file (which one is first is a race between them)
        faults_file = tmp / "faults.json"
        faults_file.write_text(json.dumps({"faults": [{"point": "artifact.range"}]}))
        os.environ[faults.ENV_FILE] = str(faults_file)
        try:
            report = await run_session(replace(base, run_id=3, split=(5, 10, 15)), emitter,
                                       io.StringIO(), io.StringIO())
        finally:
            del os.environ[faults.ENV_FILE]
        result = report.result
        # The teardown outcome is not asserted here: stage 0 (its ranges cached) may be
        # establishing its edge to stage 1 when stage 1 faults, seconds into its fetch,
        # and that edge can then stop unclean (the edges' teardown, not the weights).
        assert result.outcome is RunOutcome.Faulted, report.summary_lines()
        assert result.fault is not None
        assert result.fault.reason is RunFaultReason.WeightLoadFailed, result.fault
        assert result.fault.stage_index in (1, 2), result.fault
        await cluster.wait_reports(3, timeout_s=60)
        faulted = cluster.nodes[result.fault.stage_index].stderr_tail
        assert any("DigestMismatch" in line and sha in line for line in faulted), faulted[-5:]
    finally:
        codes = await cluster.stop()
        emitter.close()
    assert codes == [0, 0, 0]


def test_nodes_with_empty_caches_fetch_their_ranges_once(tmp_path: Path) -> None:
    asyncio.run(scenario(tmp_path))
