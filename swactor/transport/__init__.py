"""QUIC transport on aioquic: node identity, the endpoint, the driver, pumps, control channel.

Modules: `identity` (Ed25519 key, node id, certificate), `config` (validated settings),
`flow` (consumer-credited flow control subclass of aioquic's connection), `endpoint` (one
UDP socket, connections, mutual identity checks, connection cache, keep-alives),
`driver` (spec §24-§25 edge driver and receive demux), `pumps` (byte-blind recv/send
pumps between QUIC streams and rings), `control` (the `swactor/ctl/1` channel).
"""
