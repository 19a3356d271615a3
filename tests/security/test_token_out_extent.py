"""An oversized token-out extent is refused before the orchestrator sets memory aside for it.

The adversary is the last stage's node (or anyone holding its stream): it writes a
well-formed ObjectHeader whose extent is 64 MiB onto the token-out ring, while the
edge's ObjectSpec allows one u32 token id. The orchestrator's token-out reader must
refuse the record from its header alone (spec §17 record checks, the ingress_ring
table's `extent_exceeds_max` row), without a buffer of the size the peer chose.
"""

from __future__ import annotations

import tracemalloc

from swactor.fsm.generated import ingress_ring as ir
from swactor.wire import RunFaultReason
from tests.orchestrator.token_ring import TokenRing

CLAIMED = 64 << 20
BOUND = 1 << 20


def test_oversized_token_out_extent_is_refused_before_allocation() -> None:
    ring = TokenRing()
    try:
        header = ring.record(0, b"", extent=CLAIMED)
        tracemalloc.start()
        try:
            ring.write(header)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert ring.failed == [RunFaultReason.ObjectHeaderMalformed]
        assert ring.reader.machine.state is ir.State.Faulted
        assert ring.loaded == []
        assert peak < BOUND, f"{peak} bytes traced while refusing a {CLAIMED}-byte extent"
    finally:
        ring.close()
