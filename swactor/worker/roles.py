"""Worker roles: a registry of role kinds by name, and the echo and scale roles.

Theory of operation
-------------------
`ConfigureRole { role_id, config }` names the kind in `config["kind"]`; the registry
builds a `Role` from the rest of the config (`RoleConfigError` -> RoleFailed
ConfigInvalid). A role's `run(inputs, outputs)` gets each bound input as a
flat uint8 tinygrad tensor (a view of its device object, keyed by input port id) and
returns one tensor (or a host array of bytes, as a role computing on the host does) per
declared output port; the step runner checks the ports and the byte sizes against the
bindings and writes the bytes to the egress rings. Roles never see rings or handles.

Shipped kinds (tests and smoke runs; the model stage roles register later through
`register_role_kind`):

- `echo`: each output is the input of the same port id, or the only input;
- `scale`: inputs are float32 vectors; each output is its input times `config["factor"]`.

A factory gets the config and the worker's tinygrad device name (e.g. "CPU", "CUDA"),
so a role can place its own state (weights, KV cache) on the same device. A factory
that raises RoleConfigError answers RoleFailed ConfigInvalid; any other exception
answers RoleFailed TinygradError.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy.typing as npt
from tinygrad.dtype import dtypes
from tinygrad.tensor import Tensor

from swactor.wire import JsonValue, OutputBinding, StageFootprint


class RoleConfigError(ValueError):
    """A ConfigureRole config the role kind cannot use (RoleFailed ConfigInvalid)."""


class RoleRunError(ValueError):
    """A role cannot map the step's bindings (StepFailed OutputExtentInvalid)."""


class Role(Protocol):
    """One configured role: runs steps over device tensors.

    A role may also offer `reconfigure(config, device) -> bool`: the worker asks the role
    already configured under a role id first, and a True answer means it serves the new
    ConfigureRole as it is (no rebuild; `llama_stage` uses it to skip reloading weights).
    A role that holds a model may offer `footprint() -> StageFootprint`: what it holds at
    ready, which RoleConfigured carries to the node (`footprint_of`)."""

    def run(
        self, inputs: Mapping[int, Tensor], outputs: Sequence[OutputBinding]
    ) -> Mapping[int, Tensor | npt.NDArray[Any]]:
        """Outputs by output port id: tensors (any dtype) or host arrays; their bytes are
        written."""
        ...


RoleFactory = Callable[[Mapping[str, JsonValue], str], Role]
"""Builds a role from its ConfigureRole config and the worker's tinygrad device name."""

_KINDS: dict[str, RoleFactory] = {}


def register_role_kind(name: str, factory: RoleFactory) -> None:
    """Make `config["kind"] == name` build roles with `factory(config, device)`."""
    _KINDS[name] = factory


def role_kinds() -> tuple[str, ...]:
    return tuple(sorted(_KINDS))


def footprint_of(role: object) -> StageFootprint | None:
    """The role's `footprint()` when it offers one (a model stage), else None."""
    footprint = getattr(role, "footprint", None)
    if footprint is None:
        return None
    measured = footprint()
    return measured if isinstance(measured, StageFootprint) else None


def build_role(config: JsonValue, device: str) -> Role:
    """The role the config names; raises RoleConfigError for a bad or unknown kind."""
    if not isinstance(config, dict):
        raise RoleConfigError("config must be an object with a 'kind'")
    kind = config.get("kind")
    if not isinstance(kind, str) or kind not in _KINDS:
        raise RoleConfigError(f"unknown role kind (known: {', '.join(role_kinds())})")
    return _KINDS[kind](config, device)


def _source_for(port: int, inputs: Mapping[int, Tensor]) -> Tensor:
    if port in inputs:
        return inputs[port]
    if len(inputs) == 1:
        return next(iter(inputs.values()))
    raise RoleRunError(f"no input for output port {port}")


class EchoRole:
    """Copies each input to the output of the same port (or the only input)."""

    def run(
        self, inputs: Mapping[int, Tensor], outputs: Sequence[OutputBinding]
    ) -> dict[int, Tensor]:
        return {int(b.port_id): _source_for(int(b.port_id), inputs) for b in outputs}


class ScaleRole:
    """Multiplies float32 inputs by a constant factor on the device."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    @classmethod
    def from_config(cls, config: Mapping[str, JsonValue], device: str) -> ScaleRole:
        factor = config.get("factor")
        if isinstance(factor, bool) or not isinstance(factor, int | float):
            raise RoleConfigError("scale needs a numeric 'factor'")
        return cls(float(factor))

    def run(
        self, inputs: Mapping[int, Tensor], outputs: Sequence[OutputBinding]
    ) -> dict[int, Tensor]:
        result = {}
        for binding in outputs:
            source = _source_for(int(binding.port_id), inputs)
            if source.shape[0] % 4:
                raise RoleRunError("scale input is not a whole number of float32s")
            result[int(binding.port_id)] = source.bitcast(dtypes.float32) * self.factor
        return result


register_role_kind("echo", lambda config, device: EchoRole())
register_role_kind("scale", ScaleRole.from_config)
import swactor.worker.llama_stage  # noqa: E402, F401  (registers the llama_stage role kind)
