"""The device bridge (spec §33): device allocations, range copies, tinygrad views.

Theory of operation
-------------------
A `DeviceAllocation` is one tinygrad uint8 tensor realised on the worker's device; its
`Buffer` is the device memory. Range copies go through the device allocator's
`_copyin` / `_copyout` on a `Buffer.view(len, uint8, offset)` of that buffer, so an
object larger than a ring is filled (or drained) prefix by prefix while the logical
object lives in device memory. Copies here are synchronous from the host's side: when
`host_to_device` returns, the source host bytes are no longer needed (tinygrad stages
host memory itself on CUDA), so the caller may advance `consume`; `synchronize()` is
the completion barrier before an object is declared loaded (`CopyEvent`s are therefore
complete on return and exist to keep the §33 shape). Every SYNC_EVERY_BYTES copied the
bridge synchronizes too, so staging memory stays bounded for any object size.

Handles: `register()` turns a loaded allocation into a `DeviceObjectHandle` of this
worker generation; `lookup()` refuses a handle of another generation or an unknown id
with `InvalidHandle` (the step runner's `InvalidInputHandle`). `wrap()` gives the role a
tinygrad tensor view of dtype and shape over the allocation (no copy).

Allocations and copies consult the worker's fault port (`swactor.faults.Faults`,
`worker.alloc_cap` and `worker.copy`; default: none), so the DeviceOutOfMemory and
DeviceCopyFailed paths run in a real worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from tinygrad.device import Buffer, Device
from tinygrad.dtype import DType, dtypes
from tinygrad.tensor import Tensor
from tinygrad.uop import Ops

from swactor.faults import NO_FAULTS, Faults
from swactor.wire import DeviceObjectHandle, WorkerGeneration

SYNC_EVERY_BYTES = 64 << 20
"""Host-to-device bytes after which the bridge waits for the device: tinygrad's CUDA
copy stages host bytes in pinned buffers that are freed only at a synchronize."""


SPARE_MAX_BYTES = 1 << 20
"""Freed allocations up to this size are kept for reuse (`DeviceBridge.free`)."""
SPARE_COUNT = 16
"""Freed allocations kept for reuse at most, all sizes together."""


class DeviceError(Exception):
    """A device allocation or copy failed; `oom` tells an out-of-memory failure apart."""

    def __init__(self, detail: str, oom: bool = False) -> None:
        self.oom = oom
        super().__init__(detail)


class InvalidHandle(Exception):
    """A handle of another worker generation, or one this worker does not hold."""

    def __init__(self, handle: DeviceObjectHandle, stale: bool) -> None:
        self.handle = handle
        self.stale = stale
        what = "of another worker generation" if stale else "unknown to this worker"
        super().__init__(f"device handle {handle.id} is {what}")


@dataclass(slots=True)
class DeviceAllocation:
    """Device memory for one object: `extent` bytes (at least 1 byte is allocated)."""

    extent: int
    tensor: Tensor
    object_id: int = -1
    reusable: bool = False  # made by `alloc`: its memory may serve a later `alloc`
    flags: int = 0  # an ingress object's header flags (its sequence tag, if any)

    @property
    def buffer(self) -> Any:
        return self.tensor.uop.buffer


@dataclass(frozen=True, slots=True)
class CopyEvent:
    """A finished range copy (copies are synchronous from the host's side)."""

    length: int
    complete: bool = True


def choose_device(backend: object) -> str:
    """The tinygrad device named by InitializeWorker.backend (`swactor node --device`),
    else tinygrad's best available (`Device.DEFAULT`: the first of its GPU backends that
    opens, else the CPU)."""
    if isinstance(backend, dict) and isinstance(backend.get("device"), str):
        requested = str(backend["device"]).upper()
        if requested != "AUTO":
            return requested
    return str(Device.DEFAULT)


def choose_threads(backend: object) -> int | None:
    """The CPU threads named by InitializeWorker.backend's ``threads`` (`swactor node
    --threads`: a key beyond the spec's backend description, read only here), None when
    absent; a value that is no count of 1..256 raises DeviceError."""
    if not isinstance(backend, dict) or backend.get("threads") is None:
        return None
    threads = backend["threads"]
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 256:
        raise DeviceError(f"backend threads {threads!r} (a count of 1..256)")
    return threads


class DeviceBridge:
    """Allocations, range copies and handles of one worker generation on one device."""

    def __init__(
        self, device: str, generation: WorkerGeneration, faults: Faults = NO_FAULTS
    ) -> None:
        self.device = Device.canonicalize(device)
        self.generation = generation
        self.faults = faults
        self._allocator = Device[self.device].allocator
        self._handles: dict[int, DeviceAllocation] = {}
        self._next_id = 1
        self._unsynced = 0
        self._freed = Tensor.empty(1, dtype=dtypes.uint8, device=self.device)  # what a freed
        # allocation holds instead of its memory (one for all)
        self._spares: dict[int, list[Tensor]] = {}  # freed small allocations by size

    def probe(self) -> None:
        """Run one tiny kernel, so a broken backend fails at InitializeWorker."""
        value = (Tensor([1, 2, 3], device=self.device) * 2).sum().item()
        if value != 12:
            raise DeviceError(f"{self.device} computed {value} for a probe expecting 12")

    # -- allocation -----------------------------------------------------------------

    def alloc(self, extent: int, object_id: int = -1) -> DeviceAllocation:
        """Allocate `extent` bytes of device memory (raises DeviceError)."""
        if self.faults.alloc_refused(extent):
            raise DeviceError(f"allocating {extent} bytes: over the injected cap", oom=True)
        spares = self._spares.get(max(extent, 1))
        if spares:
            return DeviceAllocation(extent, spares.pop(), object_id, reusable=True)
        try:
            tensor = Tensor.empty(max(extent, 1), dtype=dtypes.uint8, device=self.device)
            tensor.uop.buffer.ensure_allocated()  # type: ignore[union-attr]
        except (MemoryError, OSError, RuntimeError) as exc:
            raise DeviceError(f"allocating {extent} bytes: {exc}", oom=True) from None
        return DeviceAllocation(extent, tensor, object_id, reusable=True)

    def adopt(self, output: Tensor | npt.NDArray[Any]) -> DeviceAllocation:
        """A role output as an allocation (its bytes, flattened).

        A host array (what a role computing on the host returns), or a tensor made from
        one (`Tensor(ndarray)`: a COPY of a host buffer), is allocated and its bytes
        copied in directly, without scheduling tinygrad's copy kernel (about a
        millisecond of Python per step)."""
        if isinstance(output, np.ndarray):
            array = np.require(output, requirements=("C", "W"))  # copyin wants writable memory
            host: memoryview | None = array.reshape(-1).view(np.uint8).data
        else:
            host = _host_bytes(output)
        if host is not None:
            allocation = self.alloc(len(host))
            if len(host):
                try:
                    self._allocator._copyin(self._range(allocation, 0, len(host)), host)
                except (RuntimeError, OSError, ValueError, AssertionError) as exc:
                    raise DeviceError(f"output copy: {exc}") from None
            return allocation
        assert isinstance(output, Tensor)
        flat = output.contiguous().realize()
        buffer = flat.uop.buffer.ensure_allocated()  # type: ignore[union-attr]
        return DeviceAllocation(int(buffer.nbytes), flat)

    def free(self, allocation: DeviceAllocation) -> None:
        """Drop the allocation; tinygrad frees the memory with its last reference.

        An allocation `alloc` made of at most SPARE_MAX_BYTES is kept instead (at most
        SPARE_COUNT in all) and serves the next `alloc` of its size: a decode step's
        objects are all one size, and a fresh tensor costs tinygrad its UOps and buffer
        each time. An object is only freed after the step that read it completed:
        its outputs were copied out to the egress rings, which waits for the device work
        before them."""
        tensor, allocation.tensor = allocation.tensor, self._freed
        if not allocation.reusable or tensor is self._freed:
            return
        allocation.reusable = False
        size = int(tensor.shape[0])
        if size <= SPARE_MAX_BYTES and sum(map(len, self._spares.values())) < SPARE_COUNT:
            self._spares.setdefault(size, []).append(tensor)

    # -- copies ---------------------------------------------------------------------

    def _range(self, allocation: DeviceAllocation, offset: int, length: int) -> Any:
        return allocation.buffer.view(length, dtypes.uint8, offset).ensure_allocated()._buf

    def host_to_device(
        self, src: memoryview, allocation: DeviceAllocation, device_offset: int
    ) -> CopyEvent:
        """Copy host bytes `src` into the allocation at `device_offset`."""
        if self.faults.copy_fails("host_to_device", allocation.object_id):
            raise DeviceError("host-to-device copy failed (fault injection)")
        if len(src) == 0:
            return CopyEvent(0)
        try:
            self._allocator._copyin(self._range(allocation, device_offset, len(src)), src)
        except (RuntimeError, OSError, ValueError, AssertionError) as exc:
            raise DeviceError(f"host-to-device copy: {exc}") from None
        self._unsynced += len(src)
        if self._unsynced >= SYNC_EVERY_BYTES:
            self.synchronize()  # bounds the staging memory queued copies hold (CUDA)
        return CopyEvent(len(src))

    def device_to_host(
        self, allocation: DeviceAllocation, device_offset: int, dst: memoryview
    ) -> CopyEvent:
        """Copy `len(dst)` bytes of the allocation from `device_offset` into host `dst`."""
        if self.faults.copy_fails("device_to_host", allocation.object_id):
            raise DeviceError("device-to-host copy failed (fault injection)")
        if len(dst) == 0:
            return CopyEvent(0)
        try:
            self._allocator._copyout(dst, self._range(allocation, device_offset, len(dst)))
        except (RuntimeError, OSError, ValueError, AssertionError) as exc:
            raise DeviceError(f"device-to-host copy: {exc}") from None
        return CopyEvent(len(dst))

    def copy_event_complete(self, event: CopyEvent) -> bool:
        return event.complete

    def synchronize(self) -> None:
        """Wait until every queued device operation finished."""
        self._unsynced = 0
        Device[self.device].synchronize()  # type: ignore[no-untyped-call]

    # -- handles and views ------------------------------------------------------------

    def register(self, allocation: DeviceAllocation) -> DeviceObjectHandle:
        handle = DeviceObjectHandle(self.generation, self._next_id)
        self._handles[self._next_id] = allocation
        self._next_id += 1
        return handle

    def lookup(self, handle: DeviceObjectHandle) -> DeviceAllocation:
        if handle.worker_generation != self.generation:
            raise InvalidHandle(handle, stale=True)
        allocation = self._handles.get(handle.id)
        if allocation is None:
            raise InvalidHandle(handle, stale=False)
        return allocation

    def release(self, handle: DeviceObjectHandle) -> None:
        """Forget and free the handle's allocation (raises InvalidHandle)."""
        allocation = self.lookup(handle)
        del self._handles[handle.id]
        self.free(allocation)

    @property
    def live_handles(self) -> int:
        return len(self._handles)

    def wrap(
        self, allocation: DeviceAllocation, dtype: DType = dtypes.uint8,
        shape: tuple[int, ...] | None = None,
    ) -> Tensor:
        """A tinygrad tensor view (no copy) of the allocation's `extent` bytes."""
        whole = allocation.tensor.shape == (allocation.extent,)
        view = allocation.tensor if whole else allocation.tensor[: allocation.extent]
        if dtype != dtypes.uint8:
            view = view.bitcast(dtype)
        return view.reshape(shape) if shape is not None else view


def host_array(tensor: Tensor) -> npt.NDArray[np.uint8]:
    """The bytes of a flat uint8 tensor (a role's input view) as a host array.

    A tensor that is a whole realised buffer is read through the buffer's memory view:
    on a device whose memory the host can address (CPU) a view with no copy, else one
    copy out. Anything else goes through `Tensor.numpy()`, which schedules a copy kernel
    (about a millisecond of Python per step). The array is read-only and valid while the
    tensor's allocation is held."""
    uop = tensor.uop
    if tensor.dtype == dtypes.uint8 and uop.has_buffer_identity():  # type: ignore[no-untyped-call]
        buffer = uop.base.buffer
        if isinstance(buffer, Buffer) and buffer.nbytes == tensor.nbytes():
            memory = buffer.as_memoryview(allow_zero_copy=True)
            return np.frombuffer(memory, dtype=np.uint8)
    array: npt.NDArray[np.uint8] = tensor.numpy()
    return array


def _host_bytes(tensor: Tensor) -> memoryview | None:
    """The bytes of the host buffer `tensor` is an unrealised whole copy of, or None."""
    uop = tensor.uop
    if uop.op is not Ops.COPY or len(uop.src) != 1:
        return None
    source = uop.src[0]
    if source.op is not Ops.BUFFER or source.device != "NPY":
        return None
    buffer = source.buffer
    if (not isinstance(buffer, Buffer) or not buffer.is_allocated()
            or buffer.nbytes != tensor.nbytes()):
        return None
    return buffer.as_memoryview().cast("B")
