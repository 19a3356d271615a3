"""Test rigs for swactor: test-only code that tests and benchmarks share.

The product never imports this package (`tests/test_product_imports.py` proves it by
walking every other `swactor` module's imports), so Hypothesis and pytest stay dev
dependencies and nothing here can change what a node, worker or orchestrator does.
It lives inside the `swactor` package rather than `tests/` because benchmarks and
child processes (`python -m swactor.testing.ring_peer`) import it too.

- `examples`, `strategies`: a deterministic example and a Hypothesis strategy of valid
  values for every exported wire type (generated conformance tests fill events with them).
- `worker_rig`: a real worker subprocess with memfd rings, driven from the test.
- `memory_net`: an in-process stand-in for the QUIC transport (`swactor.transport.factory`).
- `ring_rig`, `ring_stream`, `ring_peer`, `ring_liveness`: ring layouts, blocking
  producer/consumer steps (spec §21 pending-bit protocol), a peer process, a peer watcher.
- `swim_sim`: a seeded, single-process simulation of a SWIM pool (spec §9).
- `swim_pool`: loopback nodes joined to SWIM through this process's orchestrator.
- `host_process`, `serve_process`: a `swactor` subprocess inside a test host's network
  namespace, and a serving process (`swactor serve`, `orchestrator --serve`).
- `netns_pool`: a SWIM-joined pool of nodes on network-namespace test hosts, and a
  serving pipeline over it with a stream client inside its namespace (the multi-host
  tests and `bench recovery`).
"""
