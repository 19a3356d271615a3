"""Bytes each stage's load path reads from the GGUF, against its share of tensor bytes.

Theory of operation
-------------------
A stage's node checks the stage's range against the file's header
(`GgufRangeReader.validate_stage`), then its worker opens the file again and reads the
range (`open_reader(...).load_stage(...)`, the `llama_stage` role's own call). Neither
reports its byte count in an event, so this module replays the worker's call for each
stage's layer range, in this process, on a `LocalFileSource` that counts every byte it
preads, and adds the node's header read. The share is the stage's tensor bytes
(`StageWeights.tensor_bytes`); the goal is reading at most 1.05x of it.
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
        reader = open_reader(path)
        weights = reader.load_stage(start, end, is_first=index == 0,
                                    is_last=index == len(ranges) - 1)
        worker = reader.source.bytes_read
        share = weights.tensor_bytes
        node_header = reader.header_bytes  # the node's validate_stage reads the header again
        rows.append({
            "stage": index, "layers": [start, end], "share_bytes": share,
            "header_bytes": reader.header_bytes, "worker_bytes": worker,
            "node_and_worker_bytes": worker + node_header,
            "worker_ratio": worker / share,
            "node_and_worker_ratio": (worker + node_header) / share,
            "file_fraction": worker / size,
        })
    return rows
