"""The shared runtime pieces: ProtocolError's fields and message, the fast-build helpers."""

from __future__ import annotations

import dataclasses

import pytest

from swactor.fsm.runtime import ProtocolError, StartTimer, blank, slot_setter


def test_protocol_error_names_machine_state_event_and_reason() -> None:
    error = ProtocolError("arena_manager", "Ready", "LeaseRing", "no row handles it")
    assert (error.machine, error.state, error.event, error.reason) == (
        "arena_manager", "Ready", "LeaseRing", "no row handles it")
    assert str(error) == "arena_manager: event LeaseRing in state Ready: no row handles it"


def test_blank_and_slot_setters_build_an_equal_frozen_instance() -> None:
    built = blank(StartTimer)
    slot_setter(StartTimer, "name")(built, "DrainTimeout")
    slot_setter(StartTimer, "seconds")(built, 2.5)
    assert built == StartTimer("DrainTimeout", 2.5)
    assert hash(built) == hash(StartTimer("DrainTimeout", 2.5))
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.seconds = 1.0  # type: ignore[misc]


def test_slot_setter_refuses_a_name_that_is_not_a_slot() -> None:
    with pytest.raises(KeyError):
        slot_setter(StartTimer, "nope")
