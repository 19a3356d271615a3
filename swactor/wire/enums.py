"""Enumerations of the wire vocabulary: spec names for kinds, policies and reasons.

Theory of operation
-------------------
Every enum is a plain `enum.Enum` whose member values are strings. Where the spec names
the members (spec §11, §18, §29, §37, §38) the names and values are exactly the spec's;
where the spec leaves a type open (`DTypeFamily`, `ObjectKind`, `ShapeRule`,
`LayoutRule`, `SequencePolicy`, the run/stream/role/release/arena reasons) this module
chooses a small set and documents each member. JSON carries the value string. YAML
tables name members by their Python name (`with: {Effect.reason: HeaderMalformed}`).

`Component` is the one enum whose values differ from member names: the values are the
snake_case component names used in lifecycle events (spec §40), e.g.
`Component.ArenaManager.value == "arena_manager"`.
"""

from __future__ import annotations

import enum

# --- plan and ring shape (spec §11, §17, §18) ---------------------------------------


class EdgeKind(enum.Enum):
    """What an edge carries (spec §11)."""

    TokenIn = "TokenIn"  #: token ids, orchestrator -> stage 0
    Activation = "Activation"  #: hidden states, stage i -> stage i + 1
    TokenOut = "TokenOut"  #: sampled token ids, last stage -> orchestrator


class RingDirection(enum.Enum):
    """Which side of the worker a ring feeds (spec §18)."""

    Ingress = "Ingress"  #: recv-pump produces, worker consumes
    Egress = "Egress"  #: worker produces, send-pump consumes


class HostPinning(enum.Enum):
    """Whether a ring's host memory must be pinned for DMA (spec §18)."""

    Pageable = "Pageable"
    PinnedRequired = "PinnedRequired"


class WakeCoalescing(enum.Enum):
    """How duplicate wake hints are coalesced (spec §18, §21)."""

    PendingBit = "PendingBit"
    ReadySet = "ReadySet"


class DTypeFamily(enum.Enum):
    """Element family of a tensor; the width in bytes travels beside it.

    Allowed widths: `Float` 2, 4 or 8 (IEEE half, single, double); `BFloat` 2;
    `Int` and `UInt` 1, 2, 4 or 8 (two's complement / unsigned, little endian).
    """

    Float = "Float"
    BFloat = "BFloat"
    Int = "Int"
    UInt = "UInt"


DTYPE_WIDTHS: dict[DTypeFamily, frozenset[int]] = {
    DTypeFamily.Float: frozenset({2, 4, 8}),
    DTypeFamily.BFloat: frozenset({2}),
    DTypeFamily.Int: frozenset({1, 2, 4, 8}),
    DTypeFamily.UInt: frozenset({1, 2, 4, 8}),
}


class ObjectKind(enum.Enum):
    """What one object on an edge holds (spec §17)."""

    TokenIds = "TokenIds"  #: a vector of token ids (prompt, or one sampled token per step)
    Activation = "Activation"  #: hidden-state rows [n_positions, hidden_dim]


class ShapeRule(enum.Enum):
    """The shape family of an object's payload; `ObjectSpec.alignment` is the granule.

    `Vector`: a 1-D run of elements; `alignment == dtype_width_bytes`.
    `Rows`: a 2-D row-major matrix `[rows, alignment / dtype_width_bytes]`; one row is
    `alignment` bytes (for activations: `hidden_dim * dtype_width_bytes`).
    Either way a valid extent is a whole number of granules.
    """

    Vector = "Vector"
    Rows = "Rows"


class LayoutRule(enum.Enum):
    """How elements are laid out in the payload bytes.

    `RowMajor`: dense, C order, little-endian elements, no padding.
    `Opaque`: bytes only the roles at both ends interpret; extent rules still apply.
    """

    RowMajor = "RowMajor"
    Opaque = "Opaque"


