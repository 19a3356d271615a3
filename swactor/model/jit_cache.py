"""Kernel cache: a stage role's captured TinyJits kept on disk, so a new worker skips the build.

Theory of operation
-------------------
Building a role's decode or prefill JIT in tinygrad costs tens of seconds of Python on a
small CPU for SmolLM2 (scheduling the whole layer range, then lowering every kernel);
tinygrad's own disk cache (``CACHEDB``, default ``~/.cache/tinygrad/cache.db``) keeps only
the compiled binaries, which are the small part. A captured JIT
(:class:`tinygrad.engine.jit.CapturedJit`: the kernel list with compiled programs, the
memory plan and the output) is what the build produces, and tinygrad can pickle it. What
must not go into the file is the role's own state — weights, KV caches, rotary tables —
which the new process already holds in its own buffers:

* :func:`role_buffers` names every device buffer a role owns by its attribute path
  (``blocks.3.cache_k``, ``output``, ...);
* :meth:`KernelCache.save` pickles a captured JIT with each of those buffers written as a
  *persistent id* (its name) and every other buffer (the JIT's scratch arena) by value;
* :meth:`KernelCache.load` reads it back with each name resolved to the new role's buffer
  and each scratch buffer given a fresh buffer number in this process (numbers from the
  writing process would collide with buffers created here).

An entry is keyed by a SHA-256 of everything the captured graph depends on: tinygrad's
version and codegen settings, the CPU the binaries were compiled for, the source of the
modules that build the graph (``llama_role``, ``block_kernels``, ``prefill_gemm``,
``decode_gemv``, ``decode_attention``, ``gated``, ``cpu_graph``, this one), the role's
structure (layer range, first/last, dtype, ``max_seq_len``, weight mode, device, model
facts), the name, shape and dtype of every owned buffer, the plain values held beside
them (a block matrix's ``nibbles`` flag, say), and the JIT's kind (``decode``,
``prefill-32``). Weight *values* are not part of it: two files of the same architecture
share entries. A missing, stale or unreadable entry is rebuilt and rewritten (written to a
temporary name and renamed, so concurrent workers never read half a file). Only the
:data:`KEEP_ENTRIES` most recently used entries are kept.

The cache directory is ``$SWACTOR_KERNEL_CACHE`` or ``$XDG_CACHE_HOME/swactor/kernels``
(default ``~/.cache/swactor/kernels``); ``SWACTOR_KERNEL_CACHE=off`` turns it off. Entries
are pickles, trusted as tinygrad trusts its own ``cache.db`` (also pickles): the directory
must be writable only by the user running the nodes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.metadata
import io
import json
import logging
import os
import pickle
import platform
import tempfile
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from tinygrad.engine.jit import CapturedJit
from tinygrad.tensor import Tensor
from tinygrad.uop import Ops
from tinygrad.uop.ops import UOp

log = logging.getLogger(__name__)

CACHE_ENV = "SWACTOR_KERNEL_CACHE"
KEEP_ENTRIES = 64  # a few MB each: decode and prefill buckets of a few roles
_FORMAT = 1
# modules whose code shapes a role's graph: a change in any of them is a new key
_GRAPH_MODULES = ("swactor.model.llama_role", "swactor.model.block_kernels",
                  "swactor.model.prefill_gemm", "swactor.model.decode_gemv",
                  "swactor.model.decode_attention", "swactor.model.gated",
                  "swactor.model.c_kernel", "swactor.model.cpu_graph", __name__)


def cache_dir() -> Path | None:
    """Where entries live (module doc); None when the cache is off."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "off", "0") else Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "swactor" / "kernels"


def role_buffers(role: object, skip: tuple[str, ...] = ()) -> dict[str, UOp]:
    """Every realized tensor a role holds (through lists, dicts and dataclasses), by path."""
    return _walk(role, skip)[0]


def _walk(role: object, skip: tuple[str, ...]) -> tuple[dict[str, UOp], dict[str, Any]]:
    """The role's buffers by path, and the plain values (flags, sizes, names) held beside
    them in its lists, dicts and dataclasses, which can shape a graph too (part of the
    key)."""
    found: dict[str, UOp] = {}
    plain: dict[str, Any] = {}

    def walk(value: object, name: str, depth: int) -> None:
        if isinstance(value, Tensor):
            base = value.uop.base
            if base.op is Ops.BUFFER and base not in found.values():
                found[name] = base
        elif isinstance(value, UOp):
            return  # symbolic variables: named in the graph itself
        elif isinstance(value, (bool, int, float, str)) or value is None:
            if depth:  # the role's own attributes are in its description
                plain[name] = value
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                walk(item, f"{name}.{index}", depth + 1)
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{name}.{key}", depth + 1)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for field in dataclasses.fields(value):
                walk(getattr(value, field.name), f"{name}.{field.name}", depth + 1)

    for attribute, value in vars(role).items():
        if attribute not in skip:
            walk(value, attribute, 0)
    return found, plain


