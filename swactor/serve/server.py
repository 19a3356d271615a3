"""The OpenAI-compatible HTTP front over an :class:`~swactor.serve.engine.Engine` (aiohttp).

Theory of operation: one aiohttp application in the caller's event loop
(:meth:`ServeFront.start` uses ``AppRunner``, so the serving session can run it beside its
own tasks). A generation request goes through these steps, each able to refuse it with
OpenAI's error object before it costs more:

1. the body, bounded by ``client_max_size`` (413 past it), parses as a JSON object and
   checks field by field (:mod:`swactor.serve.api`; 400 naming the field);
2. the session must admit requests (``Health.state.admits``; 503 otherwise);
3. the chat template renders and the prompt tokenizes off the event loop (a template is a
   bounded program from the model file); a prompt that leaves no room in the context is
   a 400 ``context_length_exceeded``; ``max_tokens`` is clipped to the room left;
4. admission: at most ``engine.slots`` sequences are submitted at once and at most
   ``max_queue`` more requests wait for a slot, in arrival order; past that, 429;
5. the engine runs the sequence; its ids are decoded (``TextCodec.stream``), stop strings
   are cut (:class:`~swactor.serve.stops.StopMatcher`), and the text goes out, either as
   one JSON answer or as server-sent events (one chunk per engine event that completes
   text, then ``data: [DONE]``).

The handler runs with aiohttp's handler cancellation on: a client that goes away, while
queued or mid-stream, cancels the handler, whose ``finally`` calls ``engine.cancel`` so
the slot is freed at once. An engine error ends a stream with a ``data: {"error": ...}``
event naming the reason (and no ``[DONE]``), a non-stream request with an HTTP error: 503
``unavailable`` when the session no longer admits requests by then (it gave up: the pool
cannot host a new run; or it is stopping), since the request was sound and the server,
not the request, cannot serve it now (RFC 9110 §15.6.4: unavailable, may be retried
later); 500 ``engine_error`` when the session still serves (the pipeline failed this
sequence). A stream's error event carries the same type and code. No
traceback ever reaches a client; unexpected exceptions are logged here and answered as a
500 naming only the exception class.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import secrets
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from swactor.model.tokenizer_errors import TokenizerError
from swactor.serve.api import (
    ApiError,
    GenerationRequest,
    bad,
    parse_chat,
    parse_completion,
    parse_json_object,
)
from swactor.serve.engine import (
    Engine,
    FinishReason,
    HealthState,
    SamplingParams,
    Started,
    Tokens,
)
from swactor.serve.metrics import CONTENT_TYPE, ServeMetrics
from swactor.serve.stops import StopMatcher

log = logging.getLogger("swactor.serve")

DEFAULT_COMPLETION_MAX_TOKENS = 16
"""OpenAI's default ``max_tokens`` for ``/v1/completions`` (chat defaults to the room left)."""


@dataclass(frozen=True)
class ServeConfig:
    max_queue: int = 64
    """Requests that may wait for a slot; one more is answered 429."""
    max_body_bytes: int = 1 << 20
    """Largest request body; a larger one is answered 413."""

    def __post_init__(self) -> None:
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")


@dataclass
class _Outcome:
    """What one generation came to (filled in while it runs)."""

    finish_reason: str | None = None
    completion_tokens: int = 0
    error: str | None = None
    times: list[float] = field(default_factory=list)


def _json_response(body: object, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=lambda v: json.dumps(v, ensure_ascii=False))


def _error_response(error: ApiError) -> web.Response:
    response = _json_response(error.body(), status=error.status)
    if error.status == 429:
        response.headers["Retry-After"] = "1"
    return response


def _sse(payload: object) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


