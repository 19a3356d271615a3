"""Bytes each stage's load path reads from the GGUF, against its share of tensor bytes.

Theory of operation
-------------------
A stage's node checks the stage's range against the file's header
(`GgufRangeReader.validate_stage`) and hands the worker the stage table it made
(`stage_table`: facts and tensor entries); the worker opens the file and reads the
range's tensor bytes only (`open_reader(..., table=...).load_stage(...)`, the
`llama_stage` role's own call). Neither reports its byte count in an event, so this
module replays both calls for each stage's layer range, in this process, on sources
that count every byte they pread. The share is the stage's tensor bytes
(`StageWeights.tensor_bytes`); the goal is reading at most 1.05x of it. The header
(1.8 MB for SmolLM2, mostly the tokenizer) is read once per stage and cannot be
skipped: the tensor table comes after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

GOAL = 1.05


def weight_bytes(ranges: Sequence[tuple[int, int]]) -> list[dict[str, Any]]:
    """Per stage: header, tensor and total bytes read, the share, and their ratio."""
    from swactor.model.gguf_range import open_reader
    from swactor.model.paths import default_model_path

    path = default_model_path()
    size = path.stat().st_size
    rows = []
    for index, (start, end) in enumerate(ranges):
        first, last = index == 0, index == len(ranges) - 1
        node = open_reader(path)
        table = node.stage_table(node.validate_stage(start, end, is_first=first,
                                                     is_last=last))
        reader = open_reader(path, table=table)
        weights = reader.load_stage(start, end, is_first=first, is_last=last)
        worker = reader.source.bytes_read
        share = weights.tensor_bytes
        node_header = node.source.bytes_read  # the node's header check
        rows.append({
            "stage": index, "layers": [start, end], "share_bytes": share,
            "header_bytes": node.header_bytes, "worker_bytes": worker,
            "node_and_worker_bytes": worker + node_header,
            "worker_ratio": worker / share,
            "node_and_worker_ratio": (worker + node_header) / share,
            "file_fraction": worker / size,
        })
    return rows
