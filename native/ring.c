/*
 * ring.c -- implementation of ring.h (theory of operation there).
 *
 * Shared fields are reached by byte offset from the header start (see the ABI table in
 * ring.h), as C11 _Atomic objects.  Own cursors are loaded relaxed (only this side ever
 * stores them); the peer's cursor is acquire-loaded and cached, and reloaded only when
 * the cached value is not enough to satisfy a request.
 */
#include "ring.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define OFF_MAGIC 0
#define OFF_VERSION 4
#define OFF_HEADER_LEN 6
#define OFF_RING_ID 8
#define OFF_CAPACITY 16

struct ring_offsets {
    uint32_t commit, consume, state, wake;
    uint16_t header_len;
};

static const struct ring_offsets OFFSETS_COMPACT = {24, 32, 40, 44, 64};
static const struct ring_offsets OFFSETS_SPLIT = {64, 128, 192, 196, 256};

struct ring_handle {
    uint8_t *data;
    uint64_t capacity;
    uint64_t ring_id;
    _Atomic uint64_t *commit;
    _Atomic uint64_t *consume;
    _Atomic uint32_t *state;
    _Atomic uint32_t *wake;
    uint64_t peer_commit;   /* consumer's cached view of commit */
    uint64_t peer_consume;  /* producer's cached view of consume */
};

static const struct ring_offsets *offsets_for(uint16_t version) {
    if (version == RING_VERSION_COMPACT) return &OFFSETS_COMPACT;
    if (version == RING_VERSION_SPLIT) return &OFFSETS_SPLIT;
    return NULL;
}

uint32_t ring_abi_version(void) { return RING_ABI_VERSION; }

uint16_t ring_header_len(uint16_t version) {
    const struct ring_offsets *o = offsets_for(version);
    return o ? o->header_len : 0;
}

static uint64_t min3(uint64_t a, uint64_t b, uint64_t c) {
    uint64_t m = a < b ? a : b;
    return m < c ? m : c;
}

/* A layout is valid when the header and data lie inside the lease, the lease inside
 * the arena, nothing overflows, and alignments hold.  header_len is checked by the
 * caller once the version is known. */
static int check_layout(uint64_t arena_len, const ring_layout *l) {
    uint64_t lease_end, data_end;
    if (l->alignment < RING_HEADER_ALIGN || (l->alignment & (l->alignment - 1)) != 0)
        return RING_E_LAYOUT;
    if (l->data_capacity == 0) return RING_E_LAYOUT;
    if (__builtin_add_overflow(l->arena_offset, l->total_len, &lease_end)) return RING_E_LAYOUT;
    if (lease_end > arena_len) return RING_E_LAYOUT;
    if (l->header_offset % RING_HEADER_ALIGN != 0) return RING_E_LAYOUT;
    if (l->data_offset % l->alignment != 0) return RING_E_LAYOUT;
    if (l->header_offset < l->arena_offset || l->data_offset < l->header_offset)
        return RING_E_LAYOUT;
    if (__builtin_add_overflow(l->data_offset, l->data_capacity, &data_end)) return RING_E_LAYOUT;
    if (data_end > lease_end) return RING_E_LAYOUT;
    return RING_OK;
}

static int check_header_room(const ring_layout *l, uint16_t header_len) {
    return l->data_offset - l->header_offset >= header_len ? RING_OK : RING_E_LAYOUT;
}

int ring_init(uint8_t *arena_base, uint64_t arena_len, const ring_layout *layout,
              uint16_t version) {
    const struct ring_offsets *o = offsets_for(version);
    uint8_t *hdr;
    int rc;
    if (!o) return RING_E_VERSION;
    if ((rc = check_layout(arena_len, layout)) != RING_OK) return rc;
    if ((rc = check_header_room(layout, o->header_len)) != RING_OK) return rc;
    hdr = arena_base + layout->header_offset;
    memset(hdr, 0, o->header_len);
    memcpy(hdr + OFF_VERSION, &version, sizeof version);
    memcpy(hdr + OFF_HEADER_LEN, &o->header_len, sizeof o->header_len);
    memcpy(hdr + OFF_RING_ID, &layout->ring_id, sizeof layout->ring_id);
    memcpy(hdr + OFF_CAPACITY, &layout->data_capacity, sizeof layout->data_capacity);
    atomic_store_explicit((_Atomic uint64_t *)(hdr + o->commit), 0, memory_order_relaxed);
    atomic_store_explicit((_Atomic uint64_t *)(hdr + o->consume), 0, memory_order_relaxed);
    atomic_store_explicit((_Atomic uint32_t *)(hdr + o->wake), 0, memory_order_relaxed);
    atomic_store_explicit((_Atomic uint32_t *)(hdr + o->state), RING_STATE_OPEN,
                          memory_order_relaxed);
    /* The magic goes last, published with release: a header with the magic is whole. */
    atomic_store_explicit((_Atomic uint32_t *)(hdr + OFF_MAGIC), RING_MAGIC,
                          memory_order_release);
    return RING_OK;
}

