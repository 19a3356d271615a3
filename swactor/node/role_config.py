"""The ConfigureRole config of a stage's `llama_stage` worker role, built from its ProvisionStage.

Theory of operation. The orchestrator's ProvisionStage says which layers a stage runs,
whether it is first or last (stage index against stage count), the compute dtype
(family and width), `max_seq_len`, the KV slots (`slots`: sequences a serving run
carries at once), what to build while loading (prefill kernels up to
`warm_prompt_tokens`, batched decode kernels of sizes 2..`warm_batch_rows`, which the
config lists as `batch_rows`, mixed-step graphs of 1..`warm_mixed_rows` decode rows,
listed as `mixed_rows`) and, for the last stage only, the sampling policy.
The worker role (`swactor.worker.llama_stage`) needs the same facts plus where to read
the GGUF on this node (a local path, or the URL with the node's range cache), which
the node's weight loader resolves from the provision's `GgufSource`.
`llama_stage_config` joins the two into the JSON config of ConfigureRole; the plan's
hidden size and the source's sha256 travel along so the worker checks them, and the
node's weight mode (`swactor node --weights`: "blocks", the default, keeps
Q2_K-Q6_K, Q4_0-Q8_0 and F16/BF16 matrices in the file's blocks, the faster mode on a CPU;
"dense" dequantises every matrix once at load) goes as `weights`.
"""

from __future__ import annotations

from pathlib import Path

from swactor.wire import DTypeFamily, JsonObject, ProvisionStage

ROLE_KIND = "llama_stage"
WEIGHT_MODES = ("dense", "blocks")
"""How the worker holds the stage's quantised matrices (`swactor node --weights`)."""
DEFAULT_WEIGHT_MODE = "blocks"
"""Decode from the file's blocks: about half the bytes per token of dense weights, and
measured faster (`bench model`, `bench coldstart`); greedy tokens equal dense f32's on
the tests' prompts."""
_DTYPES = {(DTypeFamily.Float, 4): "f32", (DTypeFamily.Float, 2): "f16"}


class RoleConfigProblem(ValueError):
    """The provision asks for something the llama_stage role cannot run."""


def llama_stage_config(
    provision: ProvisionStage, location: str | Path, cache_dir: str | Path | None = None,
    weights: str = DEFAULT_WEIGHT_MODE,
    *,
    table: JsonObject | None = None,
    content_addressed: bool = False,
) -> JsonObject:
    """The `llama_stage` ConfigureRole config for `provision`, reading the GGUF at `location`.

    `location` is a local path (made absolute) or an http(s) URL; `weights` is the node's
    weight mode (`WEIGHT_MODES`); `table` is the node's `GgufRangeReader.stage_table` for
    the stage, which spares the worker a second header read; `content_addressed`: a
    local file that holds only verified chunks of the plan's `sha256` (the node's cache
    of pool-fetched weights), so the worker may re-arm a role by the digest alone.
    """
    if weights not in WEIGHT_MODES:
        raise RoleConfigProblem(f"weights {weights!r} (supported: {', '.join(WEIGHT_MODES)})")
    model = provision.model
    dtype = _DTYPES.get((model.dtype_family, model.dtype_width_bytes))
    if dtype is None:
        raise RoleConfigProblem(
            f"compute dtype {model.dtype_family.value}{model.dtype_width_bytes * 8} "
            "(llama_stage runs Float32 or Float16)"
        )
    sampling = provision.runtime.sampling
    text = str(location)
    if not text.startswith(("http://", "https://")):
        text = str(Path(text).absolute())
    return {
        "kind": ROLE_KIND,
        "gguf": text,
        "layer_start": provision.layer_start,
        "layer_end": provision.layer_end_exclusive,
        "first": provision.stage_index == 0,
        "last": provision.stage_index == provision.stage_count - 1,
        "dtype": dtype,
        "max_seq_len": model.max_seq_len,
        "slots": model.slots,
        "warm_prompt_tokens": model.warm_prompt_tokens,
        "batch_rows": list(range(2, model.warm_batch_rows + 1)),
        "mixed_rows": list(range(1, model.warm_mixed_rows + 1)),
        "hidden_dim": model.hidden_dim,
        "sampling": None if sampling is None else sampling.to_json(),
        "sha256": provision.gguf_source.sha256,
        "cache_dir": None if cache_dir is None else str(cache_dir),
        "weights": weights,
        **({} if table is None else {"table": table}),
        **({"content_addressed": True} if content_addressed else {}),
    }