class SequencePolicy(enum.Enum):
    """The inference-step ordering rule an edge enforces on `ObjectHeader.sequence`.

    `Contiguous`: the first object has sequence 0 and each next one is previous + 1.
    `Increasing`: each object's sequence is strictly greater than the previous one.
    """

    Contiguous = "Contiguous"
    Increasing = "Increasing"


# --- plan variants (spec §11) ----------------------------------------------------------


class GgufSourceKind(enum.Enum):
    """Where a GGUF artifact comes from."""

    LocalPath = "LocalPath"  #: an absolute file path on the node
    HttpUrl = "HttpUrl"  #: an http:// or https:// URL (artifact server, object store)
    CacheKey = "CacheKey"  #: a key into the node's model cache (e.g. a file name)
    PoolPeer = "PoolPeer"  #: fetched by range from a pool peer over QUIC (spec §15 extension)


class TokenizerSourceKind(enum.Enum):
    """Where the tokenizer comes from."""

    GgufEmbedded = "GgufEmbedded"  #: the tokenizer stored in the GGUF metadata
    LocalPath = "LocalPath"  #: a tokenizer file path on the orchestrator


class SamplingMode(enum.Enum):
    """How the last stage picks the next token."""

    Greedy = "Greedy"  #: argmax
    Temperature = "Temperature"  #: softmax(logits / temperature), top-k, top-p, seeded


class TokenOutputMode(enum.Enum):
    """How the orchestrator hands generated tokens to its caller."""

    Collect = "Collect"  #: return all tokens when the run completes
    Stream = "Stream"  #: also emit each token as it arrives (token_received)


class PromptKind(enum.Enum):
    """What a prompt source holds."""

    Text = "Text"  #: text the orchestrator tokenizes
    TokenIds = "TokenIds"  #: already-tokenized ids


class EdgeEndpointKind(enum.Enum):
    """Who produces or consumes an edge (spec §11)."""

    Orchestrator = "Orchestrator"
    Stage = "Stage"


class QuiescenceProofKind(enum.Enum):
    """Why a ring range may go back to the arena free list (spec §38)."""

    PumpStoppedAndRingQuiesced = "PumpStoppedAndRingQuiesced"  #: PumpStopped + RingQuiesced
    WorkerReaped = "WorkerReaped"  #: the worker process that mapped the ring is gone
    NeverInstalled = "NeverInstalled"  #: lease granted after cancel; no pump, no worker ring


# --- spec §37 taxonomy (exact members) ---------------------------------------------------


class RingFaultReason(enum.Enum):
    """Why a ring faulted (spec §37)."""

    UnsupportedRingVersion = "UnsupportedRingVersion"
    RingLayoutInvalid = "RingLayoutInvalid"
    RingStateInvalid = "RingStateInvalid"
    DeviceOutOfMemory = "DeviceOutOfMemory"
    DeviceCopyFailed = "DeviceCopyFailed"
    SequenceViolation = "SequenceViolation"
    HeaderMalformed = "HeaderMalformed"
    WorkerProcessExited = "WorkerProcessExited"
    WorkerShuttingDown = "WorkerShuttingDown"
    WorkerInternal = "WorkerInternal"


class ObjectFailure(enum.Enum):
    """Why an object record was rejected (spec §37)."""

    HeaderMalformed = "HeaderMalformed"
    UnsupportedObjectVersion = "UnsupportedObjectVersion"
    ExtentExceedsMax = "ExtentExceedsMax"
    ExtentAlignmentInvalid = "ExtentAlignmentInvalid"
    SequenceViolation = "SequenceViolation"
    DeviceAllocationFailed = "DeviceAllocationFailed"
    DeviceCopyFailed = "DeviceCopyFailed"
    EofMidObject = "EofMidObject"


