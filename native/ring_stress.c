/*
 * ring_stress.c -- two-thread stress test of the ring helper, meant to be built with
 * -fsanitize=thread (see the justfile's test-native recipe).
 *
 * A producer thread streams `total` bytes of a position-derived pattern through a small
 * ring of odd capacity (so spans wrap at every possible phase) in random-length spans;
 * a consumer thread reads random-length spans and checks every byte against the
 * pattern, so an unwritten or overwritten byte is caught.  Blocking uses the wake
 * protocol of ring.h: a side that finds no span clears its pending bit, re-checks, and
 * only then sleeps on a semaphore; the peer posts the semaphore only when
 * ring_mark_pending says the bit was clear.  A lost wake-up hangs, which alarm() turns
 * into a failure.  Every third step uses the copying calls (ring_write / ring_read)
 * instead of spans.  Each header version is exercised.
 *
 * usage: ring_stress [total_bytes] [capacity]       exit 0 on success
 */
#include "ring.h"

#include <semaphore.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct side {
    ring_handle *h;
    sem_t *my_wake;    /* posted when my pending bit goes clear -> set */
    sem_t *peer_wake;
    uint64_t total;
    uint64_t seed;
    uint64_t wraps;
    int failed;
};

static uint8_t pattern(uint64_t pos) { return (uint8_t)(pos * 131u + (pos >> 9)); }

static uint64_t xorshift(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void *producer(void *arg) {
    struct side *s = arg;
    uint64_t pos = 0, off, step = 0;
    uint8_t *tmp = malloc(2 * ring_capacity(s->h));
    while (pos < s->total) {
        uint64_t want = 1 + xorshift(&s->seed) % (2 * ring_capacity(s->h));
        if (++step % 3 == 0) { /* copying form */
            int wake;
            uint64_t n;
            if (want > s->total - pos) want = s->total - pos;
            for (uint64_t i = 0; i < want; i++) tmp[i] = pattern(pos + i);
            n = ring_write(s->h, tmp, want, &wake);
            if (wake) sem_post(s->peer_wake);
            pos += n;
            if (n == 0) {
                ring_clear_pending(s->h, RING_WAKE_WRITABLE);
                if (ring_writable_span(s->h, 1, &off) == 0) sem_wait(s->my_wake);
            }
            continue;
        }
        uint64_t n = ring_writable_span(s->h, want, &off);
        if (n == 0) {
            ring_clear_pending(s->h, RING_WAKE_WRITABLE);
            n = ring_writable_span(s->h, want, &off);
            if (n == 0) {
                sem_wait(s->my_wake);
                continue;
            }
        }
        if (n > s->total - pos) n = s->total - pos;
        uint8_t *p = ring_data(s->h) + off;
        for (uint64_t i = 0; i < n; i++) p[i] = pattern(pos + i);
        if (off + n == ring_capacity(s->h)) s->wraps++;
        if (ring_advance_commit(s->h, n) != RING_OK) { s->failed = 1; break; }
        pos += n;
        if (ring_mark_pending(s->h, RING_WAKE_READABLE)) sem_post(s->peer_wake);
    }
    free(tmp);
    ring_close_producer(s->h);
    if (ring_mark_pending(s->h, RING_WAKE_READABLE)) sem_post(s->peer_wake);
    return NULL;
}

static int check(struct side *s, const uint8_t *p, uint64_t pos, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) {
        if (p[i] != pattern(pos + i)) {
            fprintf(stderr, "byte %llu: got %u want %u\n", (unsigned long long)(pos + i), p[i],
                    pattern(pos + i));
            s->failed = 1;
            return 0;
        }
    }
    return 1;
}

