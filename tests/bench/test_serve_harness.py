"""`bench serve`'s arithmetic and its server-sent-events client, against a scripted server.

The server here is a tiny aiohttp app on loopback that writes events exactly as scripted
(split across writes, comments, multi-line data, errors). The clock handed to the client
is a counter (0, 1, 2, ...), one tick per reading, so every time the client records is
known from the script: no wall-clock figure is asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

import bench.serve
from bench._render import _serve_limits
from bench.report import serve_goals
from bench.serve import (
    BUCKET_TOKENS,
    PROMPTS,
    LevelFigures,
    RequestTiming,
    goal_rows,
    markdown,
    percentile,
    prompt_set,
    restarts_of,
    run_level,
    stream_completion,
    swactor_threads,
    table,
    threads_sentence,
)
from swactor.model.paths import default_model_path
from swactor.model.tokenizer import Tokenizer


def ticks() -> Callable[[], float]:
    """A clock that reads 0, 1, 2, ... one step per call."""
    counter: Iterator[int] = iter(range(1_000_000))
    return lambda: float(next(counter))


def _event(payload: object) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _chunk(text: str | None, finish: str | None = None) -> dict[str, Any]:
    return {"object": "text_completion", "choices": [
        {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}


Script = list[bytes]


async def _serve(script_for: Callable[[dict[str, Any]], tuple[int, Script]],
                 seen: list[dict[str, Any]], body: Callable[[str], Awaitable[None]]) -> None:
    async def completions(request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        seen.append(payload)
        status, parts = script_for(payload)
        if status != 200:
            return web.Response(status=status, body=b"".join(parts),
                                content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):  # a client that stopped reading left
            for part in parts:
                await response.write(part)
                await asyncio.sleep(0)  # separate writes reach the client as separate reads
            await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        await body(f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()


def _one(script: Script, status: int = 200) -> RequestTiming:
    """Stream one completion from a server that answers ``script``; the client's timing."""
    result: list[RequestTiming] = []

    async def body(base: str) -> None:
        async with aiohttp.ClientSession() as session:
            result.append(await stream_completion(
                session, f"{base}/v1/completions", {"model": "m", "prompt": "p"}, ticks()))

    asyncio.run(_serve(lambda _: (status, script), [], body))
    return result[0]


# -- statistics ----------------------------------------------------------------------------


def test_percentile_interpolates_between_order_statistics() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([0.0, 10.0], 95) == 9.5
    assert percentile([7.0], 95) == 7.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0) == 1.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 100) == 5.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], 101)


def test_request_figures_from_its_clock_readings() -> None:
    timing = RequestTiming(sent=10.0, first=10.5, last=12.5, text_events=5)
    assert timing.ttft == 0.5
    assert timing.tokens == 5
    assert timing.decode_tokens_per_s == 2.0  # 4 tokens after the first, over 2 s
    timing.usage_tokens = 9  # the server's count wins over the events carrying text
    assert timing.decode_tokens_per_s == 4.0
    assert RequestTiming(sent=0.0, first=1.0, last=1.0, text_events=1).decode_tokens_per_s \
        is None
    assert RequestTiming(sent=0.0).ttft is None


def test_level_figures_leave_failed_requests_out() -> None:
    timings = [
        RequestTiming(sent=0.0, first=0.1, last=1.1, text_events=11,  # ttft 100 ms, 10/s
                      finish_reason="length"),
        RequestTiming(sent=0.0, first=0.3, last=2.3, text_events=11,  # 300 ms, 5/s
                      finish_reason="stop"),
        RequestTiming(sent=0.0, first=0.2, last=0.7, text_events=11,  # 200 ms, 20/s
                      finish_reason="length"),
        RequestTiming(sent=0.0, first=0.05, last=0.5, text_events=30, error="HTTP 503"),
    ]
    level = LevelFigures.of(3, timings, wall_s=3.0)
    assert (level.requests, level.errors, level.tokens) == (4, 1, 33)
    assert level.ttft_p50_ms == pytest.approx(200.0)
    assert level.ttft_p95_ms == pytest.approx(290.0)  # 200 + 0.9 * (300 - 200)
    assert level.decode_p50_tokens_per_s == pytest.approx(10.0)
    assert level.aggregate_tokens_per_s == pytest.approx(11.0)
    assert level.error_examples == ["HTTP 503"]
    assert level.finish_reasons == {"length": 2, "stop": 1}


