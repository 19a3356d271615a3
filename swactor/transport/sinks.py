"""Callback types through which the driver reports events and wake hints."""

from __future__ import annotations

from collections.abc import Callable

from swactor.transport.messages import DriverEvent, WakeHint

EmitEvent = Callable[[DriverEvent], None]
"""Receives DriverEdgeReady, StreamClosed, StreamFault and PumpStopped."""

EmitWake = Callable[[WakeHint], None]
"""Receives RingReadable / RingWritable for the process on a ring's other side."""
