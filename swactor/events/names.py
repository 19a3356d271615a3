"""The names of the 24 lifecycle events of spec §40, and of the extensions beyond it.

Kept apart from `schema` (which needs `swactor.wire`) so that the command line can list
them without importing the whole event machinery.
"""

from __future__ import annotations

import enum


class EventName(enum.Enum):
    """The 24 required lifecycle events of spec §40, in lifecycle order, then the
    extensions beyond §40 (each block says what it is for)."""

    node_started = "node_started"
    node_available = "node_available"
    node_faulted = "node_faulted"
    pool_ready = "pool_ready"
    run_planned = "run_planned"
    stage_provision_started = "stage_provision_started"
    weights_download_started = "weights_download_started"
    weights_downloaded = "weights_downloaded"
    weights_loaded = "weights_loaded"
    edge_provision_started = "edge_provision_started"
    edge_ready = "edge_ready"
    stage_ready = "stage_ready"
    readiness_barrier_passed = "readiness_barrier_passed"
    prompt_injected = "prompt_injected"
    object_loaded = "object_loaded"
    execute_step_started = "execute_step_started"
    object_produced = "object_produced"
    step_completed = "step_completed"
    token_received = "token_received"
    run_completed = "run_completed"
    run_faulted = "run_faulted"
    stop_run_sent = "stop_run_sent"
    stage_stopped = "stage_stopped"
    run_torn_down = "run_torn_down"
    # Extensions beyond spec §40: the serving session (fsm/serve_session.yaml), one
    # session over many fail-stop runs (`swactor serve`).
    serve_started = "serve_started"
    serve_recovery_started = "serve_recovery_started"
    serve_recovery_completed = "serve_recovery_completed"
    serve_stopped = "serve_stopped"
    serve_failed = "serve_failed"
    # ... and the session's migration of a faulted run's sequences to the next run.
    sequence_migrated = "sequence_migrated"
    sequence_lost = "sequence_lost"
    # ... and its warm spares (`--spares`): a stage role preloaded on an idle node, or not.
    spare_preloaded = "spare_preloaded"
    spare_preload_failed = "spare_preload_failed"
    # Extensions beyond spec §40: the sequences of a serving run (fsm/sequence.yaml); the
    # spec's run carries one sequence, a serving run many (detail: sequence id, slot).
    sequence_started = "sequence_started"
    sequence_first_token = "sequence_first_token"
    sequence_finished = "sequence_finished"
    sequence_failed = "sequence_failed"
