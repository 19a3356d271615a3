"""The API checks the end-to-end serve tests share, with the official ``openai`` client.

Each check talks to a running ``swactor serve`` / ``swactor orchestrator --serve`` at
``base`` (``http://HOST:PORT``) and returns what it saw; the tests assert on it. The
same checks run in the test process (loopback servers) or, for a server inside a
network namespace, in that namespace: ``python -m tests.serve.api_checks URL`` runs
``api_report`` and prints it as one JSON object.

Greedy decoding makes every answer reproducible, so "each of 4 concurrent streams equals
its single-sequence output" is checked against the same prompt asked alone, one request
at a time, on the same server.
"""

from __future__ import annotations

import concurrent.futures
import json
import sys
import urllib.error
import urllib.request
from typing import Any

import openai

PROMPTS = ("The capital of France is", "Once upon a time, a small robot",
           "The three primary colours are", "def fibonacci(n):")
TOKENS = 8
TIMEOUT_S = 300.0
CHAT = ("What is the capital of Germany?", "Berlin")
"""A chat question and a word its greedy answer holds. SmolLM2 answers it the same way
whether the activations of its products are rounded to int16 or, as llama.cpp rounds
them, to int8 (its first token leads by 0.6 logits, the others by about 4). The same
question about France is a near-tie at the first token (0.08): int16 answers "The capital
of France is Paris.", int8 and llama.cpp "L'Étoile, la Marseillaise"."""


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0,
                         timeout=TIMEOUT_S)


def get_json(base: str, path: str) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) of a GET, also for an error status."""
    try:
        with urllib.request.urlopen(base + path, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def post_raw(base: str, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(base + path, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def model_id(base: str) -> str:
    return client(base).models.list().data[0].id


def complete(base: str, prompt: str, tokens: int = TOKENS) -> dict[str, Any]:
    """One greedy completion: its text, finish reason and usage."""
    reply = client(base).completions.create(model=model_id(base), prompt=prompt,
                                            max_tokens=tokens, temperature=0)
    usage = reply.usage
    assert usage is not None
    return {"text": reply.choices[0].text, "finish_reason": reply.choices[0].finish_reason,
            "usage": [usage.prompt_tokens, usage.completion_tokens, usage.total_tokens]}


def stream_complete(base: str, prompt: str, tokens: int = TOKENS) -> dict[str, Any]:
    """One greedy streamed completion: its chunks' texts and the last finish reason."""
    pieces: list[str] = []
    finish = None
    for chunk in client(base).completions.create(model=model_id(base), prompt=prompt,
                                                 max_tokens=tokens, temperature=0,
                                                 stream=True):
        pieces.append(chunk.choices[0].text)
        finish = chunk.choices[0].finish_reason or finish
    return {"pieces": pieces, "text": "".join(pieces), "finish_reason": finish}


def chat(base: str, content: str, tokens: int = TOKENS) -> dict[str, Any]:
    reply = client(base).chat.completions.create(
        model=model_id(base), messages=[{"role": "user", "content": content}],
        max_tokens=tokens, temperature=0)
    return {"text": reply.choices[0].message.content,
            "role": reply.choices[0].message.role,
            "finish_reason": reply.choices[0].finish_reason}


def stream_chat(base: str, content: str, tokens: int = TOKENS) -> dict[str, Any]:
    pieces: list[str] = []
    for chunk in client(base).chat.completions.create(
            model=model_id(base), messages=[{"role": "user", "content": content}],
            max_tokens=tokens, temperature=0, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    return {"pieces": pieces, "text": "".join(pieces)}


def concurrent_streams(base: str, prompts: tuple[str, ...] = PROMPTS,
                       tokens: int = TOKENS) -> list[dict[str, Any]]:
    """Every prompt streamed at once, one thread each (all in flight together)."""
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p: stream_complete(base, p, tokens), prompts))


def bad_requests(base: str) -> dict[str, list[Any]]:
    """name -> [status, error type, error code, error param] for requests the server must
    refuse with OpenAI's error object."""
    model = model_id(base)
    cases: dict[str, dict[str, Any]] = {
        "n_above_1": {"model": model, "prompt": "hi", "n": 2},
        "max_tokens_a_string": {"model": model, "prompt": "hi", "max_tokens": "many"},
        "prompt_over_context": {"model": model, "prompt": "hello " * 5000},
        "messages_not_a_list": {"model": model, "messages": "hi"},
    }
    seen: dict[str, list[Any]] = {}
    for name, body in cases.items():
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        status, answer = post_raw(base, path, json.dumps(body).encode())
        error = answer.get("error", {})
        seen[name] = [status, error.get("type"), error.get("code"), error.get("param"),
                      bool(error.get("message"))]
    status, answer = post_raw(base, "/v1/completions", b"{not json")
    seen["not_json"] = [status, answer.get("error", {}).get("type"), None, None, True]
    return seen


def api_report(base: str) -> dict[str, Any]:
    """Every check of the API suite, as data (the netns test asserts on it)."""
    alone = {prompt: complete(base, prompt) for prompt in PROMPTS}
    return {
        "models": [m.id for m in client(base).models.list().data],
        "health": get_json(base, "/health"),
        "alone": alone,
        "stream": stream_complete(base, PROMPTS[0]),
        "chat": chat(base, CHAT[0]),
        "stream_chat": stream_chat(base, CHAT[0]),
        "concurrent": concurrent_streams(base),
        "bad": bad_requests(base),
    }


if __name__ == "__main__":
    print(json.dumps(api_report(sys.argv[1])), flush=True)