int ring_open(uint8_t *arena_base, uint64_t arena_len, const ring_layout *layout,
              ring_handle **out) {
    const struct ring_offsets *o;
    uint8_t *hdr;
    uint32_t magic;
    uint16_t version, header_len;
    uint64_t ring_id, capacity;
    ring_handle *h;
    int rc;
    *out = NULL;
    if ((rc = check_layout(arena_len, layout)) != RING_OK) return rc;
    if (layout->data_offset - layout->header_offset < RING_HEADER_ALIGN) return RING_E_LAYOUT;
    hdr = arena_base + layout->header_offset;
    magic = atomic_load_explicit((_Atomic uint32_t *)(hdr + OFF_MAGIC), memory_order_acquire);
    memcpy(&version, hdr + OFF_VERSION, sizeof version);
    memcpy(&header_len, hdr + OFF_HEADER_LEN, sizeof header_len);
    if (magic != RING_MAGIC || (o = offsets_for(version)) == NULL) return RING_E_VERSION;
    if (header_len != o->header_len) return RING_E_VERSION;
    if ((rc = check_header_room(layout, header_len)) != RING_OK) return rc;
    memcpy(&ring_id, hdr + OFF_RING_ID, sizeof ring_id);
    memcpy(&capacity, hdr + OFF_CAPACITY, sizeof capacity);
    if (ring_id != layout->ring_id || capacity != layout->data_capacity) return RING_E_LAYOUT;
    h = calloc(1, sizeof *h);
    if (!h) return RING_E_NOMEM;
    h->data = arena_base + layout->data_offset;
    h->capacity = capacity;
    h->ring_id = ring_id;
    h->commit = (_Atomic uint64_t *)(hdr + o->commit);
    h->consume = (_Atomic uint64_t *)(hdr + o->consume);
    h->state = (_Atomic uint32_t *)(hdr + o->state);
    h->wake = (_Atomic uint32_t *)(hdr + o->wake);
    h->peer_commit = atomic_load_explicit(h->commit, memory_order_acquire);
    h->peer_consume = atomic_load_explicit(h->consume, memory_order_acquire);
    *out = h;
    return RING_OK;
}

void ring_close(ring_handle *h) { free(h); }

static void fault_state_invalid(ring_handle *h) {
    ring_fault(h, RING_REASON_STATE_INVALID);
}

uint64_t ring_readable_span(ring_handle *h, uint64_t max_len, uint64_t *data_offset) {
    uint64_t consume = atomic_load_explicit(h->consume, memory_order_relaxed);
    uint64_t phys = consume % h->capacity;
    uint64_t contig = h->capacity - phys;
    uint64_t want = max_len < contig ? max_len : contig;
    if (h->peer_commit - consume < want || h->peer_commit < consume)
        h->peer_commit = atomic_load_explicit(h->commit, memory_order_acquire);
    *data_offset = phys;
    if (h->peer_commit < consume || h->peer_commit - consume > h->capacity) {
        fault_state_invalid(h);
        return 0;
    }
    return min3(h->peer_commit - consume, contig, max_len);
}

int ring_advance_consume(ring_handle *h, uint64_t n) {
    uint64_t consume = atomic_load_explicit(h->consume, memory_order_relaxed);
    if (h->peer_commit - consume < n || h->peer_commit < consume)
        h->peer_commit = atomic_load_explicit(h->commit, memory_order_acquire);
    if (h->peer_commit < consume || h->peer_commit - consume < n) return RING_E_RANGE;
    atomic_store_explicit(h->consume, consume + n, memory_order_release);
    return RING_OK;
}

uint64_t ring_writable_span(ring_handle *h, uint64_t max_len, uint64_t *data_offset) {
    uint64_t commit = atomic_load_explicit(h->commit, memory_order_relaxed);
    uint64_t phys = commit % h->capacity;
    uint64_t contig = h->capacity - phys;
    uint64_t want = max_len < contig ? max_len : contig;
    uint64_t used = commit - h->peer_consume;
    if (commit < h->peer_consume || used > h->capacity || h->capacity - used < want) {
        h->peer_consume = atomic_load_explicit(h->consume, memory_order_acquire);
        used = commit - h->peer_consume;
    }
    *data_offset = phys;
    if (commit < h->peer_consume || used > h->capacity) {
        fault_state_invalid(h);
        return 0;
    }
    return min3(h->capacity - used, contig, max_len);
}

