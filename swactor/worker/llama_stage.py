"""The `llama_stage` worker role: a model `StageRole` behind the worker's role interface.

Theory of operation
-------------------
`ConfigureRole { config }` with `config["kind"] == "llama_stage"` builds one
`swactor.model.llama_role.StageRole` for a layer range of a local GGUF file:

    {"kind": "llama_stage", "gguf": "/path/model.gguf", "layer_start": 0,
     "layer_end": 10, "first": true, "last": false, "dtype": "f32",
     "max_seq_len": 512, "sampling": {"mode": "Greedy"},       # wire SamplingPolicy JSON
     "num_layers": 30, "hidden_dim": 576,                      # optional plan checks
     "sha256": null, "cache_dir": null,                        # optional source options
     "weights": "blocks",                                      # optional, or "dense"
     "slots": 4,                                               # optional, default 1
     "warm_prompt_tokens": 64,                                 # optional, default 0
     "batch_rows": [2, 4],                                     # optional, default []
     "mixed_rows": [1, 2, 3],                                  # optional, default []
     "table": {...}}                                           # optional stage table

`slots` is how many sequences the stage holds KV caches for (1..MAX_STAGE_SLOTS): a
serving run's tagged objects (`swactor.wire.tags`, extension beyond spec §17) name
their slot and position in the object header's `flags`, which the step runner hands
the role on the output binding (the output carries the input's flags on). A tagged
step runs `StageRole.run_tagged`; the last stage answers one greedy id, or with
CANDIDATES the `CANDIDATES_K` ids then their f32 logits' bit patterns, as u32s. An
untagged object (flags 0) is the inference step `sequence` of the run's one sequence,
as below; it uses slot 0. A batch object (flags BATCH, `swactor.wire.tags`) starts with
its tag table, zero-padded to whole rows of its edge (`table_bytes`: none on a token
edge, one activation row for a small model's batch): the role checks the table against
its slots and the padding is zero, runs `StageRole.run_batch` on the rows after it, and
writes the table padded to whole rows of its output edge and then the result rows
(activation rows, or on the last stage each row's id or candidates). A prompt batch
(flags BATCH and PROMPTS: one table entry per prompt, its row count in the position
field) is read the same way and runs `StageRole.run_prompts`: each prompt prefilled as
alone (bit for bit), in its own slot; the last stage answers each prompt's next
token (id or candidates) in table order. A mixed step (flags BATCH and MIXED: the
prompt's entry, its row count in the position field, then one per decode row) runs
`StageRole.run_mixed`: the prompt and the rows as one step where they fit, each result
the bits it would have sent apart; the answers follow table order. `batch_rows` are
the batch sizes whose B-row decode kernels the role builds at configure time
(`StageRole.warm_up`; minutes each on a small CPU unless the kernel cache holds them,
and every size it holds is loaded anyway): a batch of such a size reads each weight
once for all its rows, any other runs row after row; results are the same bits either
way. The node lists sizes 2..the plan's `warm_batch_rows` (`swactor.node.role_config`).
`mixed_rows` are the decode row counts whose mixed-step graphs the role builds at
configure time for every short prefill bucket it warmed (`StageRole.warm_up`'s `mixed`:
24 graphs for SmolLM2's buckets up to 64 tokens and 1-3 rows, about 140 s on 2 CPUs the
first time, 15 s from the kernel cache); the node lists 1..the plan's `warm_mixed_rows`,
which a serving run with mixed steps on asks for. A mixed step whose graph is not built
builds it at its first use (about 5 s on SmolLM2 on 2 CPUs), kept in the kernel cache.

`weights` "blocks" keeps the file's Q2_K-Q6_K, Q4_0-Q8_0, F16/BF16 matrices in their
blocks and computes decode and prefill from them, with no dense copy (about the file's
bytes; not the f32 plan's exact arithmetic, though greedy tokens agree on the tests'
prompts). The node sends its `--weights` mode (default blocks); a config without the
key gets dense.

`gguf` is a local path or an http(s) URL (read by byte ranges, through the
content-addressed cache in `cache_dir` when given). `table` is the node's
`GgufRangeReader.stage_table` for the stage (model facts and the stage's tensor
entries, from the header the node read): with it the role reads only the stage's
tensor bytes, checked against the table (layer range, plan facts, bounds, file size).
The factory reads the range once (`GgufRangeReader.load_stage`, which
validates it against the file and the optional plan facts), places weights and KV
cache on the worker's tinygrad device and warms the role up (`StageRole.warm_up`: its
decode and cached prefill kernels, and the prefill kernels of every prompt length up to
`warm_prompt_tokens`, built or loaded from the kernel cache), so the
configuration's time includes the kernel build and the first steps replay. A config it
cannot use, or weights that fail (`WeightsError`: missing file, bad range, plan
mismatch), raise `RoleConfigError`, which the worker answers RoleFailed ConfigInvalid;
the message names the problem.

A step has exactly one input and one output binding; the output's `sequence` is the
inference step (the StageController gives input and output the same one). The role
converts between ring object bytes and the model role's arrays (spec §17 layouts):

- token objects (stage 0 input, last-stage output): u32 little-endian ids; the model
  role takes and gives int32 ids;
- activation objects: rows of `hidden` elements of the plan dtype (f32 or f16,
  little endian), C order; `extent = tokens * hidden * width`.

Bytes the role cannot read as such an object (a length that is not a whole number of
rows, an id >= 2**31), flags that are not a sequence tag, and model step errors
(out-of-order step, context overflow, a slot the stage does not have, a decode position
that is not the slot's next), raise `RoleRunError`, which the step runner answers
StepFailed OutputExtentInvalid.

The input crosses to the host once (`bridge.host_array`: on CPU a view of the object's
memory) because the model role's API takes arrays; its output is handed back as a host
array of bytes, which the worker copies into a device allocation of its own.

A node serves run after run with the same stage, so a ConfigureRole for a role id whose
role already serves the same stage of the same file re-arms that role (`reconfigure`,
called by the worker before it builds anew): every key but `sampling` equal, and the
file unchanged (a local path with the same device, inode, size and mtime; a URL, or a
local file the config marks `content_addressed`, only when the config pins its
`sha256`). A content-addressed file is the node's cache of the digest's chunks fetched
from the pool (`swactor.node.pool_weights`): every chunk is verified before it is
written and chunks only ever join it, so the bytes of any range a role read never
change, while its mtime does each time another range is fetched (a warm spare that
preloads several stages writes the file once per stage). The sampling policy is set anew, and step 0
restarts the KV positions, so a re-armed role is indistinguishable from a fresh one.
Building anew each run cost a full weight load and left tinygrad's schedule and
memory-planner caches growing per run (~75 KiB of worker RSS per run in `just soak`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from tinygrad.tensor import Tensor

from swactor.wire import JsonValue, OutputBinding, SamplingMode, StageFootprint, WireError
from swactor.wire import SamplingPolicy as WireSamplingPolicy
from swactor.wire.plan import MAX_STAGE_SLOTS
from swactor.wire.tags import (
    MAX_SLOTS,
    TAG_WIDTH,
    SequenceTag,
    TagError,
    mixed_count,
    prompt_count,
    read_table,
    table_bytes,
    table_entries,
)
from swactor.worker.bridge import host_array
from swactor.worker.roles import Role, RoleConfigError, RoleRunError, register_role_kind

KIND = "llama_stage"
ACTIVATION_DTYPES: dict[str, np.dtype[np.generic]] = {"f32": np.dtype("<f4"),
                                                      "f16": np.dtype("<f2")}
TOKEN_DTYPE: np.dtype[np.generic] = np.dtype("<u4")


def _field(config: Mapping[str, JsonValue], name: str, kind: type, required: bool = True
           ) -> Any:
    value = config.get(name)
    if value is None and not required:
        return None
    if isinstance(value, bool) is not (kind is bool) or not isinstance(value, kind):
        raise RoleConfigError(f"llama_stage needs {name!r} as {kind.__name__}")
    return value


def _sampling(config: Mapping[str, JsonValue]) -> Any:
    from swactor.model.sampling import SamplingPolicy

    raw = config.get("sampling")
    if raw is None:
        return SamplingPolicy.greedy()
    try:
        policy = WireSamplingPolicy.from_json(raw)
    except WireError as error:
        raise RoleConfigError(f"llama_stage sampling: {error}") from None
    if policy.mode is SamplingMode.Greedy:
        return SamplingPolicy.greedy()
    assert policy.temperature is not None and policy.top_p is not None
    return SamplingPolicy.sample(
        temperature=policy.temperature, top_k=policy.top_k or 0, top_p=policy.top_p,
        seed=policy.seed or 0,
    )


def _reuse_key(config: Mapping[str, JsonValue], device: str) -> tuple[str, str, str] | None:
    """What must be equal for a configured role to serve `config` again (module doc);
    None: never."""
    path = config.get("gguf")
    if not isinstance(path, str):
        return None
    if "://" in path or config.get("content_addressed") is True:
        digest = config.get("sha256")
        if not isinstance(digest, str):
            return None
        file_key = f"sha256:{digest}"
    else:
        try:
            info = os.stat(path)
        except OSError:
            return None
        file_key = f"{info.st_dev}:{info.st_ino}:{info.st_size}:{info.st_mtime_ns}"
    rest = {name: value for name, value in config.items() if name != "sampling"}
    return json.dumps(rest, sort_keys=True), file_key, device


class LlamaStageRole:
    """One stage's layer range (see the module docstring for config and object layouts)."""

    def __init__(self, stage: Any, reuse_key: tuple[str, str, str] | None = None) -> None:
        self.stage = stage  # swactor.model.llama_role.StageRole
        self.reuse_key = reuse_key
        self.hidden: int = stage.facts.hidden_dim
        self.activation: np.dtype[np.generic] = ACTIVATION_DTYPES[stage.dtype]

    @classmethod
    def from_config(cls, config: Mapping[str, JsonValue], device: str) -> LlamaStageRole:
        from swactor.model.errors import WeightsError
        from swactor.model.gguf_range import open_reader
        from swactor.model.llama_role import StageRole

        path = _field(config, "gguf", str)
        start = _field(config, "layer_start", int)
        end = _field(config, "layer_end", int)
        first = _field(config, "first", bool)
        last = _field(config, "last", bool)
        dtype = _field(config, "dtype", str)
        max_seq_len = _field(config, "max_seq_len", int)
        if dtype not in ACTIVATION_DTYPES:
            raise RoleConfigError(f"llama_stage dtype {dtype!r} (supported: f32, f16)")
        weights_mode = _field(config, "weights", str, required=False) or "dense"
        if weights_mode not in ("dense", "blocks"):
            raise RoleConfigError(
                f"llama_stage weights {weights_mode!r} (supported: dense, blocks)"
            )
        sampling = _sampling(config)
        slots = _field(config, "slots", int, required=False)
        slots = 1 if slots is None else slots
        if not 1 <= slots <= min(MAX_STAGE_SLOTS, MAX_SLOTS):
            raise RoleConfigError(f"llama_stage slots {slots} is outside "
                                  f"1..{min(MAX_STAGE_SLOTS, MAX_SLOTS)}")
        warm = _field(config, "warm_prompt_tokens", int, required=False) or 0
        if not 0 <= warm <= max_seq_len:
            raise RoleConfigError(f"llama_stage warm_prompt_tokens {warm} is outside "
                                  f"0..max_seq_len {max_seq_len}")
        batch_rows = _field(config, "batch_rows", list, required=False) or []
        if len(batch_rows) > slots or any(
                isinstance(rows, bool) or not isinstance(rows, int) or not 2 <= rows <= slots
                for rows in batch_rows):
            raise RoleConfigError(f"llama_stage batch_rows {batch_rows!r}: rows per step, "
                                  f"each in 2..{slots} (the slots)")
        mixed_rows = _field(config, "mixed_rows", list, required=False) or []
        if len(mixed_rows) >= slots or any(
                isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows < slots
                for rows in mixed_rows):
            raise RoleConfigError(f"llama_stage mixed_rows {mixed_rows!r}: decode rows "
                                  f"beside a prompt, each in 1..{slots - 1} (the other slots)")
        table = _field(config, "table", dict, required=False)
        try:
            reader = open_reader(
                path, digest=_field(config, "sha256", str, required=False),
                cache_dir=_field(config, "cache_dir", str, required=False), table=table,
            )
            weights = reader.load_stage(
                start, end, is_first=first, is_last=last, dtype=dtype, max_seq_len=max_seq_len,
                num_layers=_field(config, "num_layers", int, required=False),
                hidden_dim=_field(config, "hidden_dim", int, required=False),
                keep_blocks=weights_mode == "blocks",
            )
            stage = StageRole(weights, max_seq_len=max_seq_len, sampling=sampling,
                              device=device, quantised=weights_mode == "blocks",
                              slots=slots)
            del weights  # the host copies: the role holds its own on the device
            stage.warm_up(prompt_tokens=warm, rows=[int(rows) for rows in batch_rows],
                          mixed=[int(rows) for rows in mixed_rows])
        except WeightsError as error:
            raise RoleConfigError(f"llama_stage weights: {error}") from None
        return cls(stage, _reuse_key(config, device))

    def footprint(self) -> StageFootprint:
        """What the stage holds, measured once its weights were placed (StageRole)."""
        stage = self.stage
        return StageFootprint(int(stage.weight_bytes), int(stage.kv_cache_bytes),
                              int(stage.rss_at_ready), int(stage.file_bytes))

    def reconfigure(self, config: Mapping[str, JsonValue], device: str) -> bool:
        """Serve `config` as it is (True) when it names this role's stage of the unchanged
        file; only the sampling policy is set anew (module doc)."""
        key = _reuse_key(config, device)
        if key is None or key != self.reuse_key:
            return False
        self.stage.sampling = _sampling(config)
        return True

    def run(
        self, inputs: Mapping[int, Tensor], outputs: Sequence[OutputBinding]
    ) -> dict[int, Tensor | npt.NDArray[Any]]:
        from swactor.model.llama_role import StepError

        if len(inputs) != 1 or len(outputs) != 1:
            raise RoleRunError("llama_stage takes one input and one output per step")
        (source,) = inputs.values()
        (binding,) = outputs
        try:
            if table_entries(binding.flags) is not None:
                return {int(binding.port_id): self.run_batch(binding, host_array(source))}
            tag = SequenceTag.unpack(binding.flags)
        except TagError as error:
            raise RoleRunError(f"llama_stage step {int(binding.sequence)}: {error}") from None
        array = self.decode_input(host_array(source))
        try:
            if tag is None:
                result = self.stage.step(int(binding.sequence), array)
            else:
                result = self.stage.run_tagged(tag, array)
        except StepError as error:
            raise RoleRunError(f"llama_stage step {int(binding.sequence)}: {error}") from None
        return {int(binding.port_id): self.encode_output(result)}

    def run_batch(self, binding: OutputBinding, source: npt.NDArray[np.uint8]
                  ) -> npt.NDArray[np.uint8]:
        """A batch, prompt batch or mixed step object's output bytes: its tag table
        (checked against this stage's slots), then `StageRole.run_batch`'s,
        `StageRole.run_prompts`'s or `StageRole.run_mixed`'s rows (module doc)."""
        from swactor.model.llama_role import StepError

        raw = np.ascontiguousarray(source, dtype=np.uint8).reshape(-1)
        rows = table_entries(binding.flags) or 0
        width = table_bytes(rows, self.row_bytes(output=False))
        if raw.size < width:
            raise TagError("table", f"a batch of {rows} rows in {raw.size} bytes")
        table = raw[:rows * TAG_WIDTH]
        if raw[table.size:width].any():
            raise TagError("table", "the padding after the tag table is not zero")
        words = [int(word) for word in table.view(TOKEN_DTYPE)]
        tags = read_table(binding.flags, words, self.stage.slots)
        array = self.decode_input(raw[width:])
        try:
            if prompt_count(binding.flags) is not None:
                result = self.stage.run_prompts(tags, array)
            elif mixed_count(binding.flags) is not None:
                result = self.stage.run_mixed(tags[0], tags[1:], array)
            else:
                result = self.stage.run_batch(tags, array)
        except StepError as error:
            raise RoleRunError(f"llama_stage batch step {int(binding.sequence)}: "
                               f"{error}") from None
        head = np.zeros(table_bytes(rows, self.row_bytes(output=True)), dtype=np.uint8)
        head[:table.size] = table
        return np.concatenate([head, self.encode_output(result)])

    def row_bytes(self, output: bool) -> int:
        """Bytes of one row of this stage's input or output objects: a u32 id on the
        token edges (first stage's input, last stage's output), else one activation row
        (the edge's ObjectSpec alignment, spec §17)."""
        if (self.stage.is_last if output else self.stage.is_first):
            return TOKEN_DTYPE.itemsize
        return self.hidden * self.activation.itemsize

    def decode_input(self, raw: npt.NDArray[np.uint8]) -> npt.NDArray[Any]:
        """The model role's input array for one input object's bytes."""
        raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
        if self.stage.is_first:
            if raw.size % TOKEN_DTYPE.itemsize:
                raise RoleRunError(f"token object of {raw.size} bytes is not whole u32 ids")
            ids = raw.view(TOKEN_DTYPE)
            if ids.size and int(ids.max()) >= 2**31:
                raise RoleRunError("token id does not fit int32")
            return ids.astype(np.int32)
        row = self.hidden * self.activation.itemsize
        if raw.size % row:
            raise RoleRunError(f"activation object of {raw.size} bytes is not whole rows "
                               f"of {row} bytes")
        values: npt.NDArray[Any] = raw.view(self.activation).reshape(-1, self.hidden)
        return values.astype(self.stage.np_dtype)  # the model role's native-order dtype

    def encode_output(self, result: npt.NDArray[np.generic]) -> npt.NDArray[np.uint8]:
        """The output object's bytes for the model role's output array."""
        if self.stage.is_last:  # int32 ids (and a candidates object's logit bits) as u32
            out: npt.NDArray[np.generic] = np.ascontiguousarray(result, np.int32).view(TOKEN_DTYPE)
        else:
            out = np.ascontiguousarray(result).astype(self.activation)
        data: npt.NDArray[np.uint8] = out.view(np.uint8).reshape(-1)
        return data


def _pin_default_device(device: str) -> None:
    """Make the worker's device tinygrad's default unless DEV names one: finding a default
    otherwise opens every backend in turn (about a second of the stage's load)."""
    from tinygrad.helpers import DEV

    if not DEV.device:
        DEV.value = device


def _build(config: Mapping[str, JsonValue], device: str) -> Role:
    _pin_default_device(device)
    return LlamaStageRole.from_config(config, device)


register_role_kind(KIND, _build)
