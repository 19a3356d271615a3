"""QUIC transport on aioquic: node identity, the endpoint, the edge driver, the control channel.

Modules, each with its theory of operation at the top:

- `identity`: Ed25519 node key (0600), `node_id` = first 8 bytes of sha256(raw public
  key), little endian; self-signed certificate. `identity_cmd`: `swactor node-id`.
- `config`: `TransportConfig`, validated settings (datagram size <= 16383, connection
  window >= edges x stream window, ...), and the aioquic configuration built from it.
- `flow`: `SwactorConnection`, aioquic's connection with consumer-credited flow control,
  the client-certificate request, optional pacing, key updates before the AES-GCM limit;
  `PRIVATE_NAMES` lists what it relies on.
- `endpoint`: `QuicEndpoint` (one UDP socket per node, batched reads, mutual identity
  checks, Retry address validation and half-open caps, connection cache by (peer,
  ALPN), keep-alives) and `QuicLink` (one connection); `retry`: the Retry tokens.
- `driver`: `Driver` (spec §24-§25): edge demux and rendezvous; `recv_edge` / `send_edge`
  bind each edge to the generated `recv_pump` / `send_pump` machines; `inbound` holds
  received, not yet consumed stream bytes; `messages` the driver messages and events;
  `sinks` the callback types; `doorbells` routes wake hints to worker eventfds.
- `control`: `ControlChannel` on `swactor/ctl/1` (schemas, request/reply, authority).
"""

from swactor.transport.config import CONTROL_ALPN, EDGE_ALPN, TransportConfig
from swactor.transport.control import ControlAuthority, ControlChannel, RejectCode
from swactor.transport.doorbells import DoorbellRouter, WorkerWakeRoute
from swactor.transport.driver import Driver
from swactor.transport.endpoint import PeerRefused, QuicEndpoint, QuicLink
from swactor.transport.errors import (
    ConnectionLostError,
    ControlError,
    IdentityError,
    KeyFilePermissionsError,
    PeerRejectedError,
    TransportConfigError,
    TransportError,
)
from swactor.transport.identity import NodeIdentity, node_id_from_public_key
from swactor.transport.messages import (
    DriverEdgeReady,
    DriverEvent,
    EstablishRecv,
    EstablishSend,
    PumpStopped,
    StopEdge,
    StreamArrived,
    StreamClosed,
    StreamFault,
    WakeHint,
)

__all__ = [
    "CONTROL_ALPN",
    "EDGE_ALPN",
    "ConnectionLostError",
    "ControlAuthority",
    "ControlChannel",
    "ControlError",
    "DoorbellRouter",
    "Driver",
    "DriverEdgeReady",
    "DriverEvent",
    "EstablishRecv",
    "EstablishSend",
    "IdentityError",
    "KeyFilePermissionsError",
    "NodeIdentity",
    "PeerRefused",
    "PeerRejectedError",
    "PumpStopped",
    "QuicEndpoint",
    "QuicLink",
    "RejectCode",
    "StopEdge",
    "StreamArrived",
    "StreamClosed",
    "StreamFault",
    "TransportConfig",
    "TransportConfigError",
    "TransportError",
    "WakeHint",
    "WorkerWakeRoute",
    "node_id_from_public_key",
]
