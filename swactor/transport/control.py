"""The control channel: swactor messages between nodes on ALPN `swactor/ctl/1`.

Theory of operation
-------------------
Each request travels on its own bidirectional QUIC stream of the cached, identity-checked
control connection to the peer: the requester writes one frame and FIN, the responder
answers one frame and FIN. A frame is a 4-byte big-endian length, then a UTF-8 JSON
object:

    {"kind": "request", "type": <message class name>, "body": <message.to_json()>}
    {"kind": "reply",   "type": <class name>, "body": {...}}   handler answered a message
    {"kind": "ack"}                                            handler answered nothing
    {"kind": "reject",  "code": <RejectCode>, "reason": <text>}

The schema per message type is the registry the channel is built with: class name ->
`WireStruct` subclass, whose strict `from_json` checks every key and field. A frame that
is too long (`MAX_FRAME`), not JSON, of unknown kind or type, or whose body breaks its
type's rules is answered `reject BadMessage` — never a traceback, and no message quotes
the frame's bytes.

Authority (`ControlAuthority`, spec §4): message types listed as orchestrator-only
(provisioning, stop) are accepted only from the orchestrator node id this node was told
to trust; a message with a `run_id` field must name the active run (a provisioning
message may open the first run); a message with an `edge_id` field must name an edge of
the active plan. Violations are answered `reject` with `Unauthorized`, `RunMismatch` or
`UnknownEdge`, and the requester's `request()` raises `ControlRejectedError`.

`request(peer, message, timeout)` raises `ControlTimeoutError` when no answer arrives in
time (the stream is reset). Control streams are credited as their bytes are buffered: the
responder holds at most one `MAX_FRAME` per stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import struct
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

from swactor.transport.config import CONTROL_ALPN
from swactor.transport.endpoint import QuicEndpoint, QuicLink
from swactor.transport.errors import ConnectionLostError, ControlError
from swactor.wire.codec import WireStruct
from swactor.wire.errors import ReasonError, WireError

MAX_FRAME = 1 << 20
REJECTED_KEPT = 256
"""How many of the latest rejections `ControlChannel.rejected` keeps."""
REASON_KEPT = 300
_LEN = struct.Struct(">I")

Handler = Callable[[int, WireStruct], Awaitable[WireStruct | None]]


class RejectCode(enum.Enum):
    BadMessage = "BadMessage"
    Unauthorized = "Unauthorized"
    RunMismatch = "RunMismatch"
    UnknownEdge = "UnknownEdge"
    HandlerFailed = "HandlerFailed"


class ControlRejectedError(ReasonError[RejectCode], ControlError):
    """The peer refused a request; `reason` is its RejectCode, `detail` its words."""

    def __str__(self) -> str:
        return f"control request rejected ({self.reason.value}): {self.detail}"


class ControlTimeoutError(ControlError):
    """No answer arrived within the request's timeout."""


class _Reject(ReasonError[RejectCode]):
    """A request this side refuses: the RejectCode and the words sent back."""


@dataclass
class ControlAuthority:
    """Who may tell this node what (spec §4); the node updates it as plans change."""

    orchestrator_id: int | None = None
    orchestrator_only: frozenset[str] = frozenset()
    opening_types: frozenset[str] = frozenset()
    active_run_id: int | None = None
    active_edges: set[int] = field(default_factory=set)

    def check(self, peer: int, message: WireStruct) -> None:
        name = type(message).__name__
        if name in self.orchestrator_only and peer != self.orchestrator_id:
            raise _Reject(
                RejectCode.Unauthorized,
                f"{name} is accepted only from the orchestrator, not node {peer:#018x}",
            )
        run_id = getattr(message, "run_id", None)
        if run_id is not None and int(run_id) != self.active_run_id:
            opening = self.active_run_id is None and name in self.opening_types
            if not opening:
                raise _Reject(
                    RejectCode.RunMismatch,
                    f"{name} names run {int(run_id)}, active run is {self.active_run_id}",
                )
        edge_id = getattr(message, "edge_id", None)
        if edge_id is not None and int(edge_id) not in self.active_edges:
            raise _Reject(RejectCode.UnknownEdge, f"{name} names edge {int(edge_id)}, not in plan")