static void *consumer(void *arg) {
    struct side *s = arg;
    uint64_t pos = 0, off, step = 0;
    uint8_t *tmp = malloc(2 * ring_capacity(s->h));
    for (;;) {
        uint64_t want = 1 + xorshift(&s->seed) % (2 * ring_capacity(s->h));
        if (++step % 3 == 0) { /* copying form */
            int wake;
            uint64_t n = ring_read(s->h, tmp, want, &wake);
            if (wake) sem_post(s->peer_wake);
            if (n > 0) {
                if (!check(s, tmp, pos, n)) break;
                pos += n;
                continue;
            }
            ring_clear_pending(s->h, RING_WAKE_READABLE);
            uint32_t state = ring_state(s->h) & 0xffu;
            if (ring_readable_span(s->h, 1, &off) == 0) {
                if (state == RING_STATE_CLOSED) break;
                sem_wait(s->my_wake);
            }
            continue;
        }
        uint64_t n = ring_readable_span(s->h, want, &off);
        if (n == 0) {
            ring_clear_pending(s->h, RING_WAKE_READABLE);
            uint32_t state = ring_state(s->h) & 0xffu;
            n = ring_readable_span(s->h, want, &off);
            if (n == 0) {
                if (state == RING_STATE_CLOSED) break;
                sem_wait(s->my_wake);
                continue;
            }
        }
        if (!check(s, ring_data(s->h) + off, pos, n)) break;
        if (ring_advance_consume(s->h, n) != RING_OK) { s->failed = 1; break; }
        pos += n;
        if (ring_mark_pending(s->h, RING_WAKE_WRITABLE)) sem_post(s->peer_wake);
    }
    free(tmp);
    if (pos != s->total) {
        fprintf(stderr, "consumer got %llu of %llu bytes\n", (unsigned long long)pos,
                (unsigned long long)s->total);
        s->failed = 1;
    }
    return NULL;
}

static int run(uint16_t version, uint64_t total, uint64_t capacity) {
    uint64_t header_len = ring_header_len(version);
    uint64_t data_offset = 4096 + ((header_len + 63) / 64) * 64;
    uint64_t arena_len = data_offset + capacity + 4096;
    uint8_t *arena = aligned_alloc(4096, (arena_len + 4095) / 4096 * 4096);
    ring_layout layout = {7, 4096, arena_len - 4096, 4096, data_offset, capacity, 64};
    ring_handle *ph, *ch;
    sem_t to_producer, to_consumer;
    struct side p = {0}, c = {0};
    pthread_t pt, ct;
    int rc;
    if (!arena) return 1;
    memset(arena, 0xee, arena_len);
    if ((rc = ring_init(arena, arena_len, &layout, version)) != RING_OK ||
        (rc = ring_open(arena, arena_len, &layout, &ph)) != RING_OK ||
        (rc = ring_open(arena, arena_len, &layout, &ch)) != RING_OK) {
        fprintf(stderr, "init/open failed: %d\n", rc);
        return 1;
    }
    sem_init(&to_producer, 0, 0);
    sem_init(&to_consumer, 0, 0);
    p = (struct side){ph, &to_producer, &to_consumer, total, 0x9e3779b97f4a7c15ull, 0, 0};
    c = (struct side){ch, &to_consumer, &to_producer, total, 0xd1b54a32d192ed03ull, 0, 0};
    pthread_create(&pt, NULL, producer, &p);
    pthread_create(&ct, NULL, consumer, &c);
    pthread_join(pt, NULL);
    pthread_join(ct, NULL);
    printf("version %u: %llu bytes through a %llu-byte ring, %llu wraps, %s\n", version,
           (unsigned long long)total, (unsigned long long)capacity,
           (unsigned long long)p.wraps, p.failed || c.failed ? "FAILED" : "ok");
    rc = p.failed || c.failed || p.wraps < 100 || ring_commit(ph) != total ||
         ring_consume(ch) != total;
    ring_close(ph);
    ring_close(ch);
    sem_destroy(&to_producer);
    sem_destroy(&to_consumer);
    free(arena);
    return rc;
}

int main(int argc, char **argv) {
    uint64_t total = argc > 1 ? strtoull(argv[1], NULL, 0) : (32u << 20);
    uint64_t capacity = argc > 2 ? strtoull(argv[2], NULL, 0) : 4099;
    alarm(120);  /* a lost wake-up hangs; turn it into a failure */
    if (ring_abi_version() != RING_ABI_VERSION) return 1;
    if (run(RING_VERSION_COMPACT, total, capacity)) return 1;
    if (run(RING_VERSION_SPLIT, total, capacity)) return 1;
    return 0;
}
