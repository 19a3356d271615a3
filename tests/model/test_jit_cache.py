"""Kernel cache: a role that replays JITs another role wrote computes what a fresh role does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from swactor.model import jit_cache, llama_role
from swactor.model.gguf_range import open_reader
from swactor.model.llama_role import StageRole

PROMPT = [5, 17, 42, 99, 7, 250]
STEPS = 4
MAX_SEQ = 32


def _roles(path: Path, split: list[tuple[int, int]], quantised: bool = False) -> list[StageRole]:
    reader = open_reader(path)
    roles = []
    for index, (start, end) in enumerate(split):
        weights = reader.load_stage(start, end, is_first=index == 0,
                                    is_last=index == len(split) - 1, keep_blocks=quantised)
        roles.append(StageRole(weights, max_seq_len=MAX_SEQ, quantised=quantised))
    return roles


def _run(roles: list[StageRole], prompt: list[int] = PROMPT
         ) -> tuple[list[int], list[npt.NDArray[Any]]]:
    """Greedy tokens and every stage's outputs for a prefill and STEPS decode steps."""
    tokens: list[int] = []
    outputs: list[npt.NDArray[Any]] = []
    payload: npt.NDArray[Any] = np.array(prompt, dtype=np.int32)
    for sequence in range(STEPS + 1):
        obj = payload
        for role in roles:
            obj = role.step(sequence, obj)
            outputs.append(obj.copy())
        tokens.append(int(obj[0]))
        payload = obj
    return tokens, outputs