def encode_frame(document: dict[str, object]) -> bytes:
    body = json.dumps(document, separators=(",", ":"), allow_nan=False).encode()
    if len(body) > MAX_FRAME:
        raise ControlError(f"control frame of {len(body)} bytes exceeds {MAX_FRAME}")
    return _LEN.pack(len(body)) + body


def decode_frame(frame: bytes) -> dict[str, object]:
    """Parse one complete frame; `_Reject(BadMessage)` names what is wrong."""
    if len(frame) < _LEN.size:
        raise _Reject(RejectCode.BadMessage, "frame shorter than its length prefix")
    (length,) = _LEN.unpack_from(frame)
    if length > MAX_FRAME:
        raise _Reject(RejectCode.BadMessage, f"frame length {length} exceeds {MAX_FRAME}")
    if len(frame) != _LEN.size + length:
        raise _Reject(
            RejectCode.BadMessage, f"frame holds {len(frame) - _LEN.size} of {length} bytes"
        )
    try:
        document = json.loads(frame[_LEN.size :])
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise _Reject(RejectCode.BadMessage, "frame is not UTF-8 JSON") from None
    if not isinstance(document, dict):
        raise _Reject(RejectCode.BadMessage, "frame is not a JSON object")
    return document


def _message(
    document: Mapping[str, object], registry: Mapping[str, type[WireStruct]]
) -> WireStruct:
    if set(document) != {"kind", "type", "body"}:
        raise _Reject(RejectCode.BadMessage, "expected keys kind, type, body")
    name = document["type"]
    message_type = registry.get(name) if isinstance(name, str) else None
    if message_type is None:
        raise _Reject(RejectCode.BadMessage, "unknown message type")
    try:
        return message_type.from_json(document["body"])
    except WireError as exc:
        raise _Reject(RejectCode.BadMessage, str(exc)[:300]) from None