class ServeFront:
    """The HTTP server: routes, admission, metrics, over one engine."""

    def __init__(self, engine: Engine, config: ServeConfig | None = None) -> None:
        self.engine = engine
        self.config = config or ServeConfig()
        self._slots = asyncio.Semaphore(engine.slots)
        self._queued = 0
        self._in_flight = 0
        self.metrics = ServeMetrics(
            in_flight=lambda: self._in_flight,
            queued=lambda: self._queued,
            restarts=lambda: self.engine.health().restarts,
        )
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self.url = ""

    # ----------------------------------------------------------------- lifecycle

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.config.max_body_bytes, middlewares=[self._errors]
        )
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model}", self._model)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 8000) -> str:
        """Listen on ``host:port`` (0 picks a free port); returns the base URL."""
        self._runner = web.AppRunner(
            self.app(), handler_cancellation=True, access_log=None
        )
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, host, port)
        await self._site.start()
        bound_host, bound_port = self._runner.addresses[0][:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        self.url = f"http://{shown}:{bound_port}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ---------------------------------------------------------------- middleware

    @web.middleware
    async def _errors(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        route = request.match_info.route.resource
        path = route.canonical if route is not None else "unmatched"
        try:
            response = await handler(request)
        except ApiError as exc:
            response = _error_response(exc)
        except web.HTTPRequestEntityTooLarge:
            response = _error_response(ApiError(
                413, f"request body exceeds {self.config.max_body_bytes} bytes",
                code="request_too_large",
            ))
        except web.HTTPException as exc:
            response = _error_response(ApiError(exc.status, exc.reason, code=None))
        except Exception as exc:
            log.exception("serve: %s %s failed", request.method, path)
            response = _error_response(ApiError(
                500, f"internal error ({exc.__class__.__name__})", kind="server_error",
                code="internal_error",
            ))
        self.metrics.requests.inc(path=path, status=str(response.status))
        return response

    # ------------------------------------------------------------------ handlers

    async def _models(self, request: web.Request) -> web.Response:
        return _json_response({"object": "list", "data": [self._model_card()]})

    async def _model(self, request: web.Request) -> web.Response:
        if request.match_info["model"] != self.engine.model_id:
            raise ApiError(404, f"The model '{request.match_info['model']}' does not exist",
                           param="model", code="model_not_found")
        return _json_response(self._model_card())

    def _model_card(self) -> dict[str, object]:
        return {
            "id": self.engine.model_id, "object": "model", "created": 0,
            "owned_by": "swactor", "context_length": self.engine.context_length,
        }

    async def _health(self, request: web.Request) -> web.Response:
        health = self.engine.health()
        serving = health.state is HealthState.SERVING
        return _json_response({
            "status": "ok" if serving else "unavailable",
            "state": health.state.value,
            "detail": health.detail,
            "restarts": health.restarts,
            "slots": self.engine.slots,
            "in_flight": self._in_flight,
            "queued": self._queued,
        }, status=200 if serving else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.render().encode(), headers={"Content-Type": CONTENT_TYPE}
        )

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        arrival = time.monotonic()
        parsed = parse_completion(parse_json_object(await request.read()))
        return await self._generate(request, parsed, arrival)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        arrival = time.monotonic()
        parsed = parse_chat(parse_json_object(await request.read()))
        return await self._generate(request, parsed, arrival)

    # ---------------------------------------------------------------- generation

    async def _prompt(self, parsed: GenerationRequest) -> list[int]:
        codec = self.engine.tokenizer
        if parsed.prompt_ids is not None:
            if len(parsed.prompt_ids) > self.engine.context_length:
                raise self._too_long(len(parsed.prompt_ids), "prompt")
            vocab = codec.vocab_size
            if any(not 0 <= t < vocab for t in parsed.prompt_ids):
                raise bad(f"'prompt' token ids must be in [0, {vocab})", "prompt")
            return list(parsed.prompt_ids)

        def render_and_encode() -> list[int]:
            if parsed.messages is not None:
                text = codec.apply_chat_template(parsed.messages, add_generation_prompt=True)
            else:
                text = parsed.prompt_text or ""
            return codec.encode(text)

        try:
            ids = await asyncio.to_thread(render_and_encode)
        except TokenizerError as exc:
            raise bad(str(exc), "messages" if parsed.chat else "prompt",
                      code=exc.reason.value) from None
        if not ids:
            raise bad("the prompt is empty", "messages" if parsed.chat else "prompt")
        return ids

    def _refuse_when_full(self) -> None:
        if self._slots.locked() and self._queued >= self.config.max_queue:
            raise ApiError(
                429, f"the admission queue is full ({self.config.max_queue} waiting)",
                kind="rate_limit_error", code="queue_full",
            )

    def _engine_error(self, error: str) -> ApiError:
        """A sequence the engine ended with an error (module doc: 503 or 500)."""
        if not self.engine.health().state.admits:
            return ApiError(503, error, kind="server_error", code="unavailable")
        return ApiError(500, error, kind="server_error", code="engine_error")

    def _too_long(self, count: int, param: str) -> ApiError:
        return bad(
            f"This model's maximum context length is {self.engine.context_length} tokens; "
            f"the prompt has {count} tokens, which leaves no room to generate",
            param, "context_length_exceeded",
        )

    async def _generate(
        self, request: web.Request, parsed: GenerationRequest, arrival: float
    ) -> web.StreamResponse:
        health = self.engine.health()
        if not health.state.admits:
            raise ApiError(503, f"the server is not serving ({health.state.value}"
                           f"{': ' + health.detail if health.detail else ''})",
                           kind="server_error", code="unavailable")
        self._refuse_when_full()  # before tokenizing: a flood costs no CPU past the bound
        prompt = await self._prompt(parsed)
        room = self.engine.context_length - len(prompt)
        if room < 1:
            raise self._too_long(len(prompt), "messages" if parsed.chat else "prompt")
        wanted = parsed.options.max_tokens
        if wanted is None:
            wanted = room if parsed.chat else DEFAULT_COMPLETION_MAX_TOKENS
        params = SamplingParams(
            max_tokens=min(wanted, room),
            temperature=parsed.options.temperature,
            top_p=parsed.options.top_p,
            seed=parsed.options.seed if parsed.options.seed is not None else secrets.randbits(63),
            stop=parsed.options.stop,
        )
        self._refuse_when_full()
        self._queued += 1
        try:
            await self._slots.acquire()
        finally:
            self._queued -= 1
        outcome = _Outcome()
        pieces = self._run(prompt, params, outcome)
        self._in_flight += 1
        try:
            self.metrics.queue_time.observe(time.monotonic() - arrival)
            self.metrics.prompt_tokens.inc(len(prompt))
            ident = ("chatcmpl-" if parsed.chat else "cmpl-") + uuid.uuid4().hex
            if parsed.options.stream:
                return await self._stream(request, parsed, ident, len(prompt), pieces, outcome)
            text = "".join([piece async for piece in pieces])
            if outcome.error is not None:
                raise self._engine_error(outcome.error)
            return _json_response(self._whole(parsed, ident, text, len(prompt), outcome))
        finally:
            # A handler cancelled while writing leaves the generator suspended: closing it
            # runs its `finally`, which cancels the sequence now, not at garbage collection.
            await pieces.aclose()
            self._in_flight -= 1
            self._slots.release()
            self._record(arrival, len(prompt), outcome)

    async def _run(
        self, prompt: list[int], params: SamplingParams, outcome: _Outcome
    ) -> AsyncGenerator[str, None]:
        """Final text pieces of one sequence; ``outcome`` says how it ended."""
        engine = self.engine
        decoder = engine.tokenizer.stream(skip_special=True)
        stops = StopMatcher(params.stop)
        stream = engine.submit(prompt, params)
        finished = False
        try:
            async for event in stream:
                if isinstance(event, Started):
                    continue
                if isinstance(event, Tokens):
                    now = time.monotonic()
                    times = outcome.times
                    before = times[-1] if times else now
                    count = len(event.ids)  # a group's tokens share its interval evenly
                    times.extend(before + (now - before) * (i + 1) / count for i in range(count))
                    outcome.completion_tokens += len(event.ids)
                    text = stops.push("".join(decoder.push(t) for t in event.ids))
                    if text:
                        yield text
                    if stops.stopped:
                        outcome.finish_reason = "stop"
                        return
                    continue
                finished = True
                if event.reason in (FinishReason.STOP, FinishReason.LENGTH):
                    tail = stops.push(decoder.flush())
                    tail += stops.flush()
                    if tail:
                        yield tail
                    outcome.finish_reason = event.reason.value
                elif event.reason is FinishReason.CANCELLED:
                    outcome.error = "the sequence was cancelled by the server" + (
                        f": {event.detail}" if event.detail else "")
                else:
                    outcome.error = event.detail or "the pipeline failed"
                return
            outcome.error = "the engine ended the sequence without a reason"
        except Exception as exc:
            log.exception("serve: engine failed on sequence %d", stream.sequence_id)
            outcome.error = f"the engine failed ({exc.__class__.__name__})"
        finally:
            if not finished:
                engine.cancel(stream.sequence_id)

    async def _stream(
        self,
        request: web.Request,
        parsed: GenerationRequest,
        ident: str,
        prompt_tokens: int,
        pieces: AsyncIterator[str],
        outcome: _Outcome,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
        })
        await response.prepare(request)
        created = int(time.time())
        model = self.engine.model_id
        kind = "chat.completion.chunk" if parsed.chat else "text_completion"

        def chunk(text: str | None, finish: str | None, role: bool = False) -> dict[str, object]:
            choice: dict[str, object]
            if parsed.chat:
                delta: dict[str, object] = {"role": "assistant"} if role else {}
                if text is not None:
                    delta["content"] = text
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "logprobs": None,
                          "finish_reason": finish}
            return {"id": ident, "object": kind, "created": created, "model": model,
                    "choices": [choice]}

        try:
            if parsed.chat:
                await response.write(_sse(chunk("", None, role=True)))
            async for piece in pieces:
                await response.write(_sse(chunk(piece, None)))
            if outcome.error is not None:
                await response.write(_sse(self._engine_error(outcome.error).body()))
                await response.write_eof()
                return response
            await response.write(
                _sse(chunk(None if parsed.chat else "", outcome.finish_reason))
            )
            if parsed.options.include_usage:
                usage = {"id": ident, "object": kind, "created": created, "model": model,
                         "choices": [], "usage": _usage(prompt_tokens, outcome)}
                await response.write(_sse(usage))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionError:
            log.info("serve: client went away mid-stream")  # _generate cancels the sequence
        return response

    def _whole(
        self, parsed: GenerationRequest, ident: str, text: str, prompt_tokens: int,
        outcome: _Outcome,
    ) -> dict[str, object]:
        choice: dict[str, object] = {"index": 0, "logprobs": None,
                                  "finish_reason": outcome.finish_reason}
        if parsed.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {
            "id": ident,
            "object": "chat.completion" if parsed.chat else "text_completion",
            "created": int(time.time()),
            "model": self.engine.model_id,
            "choices": [choice],
            "usage": _usage(prompt_tokens, outcome),
        }

    def _record(self, arrival: float, prompt_tokens: int, outcome: _Outcome) -> None:
        metrics = self.metrics
        times = outcome.times
        metrics.completion_tokens.inc(len(times))
        reason = outcome.finish_reason or ("error" if outcome.error else "cancelled")
        metrics.finished.inc(reason=reason)
        rate = 0.0
        if times:
            metrics.ttft.observe(times[0] - arrival)
            for before, after in itertools.pairwise(times):
                metrics.inter_token.observe(after - before)
            if len(times) > 1 and times[-1] > times[0]:
                rate = (len(times) - 1) / (times[-1] - times[0])
                metrics.decode_rate.observe(rate)
        log.info(
            "serve: request done: %d prompt tokens, %d generated, ttft %s, %.1f tokens/s, %s",
            prompt_tokens, len(times),
            f"{times[0] - arrival:.3f} s" if times else "-", rate, reason,
        )


def _usage(prompt_tokens: int, outcome: _Outcome) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "total_tokens": prompt_tokens + outcome.completion_tokens,
    }
