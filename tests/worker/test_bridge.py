"""DeviceBridge: reused allocations, host views of inputs, host arrays as outputs."""

from __future__ import annotations

import numpy as np
from tinygrad.dtype import dtypes
from tinygrad.tensor import Tensor

from swactor.wire import WorkerGeneration
from swactor.worker.bridge import SPARE_COUNT, SPARE_MAX_BYTES, DeviceBridge, host_array


def test_a_freed_small_allocation_serves_the_next_one_of_its_size() -> None:
    bridge = DeviceBridge("CPU", WorkerGeneration(1))
    first = bridge.alloc(2304)
    kept = first.tensor
    bridge.free(first)
    again = bridge.alloc(2304)
    assert again.tensor is kept and again.extent == 2304
    assert bridge.alloc(2304).tensor is not kept  # one spare, taken once
    other = bridge.alloc(100)
    assert other.tensor is not kept  # another size never gets it
    bridge.free(again)
    bridge.free(again)  # a second free of the same allocation keeps nothing twice
    assert bridge.alloc(2304).tensor is kept
    assert bridge.alloc(2304).tensor is not kept


def test_spares_are_bounded_in_size_and_count() -> None:
    bridge = DeviceBridge("CPU", WorkerGeneration(1))
    big = bridge.alloc(SPARE_MAX_BYTES + 1)
    kept = big.tensor
    bridge.free(big)
    assert bridge.alloc(SPARE_MAX_BYTES + 1).tensor is not kept
    many = [bridge.alloc(64) for _ in range(SPARE_COUNT + 3)]
    originals = [a.tensor for a in many]  # held: ids of freed tensors are not reused
    for allocation in many:
        bridge.free(allocation)
    reused = [bridge.alloc(64) for _ in range(SPARE_COUNT + 3)]
    assert sum(any(a.tensor is t for t in originals) for a in reused) == SPARE_COUNT


def test_adopted_device_outputs_are_never_reused_host_ones_are() -> None:
    """A role's device tensor may be another allocation's memory (an echo role returns its
    input): never kept. A host array's bytes were copied into an allocation of the
    bridge's own: kept once freed."""
    bridge = DeviceBridge("CPU", WorkerGeneration(1))
    output = bridge.adopt(Tensor([1, 2, 3], dtype=dtypes.uint8).realize())
    kept = output.tensor
    bridge.free(output)
    assert bridge.alloc(3).tensor is not kept
    copied = bridge.adopt(np.array([1, 2, 3, 4], dtype=np.uint8))
    kept = copied.tensor
    bridge.free(copied)
    assert bridge.alloc(4).tensor is kept


def test_host_array_reads_a_whole_allocation_and_adopt_takes_host_arrays() -> None:
    bridge = DeviceBridge("CPU", WorkerGeneration(1))
    allocation = bridge.alloc(8)
    bridge.host_to_device(memoryview(bytearray(range(8))), allocation, 0)
    assert host_array(bridge.wrap(allocation)).tobytes() == bytes(range(8))
    # a view that is not the whole buffer goes through numpy()
    assert host_array(bridge.wrap(allocation)[2:5]).tobytes() == bytes([2, 3, 4])
    written = np.array([7, 8], dtype="<u4")
    written.flags.writeable = False  # a read-only result is taken too
    out = bridge.adopt(written)
    assert out.extent == 8
    back = bytearray(8)
    bridge.device_to_host(out, 0, memoryview(back))
    assert bytes(back) == np.array([7, 8], dtype="<u4").tobytes()