class ControlChannel:
    """Request/reply over `swactor/ctl/1` with schemas and authority checks."""

    def __init__(
        self,
        endpoint: QuicEndpoint,
        registry: Iterable[type[WireStruct]],
        handler: Handler,
        authority: ControlAuthority,
    ) -> None:
        self.endpoint = endpoint
        self.registry = {tp.__name__: tp for tp in registry}
        self.authority = authority
        self.rejected: deque[tuple[int, RejectCode, str]] = deque(maxlen=REJECTED_KEPT)
        """The latest rejections (peer, code, reason); `rejected_count` counts them all."""
        self.rejected_count = 0
        self._handler = handler
        self._inbound: dict[tuple[QuicLink, int], bytearray] = {}
        self._replies: dict[tuple[QuicLink, int], tuple[bytearray, asyncio.Future[bytes]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        endpoint.register_handler(CONTROL_ALPN, self)

    # -- requester ----------------------------------------------------------------

    async def request(
        self, peer_node_id: int, message: WireStruct, timeout: float = 10.0
    ) -> WireStruct | None:
        """Send `message`; the peer's reply message (None for a plain ack)."""
        name = type(message).__name__
        if name not in self.registry:
            raise ControlError(f"{name} is not a registered control message type")
        frame = encode_frame({"kind": "request", "type": name, "body": message.to_json()})
        raw = await self.request_raw(peer_node_id, frame, timeout, what=name)
        try:
            document = decode_frame(raw)
            kind = document.get("kind")
            if kind == "ack" and set(document) == {"kind"}:
                return None
            if kind == "reject" and set(document) == {"kind", "code", "reason"}:
                code = RejectCode(document["code"])
                raise ControlRejectedError(code, str(document["reason"]))
            if kind == "reply":
                return _message(document, self.registry)
        except (_Reject, ValueError) as exc:
            raise ControlError(f"malformed answer to {name}: {exc}") from None
        raise ControlError(f"malformed answer to {name}: unknown kind")

    async def request_raw(
        self, peer_node_id: int, frame: bytes, timeout: float, what: str = "request"
    ) -> bytes:
        """Send one already-framed request; the raw answer frame."""
        link = await self.endpoint.connect(peer_node_id, CONTROL_ALPN)
        stream_id = link.open_bidi_stream()
        key = (link, stream_id)
        answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._replies[key] = (bytearray(), answer)
        try:
            link.send(stream_id, frame, end=True)
            return await asyncio.wait_for(answer, timeout)
        except TimeoutError:
            link.reset_stream(stream_id)
            raise ControlTimeoutError(
                f"{what} to node {peer_node_id:#018x}: no answer within {timeout} s"
            ) from None
        finally:
            self._replies.pop(key, None)

    # -- LinkHandler ----------------------------------------------------------------

    def stream_data(self, link: QuicLink, stream_id: int, data: bytes, end: bool) -> None:
        key = (link, stream_id)
        link.consume(stream_id, len(data))
        waiting = self._replies.get(key)
        if waiting is not None:
            buffer, answer = waiting
            buffer += data
            if len(buffer) > MAX_FRAME + _LEN.size and not answer.done():
                answer.set_exception(ControlError("answer exceeds the frame limit"))
            elif end and not answer.done():
                answer.set_result(bytes(buffer))
            return
        we_are_client = link.expected_peer is not None
        if (stream_id & 1) == (0 if we_are_client else 1):
            return  # our own stream whose request already ended (timeout): drop the answer
        buffer = self._inbound.setdefault(key, bytearray())
        buffer += data
        if len(buffer) > MAX_FRAME + _LEN.size:
            del self._inbound[key]
            self._answer(link, stream_id, self._reject_doc(link, RejectCode.BadMessage, "too long"))
        elif end:
            del self._inbound[key]
            serve = self._serve(link, stream_id, bytes(buffer))
            task = asyncio.get_running_loop().create_task(serve)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def stream_reset(self, link: QuicLink, stream_id: int, error_code: int) -> None:
        link.quic.settle_stream(stream_id)
        self._inbound.pop((link, stream_id), None)
        waiting = self._replies.get((link, stream_id))
        if waiting is not None and not waiting[1].done():
            waiting[1].set_exception(ConnectionLostError(f"peer reset, code {error_code:#x}"))

    def stream_stopped(self, link: QuicLink, stream_id: int, error_code: int) -> None:
        """The peer stopped reading a control stream: aioquic already reset our sending
        side; a pending reply still comes (or the request times out) as before."""

    def link_closed(self, link: QuicLink, reason: str) -> None:
        for key in [key for key in self._inbound if key[0] is link]:
            del self._inbound[key]
        for key, (_, answer) in list(self._replies.items()):
            if key[0] is link and not answer.done():
                answer.set_exception(ConnectionLostError(f"control connection lost: {reason}"))

    # -- responder ------------------------------------------------------------------

    async def _serve(self, link: QuicLink, stream_id: int, frame: bytes) -> None:
        peer = link.peer_node_id
        assert peer is not None
        try:
            document = decode_frame(frame)
            if document.get("kind") != "request":
                raise _Reject(RejectCode.BadMessage, "expected a request")
            message = _message(document, self.registry)
            self.authority.check(peer, message)
        except _Reject as rejection:
            doc = self._reject_doc(link, rejection.reason, rejection.detail)
            self._answer(link, stream_id, doc)
            return
        try:
            reply = await self._handler(peer, message)
        except ControlError as exc:
            reason = f"{type(message).__name__} failed: {exc}"
            self._answer(link, stream_id, self._reject_doc(link, RejectCode.HandlerFailed, reason))
            return
        if reply is None:
            self._answer(link, stream_id, {"kind": "ack"})
        else:
            name = type(reply).__name__
            self._answer(link, stream_id, {"kind": "reply", "type": name, "body": reply.to_json()})

    def _reject_doc(self, link: QuicLink, code: RejectCode, reason: str) -> dict[str, object]:
        self.rejected_count += 1
        self.rejected.append((link.peer_node_id or 0, code, reason[:REASON_KEPT]))
        return {"kind": "reject", "code": code.value, "reason": reason}

    def _answer(self, link: QuicLink, stream_id: int, document: dict[str, object]) -> None:
        if link.closed:
            return
        # the requester reset the stream or the link is gone: nobody to answer
        with contextlib.suppress(ConnectionLostError, RuntimeError, ValueError):
            link.send(stream_id, encode_frame(document), end=True)
