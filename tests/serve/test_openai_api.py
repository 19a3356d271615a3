"""The HTTP front against the official ``openai`` client, over a FAKE engine on loopback.

The engine behind the server is :class:`tests.serve.fake_engine.FakeEngine` (a scripted
fake: this is the front's unit test; the real pipeline is tested end to end elsewhere).
Expected texts and shapes are written out here, not computed by the code under test.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from swactor.serve.engine import HealthState
from swactor.serve.server import ServeConfig
from tests.serve.fake_engine import FakeEngine, ServerThread

WAIT_S = 10.0


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def server(engine: FakeEngine) -> Iterator[ServerThread]:
    thread = ServerThread(engine, ServeConfig(max_queue=1, max_body_bytes=4096))
    yield thread
    engine.release.set()
    thread.close()


@pytest.fixture
def client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=WAIT_S)


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _raw(server: ServerThread, method: str, path: str, body: bytes = b"",
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=WAIT_S)
    try:
        conn.request(method, path, body=body,
                     headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def _health(server: ServerThread) -> dict[str, Any]:
    status, _, body = _raw(server, "GET", "/health")
    data: dict[str, Any] = json.loads(body)
    data["http_status"] = status
    return data


def _assert_openai_error(body: bytes, param: str | None, code: str | None = None) -> None:
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "Traceback" not in error["message"]
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code


# ------------------------------------------------------------------- completions


def test_completion_text_usage_and_stop_finish(client: openai.OpenAI,
                                               engine: FakeEngine) -> None:
    result = client.completions.create(model="fake-model", prompt="Say hi", max_tokens=20)
    assert result.choices[0].text == "Hello world!"
    assert result.choices[0].finish_reason == "stop"
    assert result.model == "fake-model"
    assert result.usage is not None
    assert (result.usage.prompt_tokens, result.usage.completion_tokens,
            result.usage.total_tokens) == (6, 5, 11)
    assert engine.submitted[0].prompt == [ord(c) for c in "Say hi"]
    assert engine.submitted[0].params.max_tokens == 20


def test_completion_max_tokens_gives_length(client: openai.OpenAI) -> None:
    result = client.completions.create(model="m", prompt="Say hi", max_tokens=2)
    assert result.choices[0].text == "Hello"
    assert result.choices[0].finish_reason == "length"
    assert result.usage is not None and result.usage.completion_tokens == 2


def test_completion_max_tokens_clipped_to_context(client: openai.OpenAI,
                                                  engine: FakeEngine) -> None:
    client.completions.create(model="m", prompt="x" * 250, max_tokens=1000)
    assert engine.submitted[0].params.max_tokens == 6  # 256-token context, 250 used


def test_completion_stream_one_chunk_per_token(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model="m", prompt="Say hi", max_tokens=20,
                                            stream=True))
    texts = [c.choices[0].text for c in chunks]
    assert texts == ["Hel", "lo", " wor", "ld", "!", ""]
    assert [c.choices[0].finish_reason for c in chunks] == [None] * 5 + ["stop"]


def test_sampling_options_reach_the_engine(client: openai.OpenAI, engine: FakeEngine) -> None:
    client.completions.create(model="m", prompt="a", max_tokens=3, temperature=0.7,
                              top_p=0.9, seed=1234, stop=["zz"])
    params = engine.submitted[0].params
    assert (params.temperature, params.top_p, params.seed, params.stop) == (
        0.7, 0.9, 1234, ("zz",))
    client.completions.create(model="m", prompt="a", max_tokens=3, temperature=0)
    assert engine.submitted[1].params.temperature == 0.0


# --------------------------------------------------------------------------- chat


def test_chat_applies_template_and_answers(client: openai.OpenAI, engine: FakeEngine) -> None:
    result = client.chat.completions.create(
        model="m", messages=[{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": "Hi"}])
    assert result.object == "chat.completion"
    assert result.choices[0].message.role == "assistant"
    assert result.choices[0].message.content == "Hello world!"
    assert result.choices[0].finish_reason == "stop"
    prompt = engine.codec.decode(engine.submitted[0].prompt)
    assert prompt == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert result.usage is not None
    assert result.usage.prompt_tokens == len(engine.submitted[0].prompt)
    # chat without max_tokens may fill the context
    assert engine.submitted[0].params.max_tokens == 256 - len(engine.submitted[0].prompt)


def test_chat_stream_with_usage(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=3, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "Hello wor"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


def test_token_groups_stream_as_one_chunk_each(client: openai.OpenAI,
                                               engine: FakeEngine) -> None:
    engine.group = 2
    chunks = list(client.completions.create(model="m", prompt="a", max_tokens=20, stream=True))
    assert [c.choices[0].text for c in chunks] == ["Hello", " world", "!", ""]


# ------------------------------------------------------------------------- stops


def test_stop_string_across_token_boundaries(client: openai.OpenAI, engine: FakeEngine) -> None:
    # "lo wo" spans three tokens: "Hel" | "lo" | " wor"
    result = client.completions.create(model="m", prompt="a", max_tokens=20, stop=["lo wo"])
    assert result.choices[0].text == "Hel"
    assert result.choices[0].finish_reason == "stop"
    assert engine.cancelled == [engine.submitted[0].sequence_id]  # stopped early: slot freed


def test_stream_holds_back_only_a_possible_stop(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model="m", prompt="a", max_tokens=20,
                                            stream=True, stop=["lo wo", "xyz"]))
    texts = [c.choices[0].text for c in chunks]
    # "Hel": "l" could start "lo wo", so "He" goes out; "llo" holds "lo"; " wor" completes
    # the stop string: nothing of it is sent.
    assert texts == ["He", "l", ""]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_stop_not_matched_flushes_everything(client: openai.OpenAI) -> None:
    result = client.completions.create(model="m", prompt="a", max_tokens=20, stop=["!!"])
    assert result.choices[0].text == "Hello world!"
    assert result.choices[0].finish_reason == "stop"


# ------------------------------------------------------------------ bad requests


@pytest.mark.parametrize(("extra", "param"), [
    ({"n": 2}, "n"),
    ({"bogus_field": 1}, "bogus_field"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": 3.5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"max_tokens": True}, "max_tokens"),
    ({"seed": -1}, "seed"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"logprobs": 3}, "logprobs"),
])
def test_bad_fields_get_400_in_openai_shape(client: openai.OpenAI, engine: FakeEngine,
                                            extra: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="m", prompt="a", extra_body=extra)
    assert info.value.status_code == 400
    _assert_openai_error(info.value.response.content, param)
    assert engine.submitted == []


def test_prompt_longer_than_context_is_400(client: openai.OpenAI, engine: FakeEngine) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="m", prompt="x" * 256)
    _assert_openai_error(info.value.response.content, "prompt", "context_length_exceeded")
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m",
                                       messages=[{"role": "user", "content": "x" * 300}])
    _assert_openai_error(info.value.response.content, "messages", "context_length_exceeded")
    assert engine.submitted == []


def test_bad_chat_messages_are_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=[{"role": "wizard", "content": "x"}])
    _assert_openai_error(info.value.response.content, "messages[0].role")
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=[])
    _assert_openai_error(info.value.response.content, "messages")


@pytest.mark.parametrize(("body", "status", "code"), [
    (b"{not json", 400, "invalid_json"),
    (b"[1, 2]", 400, "invalid_json"),
    (b'{"prompt": "a", "max_tokens": NaN}', 400, "invalid_json"),
    (b"\xff\xfe", 400, "invalid_json"),
    (b'{"prompt": "' + b"a" * 5000 + b'"}', 413, "request_too_large"),
    (b"[" * 2000 + b"]" * 2000, 400, "invalid_json"),
])
def test_malformed_bodies_get_openai_errors(server: ServerThread, body: bytes, status: int,
                                            code: str) -> None:
    got, _, answer = _raw(server, "POST", "/v1/completions", body)
    assert got == status
    _assert_openai_error(answer, None, code)
    assert _health(server)["http_status"] == 200  # still serving


def test_unknown_path_is_openai_404(server: ServerThread) -> None:
    status, _, body = _raw(server, "GET", "/v1/nothing")
    assert status == 404
    _assert_openai_error(body, None)


# ----------------------------------------------------------- admission, disconnect


def test_full_queue_answers_429(server: ServerThread, engine: FakeEngine) -> None:
    engine.hold_after = 1
    fresh = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                          timeout=WAIT_S)

    def complete(prompt: str) -> str:
        return fresh.completions.create(model="m", prompt=prompt, max_tokens=20).choices[0].text

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        running = [pool.submit(complete, p) for p in ("a", "b")]
        _wait(lambda: _health(server)["in_flight"] == 2, "two sequences in flight")
        queued = pool.submit(complete, "c")
        _wait(lambda: _health(server)["queued"] == 1, "one request queued")
        status, headers, body = _raw(server, "POST", "/v1/completions",
                                     json.dumps({"prompt": "d"}).encode())
        assert status == 429
        assert headers.get("Retry-After") == "1"
        _assert_openai_error(body, None, "queue_full")
        engine.release.set()
        assert [f.result(WAIT_S) for f in (*running, queued)] == ["Hello world!"] * 3
    assert len(engine.submitted) == 3


def test_disconnect_mid_stream_cancels_the_sequence(server: ServerThread, client: openai.OpenAI,
                                                    engine: FakeEngine) -> None:
    engine.hold_after = 2
    stream = client.completions.create(model="m", prompt="a", max_tokens=20, stream=True)
    first = next(iter(stream))
    assert first.choices[0].text == "Hel"
    stream.close()  # the client goes away while the sequence is still generating
    assert engine.cancel_seen.wait(WAIT_S)
    assert engine.cancelled == [engine.submitted[0].sequence_id]
    _wait(lambda: _health(server)["in_flight"] == 0, "the slot to be freed")
    engine.hold_after = None
    assert client.completions.create(model="m", prompt="a").choices[0].text == "Hello world!"


def test_disconnect_while_queued_submits_nothing(server: ServerThread,
                                                 engine: FakeEngine) -> None:
    engine.hold_after = 0
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    holders = []
    for _ in range(2):  # fill both slots
        conn = http.client.HTTPConnection(host, int(port), timeout=WAIT_S)
        conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "a"}))
        holders.append(conn)
    _wait(lambda: _health(server)["in_flight"] == 2, "slots full")
    waiting = http.client.HTTPConnection(host, int(port), timeout=WAIT_S)
    waiting.request("POST", "/v1/completions", body=json.dumps({"prompt": "b"}))
    _wait(lambda: _health(server)["queued"] == 1, "a queued request")
    waiting.close()
    _wait(lambda: _health(server)["queued"] == 0, "the queued request to leave")
    assert len(engine.submitted) == 2
    engine.release.set()
    for conn in holders:
        assert conn.getresponse().status == 200
        conn.close()


# -------------------------------------------------------------------- engine errors


def test_engine_error_mid_stream_ends_with_error_chunk(client: openai.OpenAI,
                                                       engine: FakeEngine) -> None:
    engine.fail_after = 2
    stream = client.completions.create(model="m", prompt="a", max_tokens=20, stream=True)
    texts: list[str] = []

    def read_all() -> None:
        texts.extend(chunk.choices[0].text for chunk in stream)

    with pytest.raises(openai.APIError) as info:
        read_all()
    assert texts == ["Hel", "lo"]
    assert "stage 1 worker died" in info.value.message


def test_engine_error_without_stream_is_500(client: openai.OpenAI, engine: FakeEngine) -> None:
    engine.fail_after = 1
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
    assert info.value.status_code == 500
    assert "stage 1 worker died" in json.loads(info.value.response.content)["error"]["message"]


@pytest.mark.parametrize("state", [HealthState.FAILED, HealthState.STOPPING])
def test_a_sequence_ended_by_a_session_that_gave_up_is_503(
        client: openai.OpenAI, engine: FakeEngine, server: ServerThread,
        state: HealthState) -> None:
    # admitted while the session could still serve, ended once it no longer can: the
    # request was sound, the server is unavailable (not 500, a fault of this request)
    engine.fail_after, engine.fail_state = 0, state
    with pytest.raises(openai.APIStatusError) as info:
        client.completions.create(model="m", prompt="a", max_tokens=4)
    assert info.value.status_code == 503
    error = json.loads(info.value.response.content)["error"]
    assert error["code"] == "unavailable" and "stage 1 worker died" in error["message"]
    engine.state = HealthState.SERVING
    _, _, body = _raw(server, "POST", "/v1/completions", json.dumps(
        {"prompt": "a", "stream": True}).encode())
    events = [e for e in body.decode().split("\n\n") if e]
    assert json.loads(events[-1].removeprefix("data: "))["error"]["code"] == "unavailable"


def test_raw_stream_shape_and_done(server: ServerThread, engine: FakeEngine) -> None:
    engine.fail_after = 1
    status, headers, body = _raw(server, "POST", "/v1/chat/completions", json.dumps(
        {"messages": [{"role": "user", "content": "a"}], "stream": True}).encode())
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = [e for e in body.decode().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert json.loads(events[-1].removeprefix("data: "))["error"]["code"] == "engine_error"
    assert "data: [DONE]" not in events  # an error stream is not a completed one
    engine.fail_after = None
    _, _, body = _raw(server, "POST", "/v1/chat/completions", json.dumps(
        {"messages": [{"role": "user", "content": "a"}], "stream": True}).encode())
    assert body.decode().endswith("data: [DONE]\n\n")


# ------------------------------------------------------------ models, health, metrics


def test_models_lists_the_engine_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["fake-model"]
    assert client.models.retrieve("fake-model").id == "fake-model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")


def test_health_says_the_session_state(server: ServerThread, client: openai.OpenAI,
                                       engine: FakeEngine) -> None:
    health = _health(server)
    assert (health["http_status"], health["state"], health["status"]) == (200, "Serving", "ok")
    engine.state = HealthState.RECOVERING
    health = _health(server)
    assert (health["http_status"], health["state"]) == (503, "Recovering")
    engine.state = HealthState.STOPPING
    with pytest.raises(openai.APIStatusError) as info:
        client.completions.create(model="m", prompt="a")
    assert info.value.status_code == 503
    assert engine.submitted == []


def _metrics(server: ServerThread) -> dict[str, float]:
    status, headers, body = _raw(server, "GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            key = sample.name + json.dumps(sample.labels, sort_keys=True)
            samples[key] = sample.value
    return samples


def test_metrics_parse_and_move(server: ServerThread, client: openai.OpenAI,
                                engine: FakeEngine) -> None:
    before = _metrics(server)
    assert before["swactor_serve_completion_tokens_total{}"] == 0
    assert before["swactor_serve_run_restarts_total{}"] == 0
    client.completions.create(model="m", prompt="Say hi", max_tokens=20)
    list(client.completions.create(model="m", prompt="Say", max_tokens=3, stream=True))
    engine.restarts = 1
    after = _metrics(server)
    assert after["swactor_serve_completion_tokens_total{}"] == 8
    assert after["swactor_serve_prompt_tokens_total{}"] == 9
    ok = 'swactor_serve_requests_total{"path": "/v1/completions", "status": "200"}'
    assert after[ok] == 2
    assert after["swactor_serve_time_to_first_token_seconds_count{}"] == 2
    assert after["swactor_serve_inter_token_seconds_count{}"] == 6
    assert after["swactor_serve_queue_seconds_count{}"] == 2
    assert after['swactor_serve_sequences_finished_total{"reason": "length"}'] == 1
    assert after['swactor_serve_sequences_finished_total{"reason": "stop"}'] == 1
    assert after["swactor_serve_run_restarts_total{}"] == 1
    assert after["swactor_serve_sequences_in_flight{}"] == 0
