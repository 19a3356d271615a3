"""`swactor serve --nodes 3` end to end: a 3-stage pipeline (three real nodes and
workers, QUIC between them, SmolLM2 split across them) behind the `openai` client.

The 1-node module (`test_e2e_serve.py`) covers the whole API and the faults; this one
proves what changes with stages: the same answers through three stages, and 4
concurrent streams interleaved across them, each equal to its prompt asked alone.
`just test` runs the same API checks against 3 stages in `tests/multihost/
test_serve_netns.py` (across network namespaces), so this loopback copy is marked `soak`
(`just soak-tests`) for the suite's time budget.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from swactor.model.paths import default_model_path
from swactor.testing.serve_process import ServeProcess
from tests.serve import api_checks

pytestmark = [pytest.mark.slow, pytest.mark.soak, pytest.mark.timeout(1500)]

BOOT_S = 900.0


@pytest.fixture(scope="module")
def server() -> Iterator[ServeProcess]:
    if not default_model_path().is_file():
        pytest.fail(f"{default_model_path()} missing: run scripts/setup.sh")
    serve = ServeProcess(["serve", "--nodes", "3", "--port", "0", "--slots", "4",
                          "--max-seq-len", "256", "--warm-prompt-tokens", "0",
                          "--warm-batch-rows", "0"])
    try:
        serve.wait_url(BOOT_S)
        yield serve
    finally:
        assert serve.stop() == 0, serve.describe()


def test_three_stages_serve_completion_chat_and_concurrent_streams(
        server: ServeProcess) -> None:
    status, health = api_checks.get_json(server.url, "/health")
    assert status == 200 and health["state"] == "Serving"
    alone = {p: api_checks.complete(server.url, p) for p in api_checks.PROMPTS}
    assert all(a["text"] for a in alone.values())
    assert api_checks.stream_complete(server.url, api_checks.PROMPTS[0])["text"] == \
        alone[api_checks.PROMPTS[0]]["text"]
    question, word = api_checks.CHAT
    assert word in str(api_checks.chat(server.url, question)["text"])
    texts = [s["text"] for s in api_checks.concurrent_streams(server.url)]
    assert texts == [alone[p]["text"] for p in api_checks.PROMPTS]
