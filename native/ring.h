/*
 * ring.h -- swactor's shared-memory SPSC byte ring (spec section 20-22).
 *
 * Theory of operation
 * -------------------
 * A ring lives inside one lease of the node's memfd arena: a header followed (at
 * `data_offset`) by `capacity` payload bytes.  Every process maps the arena at its own
 * address, so the shared bytes hold only offsets, cursors, state bits and wake bits,
 * never pointers.  A `ring_handle` is process-local: arena base + layout offsets, plus a
 * cached copy of the peer's cursor.
 *
 * Cursors are monotonic logical byte positions (u64; they never wrap in practice:
 * 2^64 bytes).  The producer owns `commit`, the consumer owns `consume`:
 *
 *     readable   = consume .. commit         physical index = cursor % capacity
 *     free       = capacity - (commit - consume)
 *
 * The producer writes bytes into a writable span, then publishes `commit` with a
 * release store; the consumer acquire-loads `commit` before reading.  Symmetrically the
 * consumer release-stores `consume` after it no longer needs the bytes and the producer
 * acquire-loads it before computing free space.  The producer's local `write` cursor of
 * the spec equals `commit` between calls: `ring_writable_span` reserves nothing, and
 * `ring_advance_commit` reserves and publishes in one step.
 *
 * Wake word (spec section 21): bit RING_WAKE_READABLE / RING_WAKE_WRITABLE is a
 * "pending" bit.  After publishing, a side calls `ring_mark_pending`; it returns 1 only
 * when the bit was clear, and only then must a wake hint (doorbell) be sent.  The
 * waiter clears the bit *before* re-reading the cursors.  Both operations are
 * acq_rel read-modify-writes of the same word, so either the waiter's clear comes after
 * the producer's mark (and then its cursor reload sees the new cursor), or before it
 * (and then the mark sees a clear bit and sends a wake): the only empty->readable or
 * full->writable transition cannot be lost.
 *
 * Header ABI (little-endian, 64-byte aligned; header_len bytes long):
 *
 *   version 1 (RING_VERSION_COMPACT, header_len 64): exactly the spec's field order
 *     0 magic u32 | 4 version u16 | 6 header_len u16 | 8 ring_id u64 | 16 capacity u64
 *     24 commit u64 | 32 consume u64 | 40 state u32 | 44 wake u32 | 48..63 zero
 *   version 2 (RING_VERSION_SPLIT, header_len 256): same fields, same order, but
 *     commit, consume and state+wake each on their own 64-byte cache line
 *     0 magic | 4 version | 6 header_len | 8 ring_id | 16 capacity | 24..63 zero
 *     64 commit u64 | 128 consume u64 | 192 state u32 | 196 wake u32 | 200..255 zero
 *
 * State word: low byte RING_STATE_OPEN / _CLOSED (producer EOF; committed bytes stay
 * readable) / _FAULTED; bits 8..15 the fault reason code (spec section 37
 * RingFaultReason, numbered from 1 in spec order).  The first fault wins.
 *
 * A handle must be used by one thread at a time (it caches the peer cursor); each side
 * opens its own handle.  If a peer corrupts the cursors (consume > commit or
 * commit - consume > capacity), the operation faults the ring with RingStateInvalid and
 * reports an empty span.
 */
#ifndef SWACTOR_RING_H
#define SWACTOR_RING_H

#include <stdint.h>

#define RING_ABI_VERSION 1          /* bump on any change of this header's ABI */
#define RING_MAGIC 0x47525753u      /* "SWRG" in memory order */
#define RING_VERSION_COMPACT 1
#define RING_VERSION_SPLIT 2
#define RING_HEADER_ALIGN 64

#define RING_OK 0
#define RING_E_VERSION -1           /* bad magic or version: UnsupportedRingVersion */
#define RING_E_LAYOUT -2            /* offsets, alignment or capacity: RingLayoutInvalid */
#define RING_E_RANGE -3             /* advance beyond the span that is available */
#define RING_E_STATE -4             /* state transition not allowed (e.g. close a faulted ring) */
#define RING_E_NOMEM -5

#define RING_STATE_OPEN 1
#define RING_STATE_CLOSED 2
#define RING_STATE_FAULTED 3

#define RING_REASON_STATE_INVALID 3  /* spec section 37 RingFaultReason::RingStateInvalid */

#define RING_WAKE_READABLE 1
#define RING_WAKE_WRITABLE 2

/* Arena-relative layout (spec section 18): every offset counts from the arena base. */
typedef struct ring_layout {
    uint64_t ring_id;
    uint64_t arena_offset;   /* start of the lease */
    uint64_t total_len;      /* length of the lease */
    uint64_t header_offset;  /* header start, inside the lease, 64-byte aligned */
    uint64_t data_offset;    /* data start, inside the lease, aligned to `alignment` */
    uint64_t data_capacity;  /* payload bytes */
    uint32_t alignment;      /* power of two, >= 64 */
} ring_layout;

typedef struct ring_handle ring_handle;

uint32_t ring_abi_version(void);
uint16_t ring_header_len(uint16_t version);   /* 0 for an unknown version */

/* Owner side: check the layout, then write a fresh header (cursors 0, state Open). */
int ring_init(uint8_t *arena_base, uint64_t arena_len, const ring_layout *layout,
              uint16_t version);
/* Either side: check the layout and the header, then allocate a handle. */
int ring_open(uint8_t *arena_base, uint64_t arena_len, const ring_layout *layout,
              ring_handle **out);
void ring_close(ring_handle *h);

/* Spans: return the length and set *data_offset to the span's offset from the data
 * start (the span's address is data base + *data_offset).  max_len caps the length. */
uint64_t ring_readable_span(ring_handle *h, uint64_t max_len, uint64_t *data_offset);
int ring_advance_consume(ring_handle *h, uint64_t n);
uint64_t ring_writable_span(ring_handle *h, uint64_t max_len, uint64_t *data_offset);
int ring_advance_commit(ring_handle *h, uint64_t n);

uint32_t ring_state(ring_handle *h);             /* whole state word */
int ring_close_producer(ring_handle *h);         /* Open -> Closed */
int ring_fault(ring_handle *h, uint32_t reason); /* -> Faulted(reason); first wins */

/* Fused hot-path forms: advance, then mark the peer's pending bit.  Return 1 when the
 * caller must send the wake hint (the bit was clear), 0 when not, or a RING_E_ code. */
int ring_commit_mark(ring_handle *h, uint64_t n);    /* advance_commit + mark READABLE */
int ring_consume_mark(ring_handle *h, uint64_t n);   /* advance_consume + mark WRITABLE */

/* Copying forms for callers that hold the bytes elsewhere (a pump's socket buffer, a
 * host staging buffer): copy up to len bytes across the wrap, publish them, and mark the
 * peer's pending bit.  Return the bytes moved (0 when full / empty); *wake is set to 1
 * when the caller must send the hint. */
uint64_t ring_write(ring_handle *h, const uint8_t *src, uint64_t len, int *wake);
uint64_t ring_read(ring_handle *h, uint8_t *dst, uint64_t len, int *wake);

int ring_mark_pending(ring_handle *h, uint32_t bit);  /* 1 when the bit was clear */
void ring_clear_pending(ring_handle *h, uint32_t bit);
uint32_t ring_wake_word(ring_handle *h);

uint64_t ring_commit(ring_handle *h);    /* acquire loads, for tests and metrics */
uint64_t ring_consume(ring_handle *h);
uint64_t ring_capacity(ring_handle *h);
uint64_t ring_id(ring_handle *h);
uint8_t *ring_data(ring_handle *h);      /* process-local data base */

#endif