def _level(ttft: float, aggregate: float) -> dict[str, Any]:
    return {"ttft_p50_ms": ttft, "ttft_p95_ms": ttft, "decode_p50_tokens_per_s": 1.0,
            "aggregate_tokens_per_s": aggregate, "errors": 0, "requests": 4, "tokens": 64,
            "finish_reasons": {"stop": 1, "length": 3}}


def test_goal_ratios_pair_figures_of_the_run() -> None:
    figures = {"levels": {
        "swactor-1": {"1": _level(300.0, 10.0), "4": _level(400.0, 30.0)},
        "swactor-3": {"1": _level(600.0, 8.0), "4": _level(700.0, 24.0)},
        "llama.cpp": {"1": _level(100.0, 60.0), "4": _level(350.0, 40.0)},
    }}
    rows = {row["goal"]: row for row in goal_rows(figures)}
    assert rows["swactor-1 warm TTFT p50 / llama.cpp server's (1 client)"]["measured"] == 3.0
    assert rows["swactor-3 warm TTFT p50 / llama.cpp server's (1 client)"]["measured"] == 6.0
    four = rows["swactor-1 aggregate tok/s at 4 clients / 1 client"]
    assert (four["measured"], four["verdict"]) == (3.0, "met")
    assert rows["swactor-3 aggregate tok/s at 4 clients / 1 client"]["measured"] == 3.0
    against = rows["swactor-3 aggregate at 4 clients / llama.cpp server's at 4"]
    assert (against["measured"], against["verdict"]) == (0.6, "met")
    figures["levels"]["swactor-3"]["4"]["aggregate_tokens_per_s"] = 16.0
    rows = {row["goal"]: row for row in goal_rows(figures)}
    assert rows["swactor-3 aggregate at 4 clients / llama.cpp server's at 4"]["verdict"] \
        == "missed"
    lines = table(figures, [1, 4])
    row = next(line for line in lines if line.split()[:2] == ["4", "swactor-3"])
    assert row.split()[-2:] == ["2.00", "0.40"]  # TTFT 700/350, aggregate 16/40
    figures["settings"] = {"levels": [1, 4], "max_tokens": 8, "rounds": 1, "threads": 1,
                           "prompts": {"a": 2}}
    figures["goals"] = goal_rows(figures)
    section = markdown(figures)
    assert ("| 4 | swactor-3 | 700 | 700 | 1.0 | 16.0 | 2.00 | 2.00 | 0.40 | 4, 64 "
            "(length 3, stop 1) | 0 | n/a |") in section  # no cores measured
    figures["levels"]["swactor-3"]["4"].update(cores={"swactor": 0.5}, wall_s=4.0)
    assert any(line.endswith("(length 3, stop 1) | 0 | 32.0 |")  # 64 tokens / 2 CPU-s
               for line in markdown(figures))
    assert ("| swactor-3 aggregate at 4 clients / llama.cpp server's at 4 | 0.40 | >= 0.5 "
            "| missed |") in section
    report_rows = serve_goals(figures)
    assert [r["goal"] for r in report_rows] == [
        "swactor-1 aggregate tok/s at 4 clients / 1 client",
        "swactor-3 aggregate tok/s at 4 clients / 1 client",
        "swactor-3 aggregate at 4 clients / llama.cpp server's at 4"]
    assert report_rows[2]["measured"]["median"] == pytest.approx(0.4)
    assert report_rows[2]["verdict"].startswith("missed")
    assert serve_goals(None)[0]["verdict"] == "not measured"


def test_goals_without_llama_cpp_are_not_measured() -> None:
    figures = {"levels": {"swactor-1": {"1": _level(300.0, 10.0), "4": _level(400.0, 20.0)}}}
    rows = {row["goal"]: row for row in goal_rows(figures)}
    assert rows["swactor-1 warm TTFT p50 / llama.cpp server's (1 client)"]["verdict"] \
        == "not measured"
    assert rows["swactor-1 aggregate tok/s at 4 clients / 1 client"]["verdict"] == "missed"


