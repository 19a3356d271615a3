"""Transport settings and the aioquic configuration built from them.

Theory of operation
-------------------
`TransportConfig` holds every tunable of the QUIC transport in one validated, frozen
value. Rules it enforces (each violation is a `TransportConfigError` naming the field):

* `max_datagram_size` is at most 16383: aioquic encodes packet lengths as 2-byte varints,
  and larger datagrams corrupt streams. 1452 (a 1500-byte Ethernet MTU minus IPv6 and UDP
  headers) is the default between hosts; loopback can use up to 16383.
* the connection window is at least `edges_per_connection x stream_window`, because all
  edges of one connection share MAX_DATA: a smaller connection window lets one stalled
  edge starve the others.
* the send high-water mark is positive: a sender waits while its unacknowledged buffer is
  above it.

`socket_buffer` sizes the UDP socket's SO_RCVBUF/SO_SNDBUF (the kernel caps it at
net.core.rmem_max/wmem_max): with the 208 KiB default, bursts of large datagrams overflow
the receive buffer on loopback, every drop halves the congestion window, and throughput
collapses.

`pacing=True` (the default) paces with `flow.TickPacer`: aioquic's token bucket, with
bursts sized to 2 ms of the pacing rate so that asyncio's millisecond timer granularity
does not cap the rate (aioquic's own burst of 16 datagrams then a sub-millisecond timer
ran at 16 datagrams per ms). `pacing=False` never delays a packet: on loopback and fast
LANs the congestion window alone is enough (both measured in bench/quic.py).

`udp_offload` batches datagrams through Linux UDP GSO (send) and GRO (receive): one
system call per run of up to 64 same-size datagrams instead of one each (see `udp.py`;
it falls back to plain sendto/recvfrom where the kernel refuses).

`native_path` (default on) seals and opens edge-stream packets in C (`bulk.py`,
`native/quicfast.c`) once a connection is in its steady state; off, aioquic builds and
parses every packet in Python (the reference the tests compare it with). Its default
comes from `SWACTOR_NATIVE_QUIC` (`1`, the default, or `0`): a switch for `swactor node`
and `swactor run` without a flag of their own, e.g. to rule the native path out.

Server-side admission (see `endpoint.py`, `retry.py`): every Initial must carry a Retry
token issued to its source address before any connection state is built;
`max_half_open` connections at most may be in their handshake at once,
`max_half_open_per_host` of them from one host, and one that is not verified within
`handshake_timeout` is dropped.

`key_update_packets`: a connection starts a key update (RFC 9001 §6) after sending this
many packets under one key, half the AES-GCM confidentiality limit of 2^23 packets
(RFC 9001 §6.6) at most, so that a link reused run after run never reaches it.

`ack_hold` (seconds, default `flow.ACK_HOLD_S`; 0: never): how long the ACK of a lone
ack-eliciting packet may wait for data of ours to ride with (`flow.SwactorConnection.
hold_ack`); the connection advertises twice it as its max_ack_delay (at least 25 ms), so
the peer's loss recovery allows for it. Below 8 s (the transport parameter is below
2^14 ms).

`quic_configuration()` turns it into an aioquic `QuicConfiguration` carrying the node's
certificate. Certificate chains are not verified by aioquic (`verify_mode=CERT_NONE`):
identities are checked after the handshake by `endpoint.py` instead (the node id the
certificate's key hashes to, and the full key where the pool file pins one). No session
tickets are issued or used, so 0-RTT never happens.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field

from aioquic.quic.configuration import QuicConfiguration
from aioquic.tls import CipherSuite

from swactor.transport.errors import TransportConfigError
from swactor.transport.identity import NodeIdentity

ACK_HOLD_S = 0.04
"""Default `ack_hold`: seconds the ACK of a lone ack-eliciting packet waits for data to
ride with (`flow.SwactorConnection.hold_ack`); longer than a decode step's compute on a
CPU stage, so that a 1-stage token's ACK leaves with the stage's answer."""

EDGE_ALPN = "swactor/edge/1"
CONTROL_ALPN = "swactor/ctl/1"
ARTIFACT_ALPN = "swactor/artifact/1"
"""Byte ranges of an offered file (`artifact_stream.py`)."""
ALPNS = (EDGE_ALPN, CONTROL_ALPN, ARTIFACT_ALPN)

CIPHER_SUITES = (
    CipherSuite.AES_128_GCM_SHA256,
    CipherSuite.AES_256_GCM_SHA384,
    CipherSuite.CHACHA20_POLY1305_SHA256,
)
AES_GCM_CONFIDENTIALITY_LIMIT = 1 << 23
"""Packets one AES-GCM key may protect (RFC 9001 §6.6)."""
MAX_SAFE_DATAGRAM = 16383
MIN_DATAGRAM = 1200


NATIVE_PATH_ENV = "SWACTOR_NATIVE_QUIC"


def native_path_from_env() -> bool:
    """`SWACTOR_NATIVE_QUIC`: unset or `1` -> True, `0` -> False; anything else is
    refused (a typo must not silently pick a transport)."""
    value = os.environ.get(NATIVE_PATH_ENV, "1").strip()
    if value not in ("0", "1"):
        raise TransportConfigError(f"{NATIVE_PATH_ENV}={value!r}: expected 0 or 1")
    return value == "1"


@dataclass(frozen=True, slots=True)
class TransportConfig:
    """Validated transport settings (sizes in bytes, times in seconds)."""

    max_datagram_size: int = 1452
    stream_window: int = 1 << 20
    edges_per_connection: int = 8
    connection_window: int = 8 << 20
    send_high_water: int = 1 << 20
    idle_timeout: float = 30.0
    keepalive_interval: float = 5.0
    handshake_timeout: float = 10.0
    max_half_open: int = 128
    max_half_open_per_host: int = 16
    key_update_packets: int = 1 << 22
    socket_buffer: int = 4 << 20
    pacing: bool = True
    udp_offload: bool = True
    native_path: bool = field(default_factory=lambda: native_path_from_env())
    ack_hold: float = ACK_HOLD_S

    def __post_init__(self) -> None:
        if not MIN_DATAGRAM <= self.max_datagram_size <= MAX_SAFE_DATAGRAM:
            raise TransportConfigError(
                f"max_datagram_size={self.max_datagram_size} is outside "
                f"[{MIN_DATAGRAM}, {MAX_SAFE_DATAGRAM}] (larger datagrams corrupt aioquic "
                "streams: packet lengths are 2-byte varints)"
            )
        for name in (
            "stream_window", "edges_per_connection", "send_high_water", "max_half_open",
            "max_half_open_per_host", "key_update_packets",
        ):  # fmt: skip
            if getattr(self, name) <= 0:
                raise TransportConfigError(f"{name}={getattr(self, name)} must be positive")
        needed = self.edges_per_connection * self.stream_window
        if self.connection_window < needed:
            raise TransportConfigError(
                f"connection_window={self.connection_window} is below edges_per_connection "
                f"x stream_window = {needed}: one stalled edge could starve the others"
            )
        if self.key_update_packets > AES_GCM_CONFIDENTIALITY_LIMIT // 2:
            raise TransportConfigError(
                f"key_update_packets={self.key_update_packets} must be at most half the "
                f"AES-GCM confidentiality limit ({AES_GCM_CONFIDENTIALITY_LIMIT // 2})"
            )
        if not 0 <= self.ack_hold < 8.0:
            raise TransportConfigError(
                f"ack_hold={self.ack_hold} must be at least 0 and below 8 s (twice it is "
                "advertised as max_ack_delay, which must be below 2^14 ms)"
            )
        if self.handshake_timeout <= 0:
            raise TransportConfigError(
                f"handshake_timeout={self.handshake_timeout} must be positive"
            )
        if not 0 < self.keepalive_interval < self.idle_timeout:
            raise TransportConfigError(
                f"keepalive_interval={self.keepalive_interval} must be positive and below "
                f"idle_timeout={self.idle_timeout}"
            )

    def quic_configuration(self, identity: NodeIdentity, *, is_client: bool) -> QuicConfiguration:
        """The aioquic configuration for one side of a connection."""
        config = QuicConfiguration(
            alpn_protocols=list(ALPNS),
            is_client=is_client,
            idle_timeout=self.idle_timeout,
            max_datagram_size=self.max_datagram_size,
            max_data=self.connection_window,
            max_stream_data=self.stream_window,
            verify_mode=ssl.CERT_NONE,
            # AES-128-GCM first (aioquic prefers AES-256): fewer AES rounds per byte on
            # the bulk path (bulk.py), and the TLS 1.3 suite every peer must support.
            cipher_suites=list(CIPHER_SUITES),
        )
        config.certificate = identity.certificate
        config.private_key = identity.private_key
        return config
