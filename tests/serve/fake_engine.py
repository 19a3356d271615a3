"""A FAKE engine and tokenizer for the HTTP front's unit tests (no pipeline, no model).

``FakeEngine`` plays a scripted reply as token ids; ``FakeCodec`` is a toy tokenizer whose
ids 0-255 are single characters and whose ids from 256 on are the reply's multi-character
pieces, so a test chooses exactly where token boundaries fall. The chat template is
rendered by the real :func:`swactor.model.chat.render_chat` with a ChatML template.
The server runs in its own thread and event loop; the test thread steers the fake through
thread-safe ``threading.Event`` objects.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field

from swactor.model.chat import render_chat
from swactor.serve.engine import (
    Finished,
    FinishReason,
    Health,
    HealthState,
    SamplingParams,
    SequenceEvent,
    TextCodec,
    Tokens,
)
from swactor.serve.server import ServeConfig, ServeFront

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
EOS_TEXT = "<|im_end|>"


class FakeStream:
    """Decodes fake ids to their piece text, skipping the EOS id."""

    def __init__(self, codec: FakeCodec) -> None:
        self._codec = codec

    def push(self, token_id: int) -> str:
        return "" if token_id == self._codec.eos_id else self._codec.pieces[token_id]

    def flush(self) -> str:
        return ""


class FakeCodec:
    def __init__(self, extra_pieces: Sequence[str] = ()) -> None:
        self.pieces = [chr(i) for i in range(256)] + [EOS_TEXT, *extra_pieces]
        self.eos_id = 256

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    def id_of(self, piece: str) -> int:
        return self.pieces.index(piece, 256) if len(piece) > 1 else ord(piece)

    def encode(
        self, text: str, add_bos: bool | None = None, parse_special: bool = True,
        add_eos: bool | None = None,
    ) -> list[int]:
        ids: list[int] = []
        rest = text
        while rest:
            if parse_special and rest.startswith(EOS_TEXT):
                ids.append(self.eos_id)
                rest = rest[len(EOS_TEXT):]
                continue
            ids.append(ord(rest[0]) if ord(rest[0]) < 256 else ord("?"))
            rest = rest[1:]
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.pieces[i] for i in ids)

    def stream(self, skip_special: bool = True) -> FakeStream:
        return FakeStream(self)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> str:
        return render_chat(CHATML, messages, add_generation_prompt=add_generation_prompt)


@dataclass
class Submitted:
    sequence_id: int
    prompt: list[int]
    params: SamplingParams


@dataclass
class FakeEngine:
    """Plays ``reply`` (pieces, each one token) for every sequence; see module docstring."""

    reply: list[str] = field(default_factory=lambda: ["Hel", "lo", " wor", "ld", "!"])
    context_length: int = 256
    slots: int = 2
    model_id: str = "fake-model"
    fail_after: int | None = None
    """Yield this many tokens, then end with an ERROR."""
    fail_state: HealthState | None = None
    """The health state the engine is in when it ends a sequence with an ERROR."""
    hold_after: int | None = None
    """Yield this many tokens, then wait for ``release`` (or a cancel)."""
    group: int = 1
    """Tokens per ``Tokens`` event."""
    state: HealthState = HealthState.SERVING
    restarts: int = 0
    release: threading.Event = field(default_factory=threading.Event)
    cancelled: list[int] = field(default_factory=list)
    cancel_seen: threading.Event = field(default_factory=threading.Event)
    submitted: list[Submitted] = field(default_factory=list)
    real_tokenizer: TextCodec | None = None
    """Use this tokenizer (the model's own) instead of the fake one ..."""
    reply_ids: list[int] | None = None
    """... and play these ids instead of ``reply``."""
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    codec: FakeCodec = field(init=False)

    def __post_init__(self) -> None:
        self.codec = FakeCodec([p for p in self.reply if len(p) > 1])

    @property
    def tokenizer(self) -> TextCodec:
        return self.real_tokenizer or self.codec

    def health(self) -> Health:
        return Health(self.state, "fake", self.restarts)

    def submit(self, prompt: Sequence[int], params: SamplingParams) -> _FakeSequence:
        sequence = _FakeSequence(self, next(self._ids), params)
        self.submitted.append(Submitted(sequence.sequence_id, list(prompt), params))
        return sequence

    def cancel(self, sequence_id: int) -> None:
        self.cancelled.append(sequence_id)
        self.cancel_seen.set()


class _FakeSequence:
    def __init__(self, engine: FakeEngine, sequence_id: int, params: SamplingParams) -> None:
        self._engine = engine
        self.sequence_id = sequence_id
        self._params = params

    def __aiter__(self) -> AsyncIterator[SequenceEvent]:
        return self._events()

    def _cancelled(self) -> bool:
        return self.sequence_id in self._engine.cancelled

    async def _events(self) -> AsyncIterator[SequenceEvent]:
        engine = self._engine
        ids = engine.reply_ids or [engine.codec.id_of(p) for p in engine.reply]
        sent = 0
        while sent < len(ids):
            if engine.fail_after is not None and sent >= engine.fail_after:
                if engine.fail_state is not None:
                    engine.state = engine.fail_state
                yield Finished(FinishReason.ERROR, "stage 1 worker died (signal 9)")
                return
            if engine.hold_after is not None and sent >= engine.hold_after:
                while not engine.release.is_set():
                    if self._cancelled():
                        yield Finished(FinishReason.CANCELLED)
                        return
                    await asyncio.sleep(0.005)
            room = self._params.max_tokens - sent
            if room == 0:
                yield Finished(FinishReason.LENGTH)
                return
            take = ids[sent: sent + min(engine.group, room)]
            sent += len(take)
            await asyncio.sleep(0)
            yield Tokens(tuple(take))
        yield Finished(FinishReason.STOP if sent < self._params.max_tokens
                       else FinishReason.LENGTH)


class ServerThread:
    """A :class:`ServeFront` over ``engine`` on 127.0.0.1, in its own thread and loop."""

    def __init__(self, engine: FakeEngine, config: ServeConfig | None = None) -> None:
        self.engine = engine
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.front: ServeFront | None = None

        async def start() -> str:
            self.front = ServeFront(engine, config)
            return await self.front.start("127.0.0.1", 0)

        self.url = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)

    def close(self) -> None:
        assert self.front is not None
        asyncio.run_coroutine_threadsafe(self.front.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
