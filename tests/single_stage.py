"""Shared helpers for end-to-end tests: the single-stage greedy reference a pipeline must
equal (spec: an N-stage pipeline produces exactly the tokens of one stage), and the
process facts (open fds, children) a leak check compares between runs."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from swactor.model.gguf_range import open_reader
from swactor.model.llama_role import StageRole


def reference_tokens(path: Path, blocks: int, prompt: Sequence[int], count: int,
                     max_seq_len: int) -> list[int]:
    """Greedy tokens of one StageRole over every block of `path`, in this process."""
    whole = StageRole(open_reader(path).load_stage(0, blocks, is_first=True, is_last=True),
                      max_seq_len=max_seq_len)
    tokens: list[int] = []
    ids = list(prompt)
    for step in range(count):
        tokens.append(int(whole.step(step, np.array(ids, dtype=np.int32))[0]))
        ids = [tokens[-1]]
    return tokens


def process_facts(pid: int) -> tuple[int, list[int]]:
    """(open fds, child pids) of a process."""
    children: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as handle:
            children += [int(c) for c in handle.read().split()]
    return len(os.listdir(f"/proc/{pid}/fd")), sorted(children)