def test_off_writes_nothing(tiny_llama: Path, tmp_path: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(jit_cache.CACHE_ENV, "off")
    (role,) = _roles(tiny_llama, [(0, 4)])
    _run([role])
    assert jit_cache.cache_dir() is None
    assert role._kernels is None


@pytest.mark.parametrize("quantised", [False, True])
def test_replayed_graphs_compute_what_built_ones_do(
        tiny_llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        quantised: bool) -> None:
    split = [(0, 1), (1, 4)]
    monkeypatch.setenv(jit_cache.CACHE_ENV, "off")
    reference = _run(_roles(tiny_llama, split, quantised))

    monkeypatch.setenv(jit_cache.CACHE_ENV, str(tmp_path / "kernels"))
    writers = _roles(tiny_llama, split, quantised)
    assert _run(writers)[0] == reference[0]
    for role in writers:
        assert role._kernels is not None
        assert role._kernels.saved == {"decode", "prefill-8"}
        assert role._kernels.loaded == set()
    longer = _roles(tiny_llama, split, quantised)
    _run(longer, prompt=PROMPT * 3)  # an 18-token prompt: bucket 24
    for role in longer:
        assert role._kernels is not None and role._kernels.saved == {"prefill-24"}

    readers = _roles(tiny_llama, split, quantised)
    for role in readers:
        role.warm_up()
        assert role._kernels is not None
        assert role._kernels.loaded == {"decode", "prefill-8", "prefill-24"}
        assert role._decode.captured is not None and role._prefill[8].captured is not None
    tokens, outputs = _run(readers)
    assert tokens == reference[0]
    for got, want in zip(outputs, reference[1], strict=True):
        np.testing.assert_array_equal(got, want)
    for role in readers:
        assert role._kernels is not None and role._kernels.saved == set()

    # warm-up keeps cached buckets shortest first while they fit in PREFILL_KEEP_BYTES
    # (the first that does not is loaded, counted and dropped): less than the buckets of
    # 8 and 24 rows these roles hold (8 fits, 8 + 24 not)
    held = [role.bucket_bytes() for role in readers]
    assert all(sorted(sizes) == [8, 24] and min(sizes.values()) > 0 for sizes in held)
    monkeypatch.setattr(llama_role, "PREFILL_KEEP_BYTES",
                        min(sizes[8] + sizes[24] for sizes in held) - 1)
    for role in _roles(tiny_llama, split, quantised):
        role.warm_up()
        assert role._kernels is not None
        assert role._kernels.loaded == {"decode", "prefill-8", "prefill-24"}
        assert sorted(role._prefill) == [8] and list(role.bucket_bytes()) == [8]


def test_warm_up_leaves_a_role_that_computes_what_a_new_one_does(
        tiny_llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Warm-up builds the decode graph and the bucket of every prompt length asked for
    (a serving stage's warm prompt lengths): a prompt of such a length then replays
    kernels (no new JIT) and computes what a new role does."""
    prompt = [(7 * i + 3) % 200 for i in range(20)]  # bucket 24
    monkeypatch.setenv(jit_cache.CACHE_ENV, "off")
    reference = _run(_roles(tiny_llama, [(0, 4)]), prompt)
    monkeypatch.setenv(jit_cache.CACHE_ENV, str(tmp_path))
    (role,) = _roles(tiny_llama, [(0, 4)])
    role.warm_up(prompt_tokens=MAX_SEQ + 8)  # clipped to max_seq_len
    assert role._decode.captured is not None  # the decode graph is built before step 0
    assert sorted(role._prefill) == [8, 16, 24, 32]
    assert all(jit.captured is not None for jit in role._prefill.values())
    assert role._kernels is not None
    assert role._kernels.saved == {"decode", "prefill-8", "prefill-16", "prefill-24", "prefill-32"}
    built = dict(role._prefill)
    tokens, outputs = _run([role], prompt)
    assert role._prefill == built  # the prompt's bucket was warm: nothing built
    assert tokens == reference[0]
    for got, want in zip(outputs, reference[1], strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_damaged_entry_is_rebuilt(tiny_llama: Path, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(jit_cache.CACHE_ENV, str(tmp_path))
    (writer,) = _roles(tiny_llama, [(0, 4)])
    reference = _run([writer])
    assert writer._kernels is not None
    path = writer._kernels.path("decode")
    path.write_bytes(path.read_bytes()[:100])
    (reader,) = _roles(tiny_llama, [(0, 4)])
    assert _run([reader])[0] == reference[0]
    assert reader._kernels is not None and "decode" in reader._kernels.saved
    assert len(path.read_bytes()) > 100  # rewritten whole


def test_entries_are_per_role_structure(tiny_llama: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(jit_cache.CACHE_ENV, str(tmp_path))
    first, rest = _roles(tiny_llama, [(0, 2), (2, 4)])
    (whole,) = _roles(tiny_llama, [(0, 4)])
    assert first._kernels is not None and rest._kernels is not None
    assert whole._kernels is not None
    paths = {r._kernels.path("decode") for r in (first, rest, whole) if r._kernels}
    assert len(paths) == 3


def test_the_sampling_policy_is_not_part_of_the_key(tiny_llama: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from swactor.model.sampling import SamplingPolicy

    monkeypatch.setenv(jit_cache.CACHE_ENV, str(tmp_path))
    reader = open_reader(tiny_llama)

    def weights() -> Any:
        return reader.load_stage(0, 4, is_first=True, is_last=True)

    greedy = StageRole(weights(), max_seq_len=MAX_SEQ)
    sampled = StageRole(weights(), max_seq_len=MAX_SEQ,
                        sampling=SamplingPolicy.sample(temperature=0.7, top_k=5, top_p=0.9,
                                                       seed=3))
    other = StageRole(weights(), max_seq_len=MAX_SEQ + 16)
    assert greedy._kernels is not None and sampled._kernels is not None
    assert other._kernels is not None
    assert greedy._kernels.path("decode") == sampled._kernels.path("decode")
    assert greedy._kernels.path("decode") != other._kernels.path("decode")


def test_only_the_most_recently_used_entries_are_kept(tmp_path: Path) -> None:
    import os

    for index in range(6):
        entry = tmp_path / f"role{index}-decode.jit"
        entry.write_bytes(b"x")
        os.utime(entry, ns=(index * 10**9, index * 10**9))
    (tmp_path / "notes.txt").write_text("not an entry")
    jit_cache.prune(tmp_path, keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "notes.txt", "role3-decode.jit", "role4-decode.jit", "role5-decode.jit"]
