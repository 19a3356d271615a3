"""`swactor serve --nodes 1` end to end: real node, worker, QUIC, SmolLM2, the `openai`
client.

One server for the module (its start, a warm pipeline, is the expensive part): the
API (models, health, completion and chat, streamed and not, OpenAI's error object for
bad requests), 4 concurrent greedy streams each equal to its prompt asked alone, prompts
that arrive while others decode riding with their rows (the server runs with
`--mixed-steps on`, so every test here runs with mixed steps), a
client that disconnects mid-stream while every slot is busy (the next request is still
served: each cancel freed its slot, and the run's event log shows each sequence ended
cancelled), then `kill -9` of the stage's worker mid-stream: the run faults naming it
(WorkerCrashed, stage 0), /health goes Recovering then Serving with one more restart,
the stream is migrated to the new run and ends with exactly the undisturbed greedy text
(the serve_session table's migration), and the next request completes on the new run
with the same greedy text as before. The fault test runs last: it replaces the run the
others used. Finally SIGTERM: the server exits 0 and leaves no process behind.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from swactor.model.paths import default_model_path
from swactor.testing.serve_process import ServeProcess, cmdline, descendants
from tests.serve import api_checks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

BOOT_S = 600.0
MAX_SEQ = 512


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    if not default_model_path().is_file():
        pytest.fail(f"{default_model_path()} missing: run scripts/setup.sh")
    events = tmp_path_factory.mktemp("serve-events")
    serve = ServeProcess(["serve", "--nodes", "1", "--port", "0", "--slots", "4",
                          "--warm-prompt-tokens", "0", "--warm-batch-rows", "0",  # test time
                          "--max-seq-len", str(MAX_SEQ), "--retry-delay", "0.5",
                          "--mixed-steps", "on",
                          "--events-dir", str(events)])
    try:
        serve.wait_url(BOOT_S)
        yield serve
    finally:
        pids = descendants(serve.process.pid)
        code = serve.stop()
        left = [pid for pid in pids if os.path.exists(f"/proc/{pid}")
                and cmdline(pid)]
        assert code == 0, serve.describe()
        assert left == [], f"processes left after the server stopped: {left}"
        assert "stopped" in "\n".join(serve.stderr)


@pytest.fixture(autouse=True)
def serving(server: ServeProcess) -> ServeProcess:
    """The server, once it serves (a test that faulted the run does not fail the next)."""
    deadline = time.monotonic() + BOOT_S
    while api_checks.get_json(server.url, "/health")[1]["state"] != "Serving":
        assert time.monotonic() < deadline, server.describe()
        time.sleep(0.5)
    return server


@pytest.fixture(scope="module")
def alone(server: ServeProcess) -> dict[str, dict[str, Any]]:
    """Each prompt asked alone, one request at a time: the single-sequence greedy output."""
    return {prompt: api_checks.complete(server.url, prompt) for prompt in api_checks.PROMPTS}


def test_models_and_health_name_the_warm_pipeline(server: ServeProcess) -> None:
    models = api_checks.client(server.url).models.list().data
    assert [m.id for m in models] == [api_checks.model_id(server.url)]
    assert "smollm2" in models[0].id.lower()
    status, health = api_checks.get_json(server.url, "/health")
    assert status == 200 and health["state"] == "Serving" and health["restarts"] == 0
    assert health["slots"] == 4
    ready = [line for line in server.stderr if line.startswith("[swactor] stage 0 ready")]
    assert ready and "weights " in ready[0] and "KV cache" in ready[0], server.describe()
    assert "worker RSS" in ready[0] and "in the file" in ready[0]


def test_completion_and_chat_answer_in_openai_shapes(
        server: ServeProcess, alone: dict[str, dict[str, Any]]) -> None:
    first = alone[api_checks.PROMPTS[0]]
    assert first["text"] and first["finish_reason"] in ("length", "stop")
    prompt_tokens, completion_tokens, total = first["usage"]
    assert 0 < completion_tokens <= api_checks.TOKENS
    assert total == prompt_tokens + completion_tokens
    question, word = api_checks.CHAT
    answer = api_checks.chat(server.url, question)
    assert answer["role"] == "assistant" and answer["text"]
    assert word in str(answer["text"])


def test_streaming_gives_the_same_greedy_text_piece_by_piece(
        server: ServeProcess, alone: dict[str, dict[str, Any]]) -> None:
    streamed = api_checks.stream_complete(server.url, api_checks.PROMPTS[0])
    assert len(streamed["pieces"]) > 1
    assert streamed["text"] == alone[api_checks.PROMPTS[0]]["text"]
    assert streamed["finish_reason"] == alone[api_checks.PROMPTS[0]]["finish_reason"]
    chat = api_checks.chat(server.url, "Name a colour.")
    assert api_checks.stream_chat(server.url, "Name a colour.")["text"] == chat["text"]


def test_four_concurrent_streams_each_equal_their_prompt_alone(
        server: ServeProcess, alone: dict[str, dict[str, Any]]) -> None:
    texts = [s["text"] for s in api_checks.concurrent_streams(server.url)]
    assert len(set(texts)) == len(texts)  # different prompts, different answers
    assert texts == [alone[p]["text"] for p in api_checks.PROMPTS]


def test_prompts_that_arrive_while_others_decode_ride_with_their_rows(
        server: ServeProcess, alone: dict[str, dict[str, Any]]) -> None:
    """`--mixed-steps on` (the module's server): two streams decoding, then two more
    prompts: each waits for the decode rows in flight and goes with them as one mixed
    step (the run's event log shows it), and every stream is its prompt's greedy text
    alone."""
    early, late = api_checks.PROMPTS[:2], api_checks.PROMPTS[2:]
    long_tokens = 48  # decoding long after the late prompts arrive
    early_alone = [api_checks.complete(server.url, p, long_tokens)["text"] for p in early]
    before = sum(1 for e in _events(server) if e.get("detail", {}).get("mixed"))
    decoding = [threading.Event() for _ in early]

    def stream(index: int) -> str:
        pieces = []
        for chunk in api_checks.client(server.url).completions.create(
                model=api_checks.model_id(server.url), prompt=early[index],
                max_tokens=long_tokens, temperature=0, stream=True):
            pieces.append(chunk.choices[0].text)
            decoding[index].set()
        return "".join(pieces)

    with concurrent.futures.ThreadPoolExecutor(len(api_checks.PROMPTS)) as pool:
        firsts = [pool.submit(stream, i) for i in range(len(early))]
        assert all(event.wait(api_checks.TIMEOUT_S) for event in decoding)
        seconds = []
        for prompt in late:  # apart: prompts submitted together go at once, as a batch
            seconds.append(pool.submit(api_checks.stream_complete, server.url, prompt))
            time.sleep(0.1)
        assert [f.result() for f in firsts] == early_alone
        assert [f.result()["text"] for f in seconds] == [alone[p]["text"] for p in late]
    mixed = sum(1 for e in _events(server) if e.get("detail", {}).get("mixed"))
    assert mixed > before, "no prompt rode with decode rows"


def test_bad_requests_get_openais_error_object(server: ServeProcess) -> None:
    seen = api_checks.bad_requests(server.url)
    assert seen["n_above_1"][:2] == [400, "invalid_request_error"]
    assert seen["n_above_1"][3] == "n"
    assert seen["max_tokens_a_string"][:2] == [400, "invalid_request_error"]
    assert seen["max_tokens_a_string"][3] == "max_tokens"
    assert seen["prompt_over_context"][:3] == [400, "invalid_request_error",
                                               "context_length_exceeded"]
    assert seen["messages_not_a_list"][:2] == [400, "invalid_request_error"]
    assert seen["not_json"][:2] == [400, "invalid_request_error"]
    assert all(row[4] for row in seen.values())  # each names the problem in words
    status, health = api_checks.get_json(server.url, "/health")
    assert status == 200 and health["state"] == "Serving"  # the server kept serving


KILL_TOKENS = 48
LONG_PROMPT = "Count from 1 to 1000: 1, 2, 3, 4, 5,"
"""A prompt whose greedy answer goes on for hundreds of tokens (no early end)."""


def _open_stream(url: str, prompt: str, tokens: int
                 ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """A streamed completion whose first event was read; the caller drops it."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    conn.request("POST", "/v1/completions", headers={"Content-Type": "application/json"},
                 body=json.dumps({"prompt": prompt, "max_tokens": tokens, "stream": True,
                                  "temperature": 0}))
    response = conn.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")  # the first token is out
    return conn, response


def test_a_client_that_disconnects_frees_its_slot(
        server: ServeProcess, alone: dict[str, dict[str, Any]]) -> None:
    # every slot busy with a long generation, then every client gone
    long = MAX_SEQ - 32
    conns = [_open_stream(server.url, LONG_PROMPT, long) for _ in range(4)]
    for conn, response in conns:
        response.close()  # the response holds the socket open until it is closed too
        conn.close()
    # each dropped sequence was cancelled in the run, hundreds of tokens short of its end
    deadline = time.monotonic() + 60
    while len(cancelled := _cancelled(server)) < len(conns):
        assert time.monotonic() < deadline, cancelled
        time.sleep(0.2)
    assert len(cancelled) == len(conns) and all(tokens < long // 2 for tokens in cancelled)
    # and the next request is served, with every slot free again
    again = api_checks.complete(server.url, api_checks.PROMPTS[1])
    assert again["text"] == alone[api_checks.PROMPTS[1]]["text"]
    status, health = api_checks.get_json(server.url, "/health")
    assert (status, health["in_flight"]) == (200, 0)


def _events(server: ServeProcess) -> list[dict[str, Any]]:
    path = Path(server.argv[server.argv.index("--events-dir") + 1]) / "orchestrator.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _cancelled(server: ServeProcess) -> list[int]:
    """Tokens of each sequence the run ended as cancelled (its sequence_finished event)."""
    return [int(e["detail"]["tokens"]) for e in _events(server)
            if e["event"] == "sequence_finished" and e["detail"].get("reason") == "cancelled"]


def _worker_pid(server: ServeProcess) -> int:
    workers = [pid for pid in descendants(server.process.pid)
               if "swactor.worker" in cmdline(pid)]
    assert len(workers) == 1, [cmdline(p) for p in descendants(server.process.pid)]
    return workers[0]


def test_kill_9_of_the_worker_mid_stream_recovers_and_the_stream_goes_on(
        server: ServeProcess, alone: dict[str, dict[str, Any]]) -> None:
    expected = api_checks.complete(server.url, LONG_PROMPT, KILL_TOKENS)  # undisturbed
    victim = _worker_pid(server)
    _, before = api_checks.get_json(server.url, "/health")
    stream = api_checks.client(server.url).completions.create(
        model=api_checks.model_id(server.url), prompt=LONG_PROMPT, max_tokens=KILL_TOKENS,
        temperature=0, stream=True)
    chunks = iter(stream)
    first = next(chunks).choices[0].text  # mid-stream
    os.kill(victim, signal.SIGKILL)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        rest = pool.submit(lambda: [c.choices[0].text for c in chunks])
        states: list[str] = []
        deadline = time.monotonic() + BOOT_S
        while True:
            _, health = api_checks.get_json(server.url, "/health")
            if not states or states[-1] != health["state"]:
                states.append(health["state"])
            if health["state"] == "Serving" and health["restarts"] == before["restarts"] + 1:
                break
            assert health["state"] in ("Serving", "Recovering"), health
            assert time.monotonic() < deadline, (states, server.describe())
            time.sleep(0.2)
        text = first + "".join(rest.result(timeout=BOOT_S))
    assert "Recovering" in states, states
    # the stream went on on the new run: the undisturbed greedy text, no token twice or lost
    assert text == expected["text"]
    assert _worker_pid(server) != victim
    migrated = [e for e in _events(server) if e["event"] == "sequence_migrated"]
    assert len(migrated) == 1, migrated
    faults = [e["detail"]["reason"] for e in _events(server)
              if e["event"] == "serve_recovery_started"]
    assert "WorkerCrashed" in faults[-1] and "stage 0" in faults[-1], faults
    again = api_checks.complete(server.url, api_checks.PROMPTS[2])  # the next request
    assert again["text"] == alone[api_checks.PROMPTS[2]]["text"]


def test_the_event_log_records_the_session(server: ServeProcess) -> None:
    names = [event["event"] for event in _events(server)]
    _, health = api_checks.get_json(server.url, "/health")
    assert names.count("serve_started") == 1
    assert names.count("serve_recovery_started") == names.count("serve_recovery_completed") \
        == health["restarts"] >= 1