class StepFailure(enum.Enum):
    """Why a step failed (spec §37; a step of a standing grant, `GrantSteps`)."""

    RoleUnavailable = "RoleUnavailable"
    InvalidInputHandle = "InvalidInputHandle"
    InvalidOutputRing = "InvalidOutputRing"
    TinygradError = "TinygradError"
    DeviceOutOfMemory = "DeviceOutOfMemory"
    OutputExtentInvalid = "OutputExtentInvalid"
    OutputCopyFailed = "OutputCopyFailed"
    WorkerProcessExited = "WorkerProcessExited"
    WorkerShuttingDown = "WorkerShuttingDown"


class WorkerFatalReason(enum.Enum):
    """Why a worker cannot continue (spec §37)."""

    ArenaMapFailed = "ArenaMapFailed"
    RingHelperAbiMismatch = "RingHelperAbiMismatch"
    BackendInitFailed = "BackendInitFailed"
    MalformedControlMessage = "MalformedControlMessage"
    UnhandledException = "UnhandledException"


class UninstallReason(enum.Enum):
    """Why a ring is uninstalled from the worker (spec §37)."""

    EdgeStopped = "EdgeStopped"
    RingFaulted = "RingFaulted"
    WorkerShutdown = "WorkerShutdown"


class WorkerStoppedReason(enum.Enum):
    """How a worker stopped (spec §37)."""

    Graceful = "Graceful"
    AbortInFlight = "AbortInFlight"
    Fatal = "Fatal"


class ShutdownMode(enum.Enum):
    """How ShutdownWorker asks the worker to stop (spec §29)."""

    Graceful = "Graceful"
    AbortInFlight = "AbortInFlight"


# --- reasons the spec leaves open ------------------------------------------------------


class StreamFaultReason(enum.Enum):
    """Why an edge stream or its connection failed (spec §24 StreamFault)."""

    PreambleTruncated = "PreambleTruncated"  #: stream ended inside the preamble
    PreambleGarbage = "PreambleGarbage"  #: bad preamble magic or non-zero reserved bits
    PreambleVersionUnsupported = "PreambleVersionUnsupported"  #: unknown preamble version
    UnknownEdge = "UnknownEdge"  #: preamble names an edge this node did not provision
    DuplicateStream = "DuplicateStream"  #: a second stream arrived for the same edge
    PeerNotAllowed = "PeerNotAllowed"  #: peer identity is not the edge's expected node
    HandshakeFailed = "HandshakeFailed"  #: TLS/QUIC handshake failed
    PeerReset = "PeerReset"  #: peer reset the stream
    ConnectionLost = "ConnectionLost"  #: QUIC connection closed or lost
    IdleTimeout = "IdleTimeout"  #: QUIC idle timeout
    EofMidObject = "EofMidObject"  #: stream finished inside an object record
    PumpFailed = "PumpFailed"  #: the pump task raised or its ring faulted


class RoleFailure(enum.Enum):
    """Why ConfigureRole failed (spec §30 RoleFailed)."""

    ConfigInvalid = "ConfigInvalid"
    WeightsDownloadFailed = "WeightsDownloadFailed"
    WeightsLoadFailed = "WeightsLoadFailed"
    WeightsBindFailed = "WeightsBindFailed"
    DeviceOutOfMemory = "DeviceOutOfMemory"
    TinygradError = "TinygradError"
    WorkerProcessExited = "WorkerProcessExited"
    WorkerShuttingDown = "WorkerShuttingDown"


class ReleaseFailure(enum.Enum):
    """Why ReleaseDeviceObject failed (spec §30 ReleaseFailed)."""

    UnknownHandle = "UnknownHandle"
    StaleGeneration = "StaleGeneration"
    StillReferenced = "StillReferenced"
    WorkerProcessExited = "WorkerProcessExited"
    WorkerShuttingDown = "WorkerShuttingDown"


class ArenaFailure(enum.Enum):
    """Arena boot and lease failures (spec §19)."""

    MemfdFailed = "MemfdFailed"
    TruncateFailed = "TruncateFailed"
    MmapFailed = "MmapFailed"
    SealFailed = "SealFailed"
    LeaseNeverFits = "LeaseNeverFits"  #: the request can never fit in the ceiling
    ShuttingDown = "ShuttingDown"  #: the manager rejects leases while shutting down
    PressureTimeout = "PressureTimeout"  #: a queued lease waited too long