def test_long_completions_give_their_own_four_over_one_goal() -> None:
    figures: dict[str, Any] = {"levels": {
        "swactor-1": {"1": _level(300.0, 10.0), "4": _level(400.0, 20.0)}}}
    figures["long"] = {"max_tokens": 128, "levels": {
        "swactor-1": {"1": _level(300.0, 12.0), "4": _level(420.0, 33.0)},
        "swactor-3": {"1": _level(300.0, 10.0), "4": _level(420.0, 24.0)}}}
    rows = {row["goal"]: row for row in goal_rows(figures)}
    assert rows["swactor-1 aggregate tok/s at 4 clients / 1 client"]["measured"] == 2.0
    long_one = rows["swactor-1 aggregate tok/s at 4 clients / 1 client, 128-token completions"]
    assert (long_one["measured"], long_one["verdict"]) == (2.75, "met")
    long_three = rows["swactor-3 aggregate tok/s at 4 clients / 1 client, 128-token completions"]
    assert (long_three["measured"], long_three["verdict"]) == (2.4, "missed")
    figures["settings"] = {"levels": [1, 4], "max_tokens": 8, "rounds": 1, "threads": 1,
                           "prompts": {"a": 2}}
    figures["goals"] = goal_rows(figures)
    section = markdown(figures)
    assert "| 4 | swactor-1 | 420 | 1.0 | 33.0 | 2.75 | 4, 64 | 0 |" in section
    assert [r["goal"] for r in serve_goals(figures)][-2:] == [
        "swactor-3 aggregate tok/s at 4 clients / 1 client, 128-token completions",
        "swactor-3 aggregate at 4 clients / llama.cpp server's at 4"]


def test_pairs_alternate_the_pipelines_and_their_median_is_the_goal(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, int, int]] = []
    aggregates = iter([10.0, 30.0, 20.0, 44.0,  # pair 1: swactor-1 3.0, swactor-3 2.2
                       10.0, 20.0, 20.0, 50.0,  # pair 2: 2.0, 2.5
                       12.0, 30.0, 10.0, 40.0,  # pair 3: 2.5, 4.0
                       10.0, 26.0, 10.0, 0.0])  # 128 tokens: 2.6; swactor-3's 4 clients fail

    class Named:
        def __init__(self, name: str) -> None:
            self.target = type("T", (), {"name": name})()

    async def fake_level(session: object, server: Named, prompts: object, clients: int,
                         rounds: int, tokens: int, warmup: int, notes: object,
                         echo: bool = True) -> tuple[LevelFigures, bool]:
        assert (rounds, echo) == (1, False)
        calls.append((server.target.name, clients, tokens))
        value = next(aggregates)
        level = LevelFigures.of(clients, [RequestTiming(sent=0.0)], 1.0)
        level.aggregate_tokens_per_s = value or None
        level.errors = 0 if value else 1
        return level, False

    monkeypatch.setattr(bench.serve, "_run_level", fake_level)
    pipelines: Any = [Named("swactor-1"), Named("swactor-3")]
    pairs = asyncio.run(bench.serve._run_pairs(None, pipelines, [], 3, [32], 4, []))  # type: ignore[arg-type]
    assert calls == [("swactor-1", 1, 32), ("swactor-1", 4, 32),
                     ("swactor-3", 1, 32), ("swactor-3", 4, 32)] * 3
    calls.clear()
    long = asyncio.run(bench.serve._run_pairs(None, pipelines, [], 1, [128], 4, []))  # type: ignore[arg-type]
    pairs["lengths"].update(long["lengths"])
    assert long["lengths"]["128"]["swactor-3"][0] == {
        "one": 10.0, "four": None, "ratio": None, "errors": 1}
    figures: dict[str, Any] = {"levels": {
        "swactor-1": {"1": _level(300.0, 10.0), "4": _level(400.0, 20.0)},
        "swactor-3": {"1": _level(300.0, 10.0), "4": _level(400.0, 30.0)}},
        "long": {"max_tokens": 128, "levels": {
            "swactor-1": {"1": _level(300.0, 10.0), "4": _level(400.0, 22.0)}}},
        "pairs": pairs,
        "settings": {"levels": [1, 4], "max_tokens": 32, "rounds": 1, "threads": 1,
                     "prompts": {"a": 2}}}
    rows = [row for row in goal_rows(figures) if "/ 1 client" in row["goal"]]
    assert [(row["goal"], row["measured"], row["verdict"]) for row in rows] == [
        ("swactor-1 aggregate tok/s at 4 clients / 1 client, median of 3 pairs (2.00-3.00; "
         "the levels' own ratio 2.00)", 2.5, "met"),
        ("swactor-3 aggregate tok/s at 4 clients / 1 client, median of 3 pairs (2.20-4.00; "
         "the levels' own ratio 3.00)", 2.5, "met"),
        ("swactor-1 aggregate tok/s at 4 clients / 1 client, 128-token completions, median "
         "of 1 pair (2.60-2.60; the levels' own ratio 2.20)", 2.6, "met")]
    figures["goals"] = goal_rows(figures)
    section = markdown(figures)
    assert ("| 32 | swactor-3 | 20.0 -> 44.0 (2.20); 20.0 -> 50.0 (2.50); 10.0 -> 40.0 "
            "(4.00) | 2.50 |") in section
    assert "| 128 | swactor-3 | 10.0 -> n/a (n/a) | n/a |" in section


