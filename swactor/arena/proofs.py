"""Quiescence proofs that only the teardown path can mint (spec §19, §38, §39).

Theory of operation
-------------------
`swactor.wire.QuiescenceProof` is a plain value: anybody can build one.  What makes a
proof *count* is where it came from.  Each ArenaManager creates exactly one
`QuiescenceMinter` and hands it to the teardown path (the edge teardown / stage
controller binding); it never gives it to a pump, a worker or a requester.  The minter
records every proof object it mints, and the manager's `proof_valid` guard accepts a
ReleaseRing only if its proof is *that very object* (identity, not equality), names the
released ring, and the ring is a live lease.  A value-equal forgery, a proof minted for
another ring, or a proof replayed after its release are all rejected (ReleaseRejected),
and the range stays leased.

The minting methods spell out the §38 release conditions:

- `after_teardown(ring_id, pump_stopped=..., ring_quiesced=...)`: the driver's pump is
  stopped and the worker reported RingQuiesced (both must be true);
- `worker_reaped(ring_id, returncode)`: the worker process that mapped the ring is gone
  (its exit status was collected);
- `never_installed(ring_id)`: the lease was granted but no pump and no worker ring was
  ever set up for it (e.g. granted after its request was cancelled).
"""

from __future__ import annotations

from swactor.wire import QuiescenceProof, QuiescenceProofKind, RingId


class ProofRefused(ValueError):
    """The teardown path asked for a proof whose conditions do not hold."""


class QuiescenceMinter:
    """The capability to mint quiescence proofs for one ArenaManager."""

    __slots__ = ("_minted",)

    def __init__(self) -> None:
        self._minted: dict[int, QuiescenceProof] = {}

    def _mint(self, ring_id: int, kind: QuiescenceProofKind) -> QuiescenceProof:
        proof = QuiescenceProof(ring_id=RingId(ring_id), kind=kind)
        self._minted[int(ring_id)] = proof
        return proof

    def after_teardown(
        self, ring_id: int, *, pump_stopped: bool, ring_quiesced: bool
    ) -> QuiescenceProof:
        """Pump stopped and worker ring quiesced (spec §38 ReleasingArena)."""
        if not (pump_stopped and ring_quiesced):
            raise ProofRefused(
                f"ring {ring_id}: needs pump stopped ({pump_stopped}) "
                f"and ring quiesced ({ring_quiesced})"
            )
        return self._mint(ring_id, QuiescenceProofKind.PumpStoppedAndRingQuiesced)

    def worker_reaped(self, ring_id: int, returncode: int | None) -> QuiescenceProof:
        """The worker that mapped the ring exited and was reaped."""
        if returncode is None:
            raise ProofRefused(f"ring {ring_id}: the worker has not been reaped")
        return self._mint(ring_id, QuiescenceProofKind.WorkerReaped)

    def never_installed(self, ring_id: int) -> QuiescenceProof:
        """No pump and no worker ring was ever set up for this lease."""
        return self._mint(ring_id, QuiescenceProofKind.NeverInstalled)

    def issued(self, proof: QuiescenceProof) -> bool:
        """Whether `proof` is the very object this minter issued for its ring."""
        return self._minted.get(int(proof.ring_id)) is proof

    def retire(self, ring_id: int) -> None:
        """Forget the proof of a released ring, so that it cannot be replayed."""
        self._minted.pop(int(ring_id), None)
