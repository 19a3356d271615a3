"""The GPU worker process (`python -m swactor.worker`, spec §28-§34).

- `process.WorkerProcess`: binding of the generated worker_process machine; the loop.
- `adapter`: stdin command lines -> machine events; events -> stdout lines.
- `ingress.IngressRing` / `egress.EgressRing`: bindings of the ingress_ring and
  egress_ring machines (header checks, prefix copies, backpressure).
- `bridge.DeviceBridge`: tinygrad allocations, range copies, handles, tensor views.
- `steps.StepRunner`: standing step grants, role runs, output writing.
- `roles`: the role registry by kind name (`register_role_kind`), echo and scale roles.

Importing this package does not import tinygrad; the submodules that need it do.
"""