# -- the SSE client ------------------------------------------------------------------------


def test_events_are_timed_as_they_complete() -> None:
    hello = _event(_chunk("Hello"))
    big = json.dumps(_chunk(" big")).encode()
    cut = big.index(b'"choices"')  # the event's JSON, split between two of its members
    script = [
        b": a comment line, not an event\n\n",
        _event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}),  # 1: no text
        hello[:9], hello[9:],  # 2: one event in two writes, timed once it is complete
        b"data: " + big[:cut] + b"\ndata: " + big[cut:] + b"\n\n",  # 3: two data lines
        _event(_chunk(" world")),  # 4
        _event(_chunk("", "length")),  # 5: the finish, no text
        _event({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 3}}),  # 6
        b"data: [DONE]\n\n",  # 7
    ]
    timing = _one(script)
    assert timing.error is None
    assert (timing.sent, timing.first, timing.last, timing.ended) == (0.0, 2.0, 4.0, 8.0)
    assert (timing.text_events, timing.usage_tokens, timing.finish_reason) == (3, 3, "length")
    assert timing.ttft == 2.0
    assert timing.decode_tokens_per_s == 1.0


def test_without_usage_each_text_event_is_a_token() -> None:
    script = [_event(_chunk(word)) for word in ("a", "b", "c", "d")]
    script += [_event(_chunk("", "stop")), b"data: [DONE]\n\n"]
    timing = _one(script)
    assert (timing.usage_tokens, timing.tokens, timing.first, timing.last) == (None, 4, 1.0, 4.0)
    assert timing.finish_reason == "stop"


def test_an_error_event_ends_the_request_with_its_message() -> None:
    script = [_event(_chunk("a")),
              _event({"error": {"message": "stage 1 faulted", "type": "server_error"}}),
              _event(_chunk("never read"))]
    timing = _one(script)
    assert timing.error == "server error: stage 1 faulted"
    assert timing.text_events == 1


def test_a_refused_request_and_a_cut_stream_are_errors() -> None:
    refused = _one([b'{"error": {"message": "queue full"}}'], status=429)
    assert refused.error is not None
    assert refused.error.startswith("HTTP 429")
    assert "queue full" in refused.error
    cut = _one([_event(_chunk("a"))])
    assert cut.error == "stream ended without [DONE] or a finish_reason"
    garbage = _one([b"data: {not json\n\n"])
    assert garbage.error is not None
    assert garbage.error.startswith("event is not JSON")