@cache
def _environment_digest() -> str:
    """tinygrad's version and codegen settings, the CPU, and the graph-building sources."""
    from tinygrad.codegen import to_program_config
    from tinygrad.helpers import BEAM

    parts: list[str] = [f"format {_FORMAT}", f"tinygrad {importlib.metadata.version('tinygrad')}",
                        platform.machine(), _cpu_flags()]
    parts += [f"{var.key}={var.value}" for var in (*to_program_config, BEAM)]
    for module_name in _GRAPH_MODULES:
        source = __import__(module_name, fromlist=["__file__"]).__file__
        parts.append(hashlib.sha256(Path(str(source)).read_bytes()).hexdigest())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith(("flags", "Features", "model name")):
                    return line.strip()
    except OSError:
        pass
    return platform.processor()


class _Writer(pickle.Pickler):
    def __init__(self, file: io.BytesIO, names: Mapping[UOp, str]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._names = names

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is UOp and obj.op is Ops.BUFFER:
            name = self._names.get(obj)
            if name is not None:
                return ("role", name)
            return ("scratch", obj.dtype, obj.src, obj.arg, obj.tag, obj.metadata, obj.realized)
        return None


class _Reader(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, buffers: Mapping[str, UOp]) -> None:
        super().__init__(file)
        self._buffers = buffers
        self._scratch: dict[Any, UOp] = {}

    def persistent_load(self, pid: Any) -> UOp:
        if pid[0] == "role":
            found = self._buffers.get(pid[1])
            if found is None:
                raise pickle.UnpicklingError(f"no role buffer {pid[1]!r}")
            return found
        _, dtype, src, arg, tag, metadata, buffer = pid
        made = self._scratch.get(arg)
        if made is None:
            # a fresh buffer number: the writer's could name a buffer of this process
            fresh = dataclasses.replace(arg, slot=next(UOp.unique_num))
            # the arguments UOp.__reduce__ gives: the metaclass binds `buffer` to the UOp
            made = self._scratch[arg] = UOp(Ops.BUFFER, dtype, src, fresh, tag,  # type: ignore[call-arg]
                                            metadata, buffer)
        return made


def prune(directory: Path, keep: int = KEEP_ENTRIES) -> None:
    """Delete all but the `keep` most recently used entries (a code change makes every
    entry of the old code a miss forever)."""
    try:
        entries = sorted(directory.glob("*.jit"), key=lambda p: p.stat().st_mtime_ns,
                         reverse=True)
    except OSError:
        return
    for stale in entries[keep:]:
        with contextlib.suppress(OSError):
            stale.unlink()


class KernelCache:
    """The cache entries of one role (module doc)."""

    def __init__(self, directory: Path, role_key: str, buffers: dict[str, UOp]) -> None:
        self.directory = directory
        self._role_key = role_key
        self._buffers = buffers
        self._names = {uop: name for name, uop in buffers.items()}
        self.saved: set[str] = set()
        self.loaded: set[str] = set()

    @classmethod
    def for_role(cls, role: object, description: Mapping[str, Any],
                 skip: tuple[str, ...] = ()) -> KernelCache | None:
        """The cache for `role` (None when off); `description` is its structure."""
        directory = cache_dir()
        if directory is None:
            return None
        buffers, plain = _walk(role, skip)
        shapes = {name: [str(uop.dtype), repr(uop.src), repr(uop.device)]
                  for name, uop in buffers.items()}
        text = json.dumps({"role": description, "buffers": shapes, "values": plain,
                           "environment": _environment_digest()}, sort_keys=True, default=str)
        return cls(directory, hashlib.sha256(text.encode()).hexdigest(), buffers)

    def path(self, kind: str) -> Path:
        return self.directory / f"{self._role_key[:32]}-{kind}.jit"

    def kinds(self, prefix: str) -> list[str]:
        """The kinds starting with `prefix` this role has entries for."""
        start = f"{self._role_key[:32]}-"
        return sorted(p.name[len(start):-len(".jit")]
                      for p in self.directory.glob(f"{start}{prefix}*.jit"))

    def load(self, kind: str) -> CapturedJit[Any] | None:
        """The captured JIT of `kind` bound to this role's buffers; None when absent or
        unusable (then the caller builds it)."""
        path = self.path(kind)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        try:
            captured = _Reader(io.BytesIO(data), self._buffers).load()
        except Exception as error:  # a stale or damaged entry: rebuild and overwrite it
            log.warning("kernel cache: %s unusable (%s); rebuilding", path.name, error)
            return None
        if not isinstance(captured, CapturedJit):
            return None
        self.loaded.add(kind)
        with contextlib.suppress(OSError):
            os.utime(path)  # used now: pruning goes by last use
        return captured

    def save(self, kind: str, captured: CapturedJit[Any]) -> None:
        """Write `captured` for `kind` (atomically); a write failure only logs."""
        if kind in self.saved or kind in self.loaded:
            return
        self.saved.add(kind)
        buffer = io.BytesIO()
        try:
            _Writer(buffer, self._names).dump(captured)
            self.directory.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.directory, prefix=f".{kind}-",
                                             delete=False) as tmp:
                tmp.write(buffer.getvalue())
            os.replace(tmp.name, self.path(kind))
        except (OSError, pickle.PicklingError, TypeError, AttributeError) as error:
            log.warning("kernel cache: cannot write %s (%s)", kind, error)
            return
        prune(self.directory)
