"""One stage in a fresh process: load time, resident memory at ready, prefill and decode.

``python -m bench._stage_probe JSON`` (the arguments as one JSON object, see
:func:`probe`) prints one JSON line. The process first starts tinygrad's device and runs a
tiny kernel, so the baseline RSS holds Python, numpy and tinygrad; then it loads the
stage exactly as a worker does (``open_reader(...).load_stage`` then ``StageRole``) and
reads its RSS at ready: ``rss_ready - rss_base`` is what the stage costs the process.
With ``decode`` steps it then prefills ``prompt`` positions (none when ``prompt`` is 0: the
decode steps start at position 0, as a stage warming up does) and decodes, feeding its
own output back (a first stage gets token ids, later stages random activations). The
first decode steps build the decode kernels (or load them from the kernel cache,
``swactor.model.jit_cache``): ``decode_first_s`` is their time, ``decode_ms`` the median
step after them.
"""

from __future__ import annotations

import gc
import json
import resource
import statistics
import sys
import time
from typing import Any

import numpy as np


def probe(args: dict[str, Any]) -> dict[str, Any]:
    from tinygrad.device import Device
    from tinygrad.tensor import Tensor

    from swactor import heap
    from swactor.model.gguf_range import open_reader
    from swactor.model.llama_role import StageRole, process_rss_bytes
    from swactor.orchestrator.model_info import model_info_from_gguf

    device = args.get("device") or Device.DEFAULT
    assert (Tensor([1.0, 2.0, 3.0], device=device) * 2).sum().item() == 12.0
    gc.collect()
    base = process_rss_bytes()
    start, end, blocks = args["start"], args["end"], args["weights"] == "blocks"
    t0 = time.perf_counter()
    reader = open_reader(args["path"])
    last = end == reader.facts.block_count
    loaded = reader.load_stage(start, end, is_first=start == 0, is_last=last,
                               dtype=args["dtype"], keep_blocks=blocks)
    role = StageRole(loaded, max_seq_len=args["max_seq_len"], device=device, quantised=blocks)
    load_s = time.perf_counter() - t0
    del loaded, reader
    gc.collect()
    heap.trim()
    ready = process_rss_bytes()
    width = 4 if args["dtype"] == "f32" else 2
    predicted = model_info_from_gguf(args["path"], with_stop_ids=False).stage_memory(
        start, end, width, args["max_seq_len"], args["weights"])
    out: dict[str, Any] = {
        "start": start, "end": end, "load_s": load_s, "rss_base": base, "rss_ready": ready,
        "weight_bytes": role.weight_bytes, "kv_bytes": role.kv_cache_bytes,
        "file_bytes": role.file_bytes, "predicted_weights": predicted.weights,
        "predicted_kv": predicted.kv_cache,
    }
    steps = int(args.get("decode", 0))
    if steps:
        rng = np.random.default_rng(0)
        hidden = role.facts.hidden_dim

        def payload(tokens: int) -> Any:
            if role.is_first:
                return rng.integers(3, role.facts.vocab_size, size=tokens).astype(np.int32)
            return (rng.standard_normal((tokens, hidden)) * 0.5).astype(role.np_dtype)

        prompt = int(args.get("prompt", 0))
        times = []
        if prompt:
            t0 = time.perf_counter()
            role.step(0, payload(prompt))
            out["prefill_cold_s"] = time.perf_counter() - t0
            for sequence in range(1, steps + 1):
                data = payload(1)
                t0 = time.perf_counter()
                role.step(sequence, data)
                times.append(time.perf_counter() - t0)
        else:
            # decode rows from position 0 with no prompt, as StageRole.warm_up does
            for position in range(steps):
                data = payload(1)
                if role.is_first:
                    data = role._embed(data)
                t0 = time.perf_counter()
                role._decode_step(data, 0, position)
                times.append(time.perf_counter() - t0)
        out["decode_first_s"] = sum(times[:3])
        out["decode_ms"] = statistics.median(times[3:] if len(times) > 4 else times) * 1e3
        out["rss_after_decode"] = process_rss_bytes()
    out["rss_peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


if __name__ == "__main__":
    print(json.dumps(probe(json.loads(sys.argv[1]))), flush=True)