int ring_advance_commit(ring_handle *h, uint64_t n) {
    uint64_t commit = atomic_load_explicit(h->commit, memory_order_relaxed);
    uint64_t used = commit - h->peer_consume;
    if (commit < h->peer_consume || used > h->capacity || h->capacity - used < n) {
        h->peer_consume = atomic_load_explicit(h->consume, memory_order_acquire);
        used = commit - h->peer_consume;
    }
    if (commit < h->peer_consume || used > h->capacity || h->capacity - used < n)
        return RING_E_RANGE;
    atomic_store_explicit(h->commit, commit + n, memory_order_release);
    return RING_OK;
}

int ring_commit_mark(ring_handle *h, uint64_t n) {
    int rc = ring_advance_commit(h, n);
    return rc != RING_OK ? rc : ring_mark_pending(h, RING_WAKE_READABLE);
}

int ring_consume_mark(ring_handle *h, uint64_t n) {
    int rc = ring_advance_consume(h, n);
    return rc != RING_OK ? rc : ring_mark_pending(h, RING_WAKE_WRITABLE);
}

uint64_t ring_write(ring_handle *h, const uint8_t *src, uint64_t len, int *wake) {
    uint64_t done = 0, off, n;
    *wake = 0;
    while (done < len && (n = ring_writable_span(h, len - done, &off)) > 0) {
        memcpy(h->data + off, src + done, n);
        atomic_store_explicit(h->commit, atomic_load_explicit(h->commit, memory_order_relaxed) + n,
                              memory_order_release);
        done += n;
    }
    if (done > 0) *wake = ring_mark_pending(h, RING_WAKE_READABLE);
    return done;
}

uint64_t ring_read(ring_handle *h, uint8_t *dst, uint64_t len, int *wake) {
    uint64_t done = 0, off, n;
    *wake = 0;
    while (done < len && (n = ring_readable_span(h, len - done, &off)) > 0) {
        memcpy(dst + done, h->data + off, n);
        atomic_store_explicit(h->consume,
                              atomic_load_explicit(h->consume, memory_order_relaxed) + n,
                              memory_order_release);
        done += n;
    }
    if (done > 0) *wake = ring_mark_pending(h, RING_WAKE_WRITABLE);
    return done;
}

uint32_t ring_state(ring_handle *h) {
    return atomic_load_explicit(h->state, memory_order_acquire);
}

int ring_close_producer(ring_handle *h) {
    uint32_t expected = RING_STATE_OPEN;
    if (atomic_compare_exchange_strong_explicit(h->state, &expected, RING_STATE_CLOSED,
                                                memory_order_acq_rel, memory_order_acquire))
        return RING_OK;
    return (expected & 0xffu) == RING_STATE_CLOSED ? RING_OK : RING_E_STATE;
}

int ring_fault(ring_handle *h, uint32_t reason) {
    uint32_t cur = atomic_load_explicit(h->state, memory_order_acquire);
    uint32_t next = RING_STATE_FAULTED | ((reason & 0xffu) << 8);
    while ((cur & 0xffu) != RING_STATE_FAULTED) {
        if (atomic_compare_exchange_weak_explicit(h->state, &cur, next, memory_order_acq_rel,
                                                  memory_order_acquire))
            return RING_OK;
    }
    return RING_E_STATE;
}

int ring_mark_pending(ring_handle *h, uint32_t bit) {
    return (atomic_fetch_or_explicit(h->wake, bit, memory_order_acq_rel) & bit) == 0;
}

void ring_clear_pending(ring_handle *h, uint32_t bit) {
    atomic_fetch_and_explicit(h->wake, ~bit, memory_order_acq_rel);
}

uint32_t ring_wake_word(ring_handle *h) {
    return atomic_load_explicit(h->wake, memory_order_acquire);
}

uint64_t ring_commit(ring_handle *h) {
    return atomic_load_explicit(h->commit, memory_order_acquire);
}

uint64_t ring_consume(ring_handle *h) {
    return atomic_load_explicit(h->consume, memory_order_acquire);
}

uint64_t ring_capacity(ring_handle *h) { return h->capacity; }
uint64_t ring_id(ring_handle *h) { return h->ring_id; }
uint8_t *ring_data(ring_handle *h) { return h->data; }
