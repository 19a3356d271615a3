/*
 * replay_stress.c -- the replay pool under ThreadSanitizer (see the justfile's
 * test-native recipe).
 *
 * A chain of kernels over float buffers, as a decode step is: sliced kernels each write
 * their slice's rows of one buffer from every row of the previous buffer (so a slice
 * that ran before the previous kernel finished reads a half-written buffer), and
 * single-slice kernels in between reduce a whole buffer.  Each replay gets new inputs;
 * every replay's result must equal the same table walked on one thread, bit for bit, for
 * pools of 1..4 workers, with the caller claiming slices and with every slice left to
 * the workers (REPLAY_SHARE_ALL), and with a spin of 0 (every wait sleeps on a futex).
 * ThreadSanitizer reports any access the pool's atomics do not order.  A lost wake-up
 * hangs, which alarm() turns into a failure.
 *
 * usage: replay_stress [replays]       exit 0 on success
 */
#include "replay.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N 96        /* rows per buffer */
#define SLICES 6    /* slices of a sliced kernel */
#define STAGES 8    /* sliced kernels in the chain */
#define WIDTH 4
#define STRIDE (WIDTH + 1)

typedef uint64_t u64;

static float bufs[STAGES + 1][N];
static float sums[STAGES];

/* rows [core * N / SLICES, ...) of out = mix of every row of in */
static void sliced(u64 out, u64 in, u64 salt, u64 core) {
    float *o = (float *)(uintptr_t)out;
    const float *x = (const float *)(uintptr_t)in;
    for (int r = (int)core * N / SLICES; r < ((int)core + 1) * N / SLICES; r++) {
        float acc = 0.0f;
        for (int k = 0; k < N; k++)
            acc += x[k] * (float)((r * 31 + k * 17 + (int)salt) % 13 - 6) * 0.01f;
        o[r] = acc;
    }
}

/* sum of a whole buffer, added back into its first row (the next kernel reads it) */
static void reduce(u64 buf, u64 sum, u64 unused1, u64 unused2) {
    (void)unused1;
    (void)unused2;
    float *b = (float *)(uintptr_t)buf;
    float acc = 0.0f;
    for (int k = 0; k < N; k++)
        acc += b[k];
    *(float *)(uintptr_t)sum = acc;
    b[0] += acc * 0.001f;
}

static u64 table[STAGES * (SLICES + 1)][STRIDE];
static int64_t kernels[STAGES * 2][2];
static int64_t rows, count;

static void build(void) {
    rows = count = 0;
    for (int s = 0; s < STAGES; s++) {
        kernels[count][0] = rows;
        kernels[count][1] = SLICES;
        count++;
        for (int c = 0; c < SLICES; c++) {
            u64 *row = table[rows++];
            row[0] = (u64)(uintptr_t)sliced;
            row[1] = (u64)(uintptr_t)bufs[s + 1];
            row[2] = (u64)(uintptr_t)bufs[s];
            row[3] = (u64)s;
            row[4] = (u64)c;
        }
        kernels[count][0] = rows;
        kernels[count][1] = 1;
        count++;
        u64 *row = table[rows++];
        row[0] = (u64)(uintptr_t)reduce;
        row[1] = (u64)(uintptr_t)bufs[s + 1];
        row[2] = (u64)(uintptr_t)&sums[s];
        row[3] = row[4] = 0;
    }
}

static void inputs(unsigned replay) {
    for (int k = 0; k < N; k++)
        bufs[0][k] = (float)((k * 7 + replay * 13) % 29) - 14.0f;
}

static int check(replay_pool *pool, int flags, unsigned replays) {
    float want[N];
    u64 trace[STAGES * (SLICES + 1)][REPLAY_TRACE_WORDS];
    for (unsigned r = 0; r < replays; r++) {
        inputs(r);
        if (replay_run(NULL, &table[0][0], rows, STRIDE, &kernels[0][0], count, 0, NULL))
            return 1;
        memcpy(want, bufs[STAGES], sizeof(want));
        inputs(r);
        memset(trace, 0, sizeof(trace));
        if (replay_run(pool, &table[0][0], rows, STRIDE, &kernels[0][0], count, flags,
                       r % 4 == 0 ? &trace[0][0] : NULL))
            return 1;
        if (memcmp(want, bufs[STAGES], sizeof(want)) != 0) {
            fprintf(stderr, "replay %u (workers %d, flags %d): result differs\n", r,
                    replay_pool_workers(pool), flags);
            return 1;
        }
        if (r % 4 == 0) {
            u64 previous_end = 0;
            for (int64_t k = 0; k < count; k++) {
                u64 first_start = UINT64_MAX, last_end = 0;
                for (int64_t i = kernels[k][0]; i < kernels[k][0] + kernels[k][1]; i++) {
                    if (trace[i][2] != 1) {
                        fprintf(stderr, "row %lld ran %llu times\n", (long long)i,
                                (unsigned long long)trace[i][2]);
                        return 1;
                    }
                    if ((flags & REPLAY_SHARE_ALL) && kernels[k][1] > 1 && trace[i][3] == 0) {
                        fprintf(stderr, "row %lld ran on the caller\n", (long long)i);
                        return 1;
                    }
                    first_start = trace[i][0] < first_start ? trace[i][0] : first_start;
                    last_end = trace[i][1] > last_end ? trace[i][1] : last_end;
                }
                if (first_start < previous_end) {
                    fprintf(stderr, "kernel %lld started before the one before ended\n",
                            (long long)k);
                    return 1;
                }
                previous_end = last_end;
            }
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    unsigned replays = argc > 1 ? (unsigned)atoi(argv[1]) : 200;
    alarm(120);
    build();
    int64_t bad[1][2] = {{0, SLICES + 100}};
    if (replay_run(NULL, &table[0][0], rows, STRIDE, &bad[0][0], 1, 0, NULL) != -1 ||
        replay_run(NULL, &table[0][0], rows, 7, &kernels[0][0], count, 0, NULL) != -1) {
        fprintf(stderr, "a bad table was accepted\n");
        return 1;
    }
    for (int workers = 0; workers <= 4; workers++) {
        for (int spin = 0; spin < 2; spin++) {
            replay_pool *pool = replay_pool_new(workers, spin ? 50000 : 0);
            if (pool == NULL) {
                fprintf(stderr, "replay_pool_new(%d) failed\n", workers);
                return 1;
            }
            int failed = check(pool, 0, replays) ||
                         (workers > 0 && check(pool, REPLAY_SHARE_ALL, replays));
            replay_pool_free(pool);
            if (failed)
                return 1;
        }
    }
    printf("replay_stress: ok (%u replays x 0..4 workers x 2 spins)\n", replays);
    return 0;
}