def test_every_level_serves_each_prompt_equally_often() -> None:
    prompts = ["p0", "p1", "p2", "p3", "p4"]
    seen: list[dict[str, Any]] = []
    levels: list[LevelFigures] = []

    def script(payload: dict[str, Any]) -> tuple[int, Script]:
        return 200, [_event(_chunk("x")), _event(_chunk("y")), _event(_chunk("", "length")),
                     b"data: [DONE]\n\n"]

    async def body(base: str) -> None:
        async with aiohttp.ClientSession() as session:
            for clients in (1, 2):
                levels.append(await run_level(session, base, "model-id", prompts,
                                              clients=clients, rounds=2, max_tokens=7))

    asyncio.run(_serve(script, seen, body))
    one, two = levels
    assert (one.clients, one.requests, one.errors, one.tokens) == (1, 10, 0, 20)
    assert (two.clients, two.requests, two.errors, two.tokens) == (2, 20, 0, 40)
    # each client makes 2 passes over the 5 prompts: every prompt clients * 2 times
    assert sorted(p["prompt"] for p in seen[:10]) == sorted(prompts * 2)
    assert sorted(p["prompt"] for p in seen[10:]) == sorted(prompts * 4)
    # the two clients start at different prompts, so they do not send the same one at once
    assert {seen[10]["prompt"], seen[11]["prompt"]} == {"p0", "p1"}
    assert all(p["stream"] is True and p["temperature"] == 0.0 and p["max_tokens"] == 7
               and p["model"] == "model-id" for p in seen)


# -- the prompt set ------------------------------------------------------------------------


def test_each_bucket_holds_prompts_of_its_padded_length() -> None:
    tokenizer = Tokenizer.from_gguf(default_model_path())
    for bucket, prompts in PROMPTS.items():
        low, high = BUCKET_TOKENS[bucket]
        counts = [len(tokenizer.encode(prompt)) for prompt in prompts]
        assert all(low <= n <= high for n in counts), (bucket, counts)
    assert sorted(prompt_set()) == sorted(p for ps in PROMPTS.values() for p in ps)


def test_restarts_are_read_from_swactors_health_only() -> None:
    assert restarts_of({"state": "Serving", "restarts": 2, "slots": 4}) == 2
    assert restarts_of({"status": "ok"}) is None  # a server that counts none
    assert restarts_of({"restarts": True}) is None
    assert restarts_of(["restarts"]) is None


# -- threads -------------------------------------------------------------------------------


def test_every_server_gets_the_same_threads(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    """llama.cpp's server computes on T threads; each swactor pipeline gets T split over
    its stages that compute at once, as `swactor serve` splits its host's CPUs."""
    assert swactor_threads(1, 2) == (2, 1)  # one stage: every thread
    assert swactor_threads(3, 2) == (2, 1)  # fewer CPUs than stages: one object, 2 each
    assert swactor_threads(2, 2) == (1, 2)  # 2 objects in flight on 2 CPUs: 1 each
    assert swactor_threads(3, 1) == (1, 1)
    assert swactor_threads(2, 8) == (4, 2)
    python = tmp_path / "venv" / "bin" / "python"  # answers `-c "import llama_cpp.server"`
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\nexit 0\n")
    python.chmod(0o755)
    monkeypatch.setenv("SWACTOR_REFERENCE_VENV", str(tmp_path / "venv"))
    monkeypatch.setattr(bench.serve, "swactor_serve_available", lambda: None)
    targets, notes = bench.serve.default_targets([1, 3], 2, tmp_path / "m.gguf")
    assert notes == []
    argv = {t.name: t.argv for t in targets}
    assert argv["swactor-1"][argv["swactor-1"].index("--threads") + 1] == "2"
    assert argv["swactor-3"][argv["swactor-3"].index("--threads") + 1] == "2"
    llama = argv["llama.cpp"]
    assert (llama[llama.index("--n_threads") + 1],
            llama[llama.index("--n_threads_batch") + 1]) == ("2", "2")
    settings = {"threads": 2, "server_threads": {t.name: t.threads for t in targets}}
    assert threads_sentence(settings) == (
        "Threads: 2 for every server: swactor-1 `--threads 2` on its node; swactor-3 "
        "`--threads 2` on each of its 3 nodes, which compute one at a time (one object in "
        "flight); llama.cpp `--n_threads 2 --n_threads_batch 2`.")
    figures = {"settings": settings, "levels": {
        name: {"1": _level(100.0, 10.0), "4": _level(100.0, 20.0)}
        for name in ("swactor-1", "swactor-3")}}
    limits = _serve_limits(figures)
    assert "computes every step on its 2 thread(s)" in limits[0]
    assert "2 thread(s) each, 1 computing at once" in limits[1]
    assert "near 1x one client's rate" in limits[1]
    # a run that recorded llama.cpp's threads alone says no more than it knows
    assert threads_sentence({"threads": 1}) == \
        "Threads: llama.cpp 1, swactor serve's own default."
