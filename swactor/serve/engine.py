"""What the HTTP front needs from the pipeline: the :class:`Engine` protocol.

Theory of operation: the front (:mod:`swactor.serve.server`) owns everything that is HTTP
and text: it parses and checks a request, renders the chat template, tokenizes, admits the
request into a bounded queue, hands the engine a prompt as token ids with its
:class:`SamplingParams`, decodes the ids the engine yields back to text, cuts stop strings,
and answers in OpenAI's shapes. The engine owns the pipeline: it runs sequences and yields
token ids. See the package docstring for what each side guarantees.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from swactor.model.tokenizer import Tokenizer


@dataclass(frozen=True)
class SamplingParams:
    """How one sequence is sampled and when it ends.

    ``temperature == 0.0`` means greedy (``top_p`` and ``seed`` then have no effect);
    otherwise the engine samples with ``temperature``/``top_p`` and a generator seeded by
    ``seed`` (the front always picks one, so a request without ``seed`` is still
    reproducible from the log). ``max_tokens`` already fits the context: prompt length +
    ``max_tokens`` <= the engine's ``context_length``. ``stop`` is informational: the
    front matches stop strings on decoded text and cancels the sequence itself.
    """

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = ()
    first_step: int = 0
    """Sampling step of the first token: 0, or for a sequence continued on a new run the
    tokens it already generated (they end its prompt), so a sampled continuation draws
    what the undisturbed sequence would have."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.first_step < 0:
            raise ValueError(f"first_step must be >= 0, got {self.first_step}")


class FinishReason(enum.Enum):
    """Why a sequence ended (the last event of every sequence names one)."""

    STOP = "stop"
    """The model produced an end-of-generation token (not yielded)."""
    LENGTH = "length"
    """``max_tokens`` tokens were yielded."""
    CANCELLED = "cancelled"
    """:meth:`Engine.cancel` ended it."""
    ERROR = "error"
    """The run faulted (stage, worker, edge) or the engine is stopping; ``detail`` says
    which in words a client may read (no payload, no traceback)."""


@dataclass(frozen=True)
class Tokens:
    """Token ids the sequence produced since the previous event (one or a group)."""

    ids: tuple[int, ...]


@dataclass(frozen=True)
class Started:
    """The sequence left the engine's own queue and its prefill began (optional)."""


@dataclass(frozen=True)
class Finished:
    """The sequence's last event."""

    reason: FinishReason
    detail: str = ""


SequenceEvent = Tokens | Started | Finished


class SequenceStream(Protocol):
    """One submitted sequence: its id and its events, ending with exactly one
    :class:`Finished`."""

    @property
    def sequence_id(self) -> int: ...

    def __aiter__(self) -> AsyncIterator[SequenceEvent]: ...


class HealthState(enum.Enum):
    """The serving session's state, as ``GET /health`` reports it."""

    PROVISIONING = "Provisioning"
    SERVING = "Serving"
    RECOVERING = "Recovering"
    STOPPING = "Stopping"
    STOPPED = "Stopped"
    FAILED = "Failed"

    @property
    def admits(self) -> bool:
        """New requests are queued in this state (served once a run is up)."""
        return self in (HealthState.PROVISIONING, HealthState.SERVING, HealthState.RECOVERING)


@dataclass(frozen=True)
class Health:
    state: HealthState
    detail: str = ""
    restarts: int = 0
    """Runs provisioned again after a fault since the session started."""


class TextStream(Protocol):
    """Incremental decoder (:class:`swactor.model.tokenizer.StreamDecoder`)."""

    def push(self, token_id: int) -> str: ...

    def flush(self) -> str: ...


class TextCodec(Protocol):
    """The model's tokenizer as the front uses it; :class:`swactor.model.tokenizer.Tokenizer`
    fits it."""

    @property
    def vocab_size(self) -> int: ...

    def encode(
        self,
        text: str,
        add_bos: bool | None = None,
        parse_special: bool = True,
        add_eos: bool | None = None,
    ) -> list[int]: ...

    def stream(self, skip_special: bool = True) -> TextStream: ...

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, str]],
        add_generation_prompt: bool = True,
    ) -> str: ...


class Engine(Protocol):
    """A warm pipeline that runs sequences (see the package docstring for the contract)."""

    @property
    def model_id(self) -> str: ...

    @property
    def context_length(self) -> int:
        """Most positions one sequence may use (prompt + generated tokens)."""
        ...

    @property
    def slots(self) -> int:
        """Most sequences the engine runs at once; the front never has more submitted."""
        ...

    @property
    def tokenizer(self) -> TextCodec: ...

    def health(self) -> Health: ...

    def submit(self, prompt: Sequence[int], params: SamplingParams) -> SequenceStream:
        """Start a sequence; its events come from the returned stream."""
        ...

    def cancel(self, sequence_id: int) -> None:
        """End a sequence now and free its slot; idempotent, never blocks, never raises."""
        ...


if TYPE_CHECKING:

    def _tokenizer_fits(tokenizer: Tokenizer) -> TextCodec:
        """mypy proves the model's tokenizer is a :class:`TextCodec` (never called)."""
        return tokenizer