class RunOutcome(enum.Enum):
    """The execution outcome of a run (spec §36, §38)."""

    Completed = "Completed"
    Faulted = "Faulted"
    OperatorStopped = "OperatorStopped"


class TeardownOutcome(enum.Enum):
    """The teardown outcome of a run, separate from its execution outcome (spec §38)."""

    Clean = "Clean"
    Faulted = "Faulted"
    TimedOut = "TimedOut"


class RunFaultReason(enum.Enum):
    """Every run-level fault source of spec §36, plus the orchestrator's two timeouts:
    ReadinessTimeout (no global readiness in time) and ProgressTimeout (no output object
    for the running step in time, spec §13 Running "timeout")."""

    NodeUnavailable = "NodeUnavailable"
    MembershipLost = "MembershipLost"
    ProvisioningRejected = "ProvisioningRejected"
    ArenaBootFailed = "ArenaBootFailed"
    RingRequestOversized = "RingRequestOversized"
    ArenaPressureTimeout = "ArenaPressureTimeout"
    WeightDownloadFailed = "WeightDownloadFailed"
    WeightLoadFailed = "WeightLoadFailed"
    WeightBindFailed = "WeightBindFailed"
    EdgeEstablishmentFailed = "EdgeEstablishmentFailed"
    ObjectHeaderMalformed = "ObjectHeaderMalformed"
    EofMidObject = "EofMidObject"
    StreamFault = "StreamFault"
    PumpFailed = "PumpFailed"
    RingFault = "RingFault"
    WorkerFatal = "WorkerFatal"
    WorkerCrashed = "WorkerCrashed"
    DeviceOutOfMemory = "DeviceOutOfMemory"
    DeviceCopyFailed = "DeviceCopyFailed"
    SequenceViolation = "SequenceViolation"
    StepFailed = "StepFailed"
    ReadinessTimeout = "ReadinessTimeout"
    ProgressTimeout = "ProgressTimeout"


OBJECT_FAULTS: dict[ObjectFailure, RunFaultReason] = {
    ObjectFailure.HeaderMalformed: RunFaultReason.ObjectHeaderMalformed,
    ObjectFailure.UnsupportedObjectVersion: RunFaultReason.ObjectHeaderMalformed,
    ObjectFailure.ExtentExceedsMax: RunFaultReason.ObjectHeaderMalformed,
    ObjectFailure.ExtentAlignmentInvalid: RunFaultReason.ObjectHeaderMalformed,
    ObjectFailure.SequenceViolation: RunFaultReason.SequenceViolation,
    ObjectFailure.DeviceAllocationFailed: RunFaultReason.DeviceOutOfMemory,
    ObjectFailure.DeviceCopyFailed: RunFaultReason.DeviceCopyFailed,
    ObjectFailure.EofMidObject: RunFaultReason.EofMidObject,
}
"""The §36 run-level reason of each §37 object failure on an edge (stage or token-out)."""


class Component(enum.Enum):
    """The component that detected a fault (spec §40); values are snake_case names."""

    Orchestrator = "orchestrator"
    Planner = "planner"
    TokenEndpoint = "token_endpoint"
    NodeBoot = "node_boot"
    Membership = "membership"
    StageController = "stage_controller"
    ArenaManager = "arena_manager"
    EdgeEstablisher = "edge_establisher"
    TxEdge = "tx_edge"
    RxEdge = "rx_edge"
    Driver = "driver"
    RecvPump = "recv_pump"
    SendPump = "send_pump"
    WorkerCtl = "worker_ctl"
    WorkerAdapter = "worker_adapter"
    Worker = "worker"
    IngressParser = "ingress_parser"
    EgressProducer = "egress_producer"
    DeviceBridge = "device_bridge"
    ModelLoader = "model_loader"
