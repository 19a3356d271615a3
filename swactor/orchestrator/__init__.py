"""The orchestrator: planner, run binding and token endpoints (spec §10-§13, §36, §38).

Theory of operation. The orchestrator owns planning, validation and control of one run:

- `inventory` reads the pool's resource inventory (node id, usable memory, device kind);
- `model_info` reads the GGUF facts the planner needs (blocks, hidden size, context,
  EOS/EOG ids, parameter counts per block);
- `split` cuts the block range into contiguous stage ranges (proportional to memory, or
  an explicit split);
- `planner` builds and validates one `RunPlan` (failures are `PlannerError`, never FSM
  states) and `plan_cmd` prints it (`swactor plan`);
- `run` binds the generated `orchestrator_run` machine: it carries out the machine's
  effects through an injected `ports.RunPorts` object (provisioning, StopRun, token
  objects, local token endpoints, events) and answers its guards from its own
  bookkeeping; `ports.RunResult` is what a run did;
- `tokens` encodes and decodes token objects (u32 ids) against an edge's ObjectSpec.

Submodules are imported by name; this package imports nothing heavy, so that
`swactor --help` stays fast.
"""
