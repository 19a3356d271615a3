"""Membership (spec §8-§9): SWIM with Lifeguard, signed updates, PoolReady, node boot.

Theory of operation
-------------------
* `core.SwimCore` is one SWIM participant, sans-I/O: messages and time in, messages and
  membership events out; each remote member's state is the generated `swim_member`
  machine. `config` holds memberlist's parameters and timing formulas.
* `sim.Simulation` runs many cores on a seeded simulated network (tests, benchmark).
* `wire` signs and verifies datagrams and updates with the node's Ed25519 identity
  key; `udp.MembershipNode` runs a core on its own UDP port in its own thread.
* `pool.PoolReadiness` binds the generated `pool_readiness` machine (orchestrator side);
  `boot.NodeBoot` binds `node_boot` (node side).
"""
