"""The ConfigureRole config of a stage's `llama_stage` worker role, built from its ProvisionStage.

Theory of operation. The orchestrator's ProvisionStage says which layers a stage runs,
whether it is first or last (stage index against stage count), the compute dtype
(family and width), `max_seq_len` and, for the last stage only, the sampling policy.
The worker role (`swactor.worker.llama_stage`) needs the same facts plus the *local*
path of the GGUF file, which the node's weight loader knows once the artifact is on
this node. `llama_stage_config` joins the two into the JSON config of ConfigureRole;
the plan's hidden size travels along so the worker checks it against the file.
"""

from __future__ import annotations

from pathlib import Path

from swactor.wire import DTypeFamily, JsonObject, ProvisionStage

ROLE_KIND = "llama_stage"
_DTYPES = {(DTypeFamily.Float, 4): "f32", (DTypeFamily.Float, 2): "f16"}


class RoleConfigProblem(ValueError):
    """The provision asks for something the llama_stage role cannot run."""


def llama_stage_config(provision: ProvisionStage, gguf_path: str | Path) -> JsonObject:
    """The `llama_stage` ConfigureRole config for `provision`, reading `gguf_path`."""
    model = provision.model
    dtype = _DTYPES.get((model.dtype_family, model.dtype_width_bytes))
    if dtype is None:
        raise RoleConfigProblem(
            f"compute dtype {model.dtype_family.value}{model.dtype_width_bytes * 8} "
            "(llama_stage runs Float32 or Float16)"
        )
    sampling = provision.runtime.sampling
    return {
        "kind": ROLE_KIND,
        "gguf": str(Path(gguf_path).absolute()),
        "layer_start": provision.layer_start,
        "layer_end": provision.layer_end_exclusive,
        "first": provision.stage_index == 0,
        "last": provision.stage_index == provision.stage_count - 1,
        "dtype": dtype,
        "max_seq_len": model.max_seq_len,
        "hidden_dim": model.hidden_dim,
        "sampling": None if sampling is None else sampling.to_json(),
    }
