/*
 * replay.c -- the kernel replay pool of replay.h (read its theory of operation first).
 */
#define _GNU_SOURCE
#include "replay.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef uint64_t u64;

#define ROW_BITS 24
#define ROW_MASK ((u64)REPLAY_MAX_ROWS)
#define LINE 64
#define SPIN_CHECK 64 /* pause iterations between clock reads */
#define BACKOFF_MAX 64 /* most replays run on the caller alone after a stall */
#define STALL_NS 1000000u

/* ------------------------------------------------------------------ calling a row */

#define P4 u64, u64, u64, u64
#define P8 P4, P4
#define P16 P8, P8
#define P32 P16, P16
#define P64 P32, P32
#define A4(o) row[(o) + 1], row[(o) + 2], row[(o) + 3], row[(o) + 4]
#define A8(o) A4(o), A4((o) + 4)
#define A16(o) A8(o), A8((o) + 8)
#define A32(o) A16(o), A16((o) + 16)
#define A64(o) A32(o), A32((o) + 32)

typedef void (*kernel4)(P4);
typedef void (*kernel8)(P8);
typedef void (*kernel16)(P16);
typedef void (*kernel32)(P32);
typedef void (*kernel64)(P64);

/* Call one row's kernel with its stride - 1 argument words (the callee reads the ones it
 * declares: extra trailing integer arguments are ignored under SysV x86-64 and AAPCS64). */
static void call_row(const u64 *row, int64_t stride) {
    switch (stride - 1) {
    case 4: ((kernel4)(uintptr_t)row[0])(A4(0)); break;
    case 8: ((kernel8)(uintptr_t)row[0])(A8(0)); break;
    case 16: ((kernel16)(uintptr_t)row[0])(A16(0)); break;
    case 32: ((kernel32)(uintptr_t)row[0])(A32(0)); break;
    default: ((kernel64)(uintptr_t)row[0])(A64(0)); break;
    }
}

static int stride_ok(int64_t stride) {
    int64_t w = stride - 1;
    return w == 4 || w == 8 || w == 16 || w == 32 || w == 64;
}

static u64 now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (u64)ts.tv_sec * 1000000000u + (u64)ts.tv_nsec;
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void futex_wait(_Atomic uint32_t *word, uint32_t seen) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *word, int count) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
}

/* ------------------------------------------------------------------ the pool */

struct job {
    _Atomic(const u64 *) rows; /* the kernel's first row */
    _Atomic u64 count;
    _Atomic int64_t stride;
    _Atomic(u64 *) trace; /* the first row's trace words, or NULL */
};

struct worker {
    struct replay_pool *pool;
    uint32_t index; /* 1.. (0 is the caller) */
};

struct replay_pool {
    _Alignas(LINE) _Atomic u64 ticket;      /* generation << ROW_BITS | next row */
    _Alignas(LINE) _Atomic uint32_t done;   /* rows finished by workers (caller's futex) */
    _Atomic uint32_t caller_sleeping;
    _Alignas(LINE) _Atomic uint32_t wake;   /* bumped to wake sleeping workers (their futex) */
    _Atomic uint32_t sleepers;
    _Atomic uint32_t stop;
    _Alignas(LINE) struct job jobs[2];      /* by generation parity */
    _Atomic u64 seq;                        /* trace order counter */
    _Atomic u64 worker_rows;                /* rows the workers ran (statistics) */
    _Alignas(LINE) u64 generation;          /* the caller's, under lock */
    u64 stalls;                             /* this replay's: the caller slept on a row */
    u64 backoff, cooldown;                  /* replays to run on the caller alone */
    u64 stats[REPLAY_STATS];
    pthread_mutex_t lock;
    int64_t spin_ns;
    int workers;
    int started;
    pthread_t *threads;
    struct worker *args;
};

/* Run one row, with its trace words when tracing. */
static void run_row(const u64 *row, int64_t stride, u64 *trace, _Atomic u64 *seq,
                      uint32_t thread) {
    if (trace == NULL) {
        call_row(row, stride);
        return;
    }
    u64 t0 = now_ns();
    u64 start = atomic_fetch_add_explicit(seq, 1, memory_order_relaxed) + 1;
    call_row(row, stride);
    u64 end = atomic_fetch_add_explicit(seq, 1, memory_order_relaxed) + 1;
    trace[0] = start;
    trace[1] = end;
    trace[2] += 1;
    trace[3] = thread;
    trace[4] = now_ns() - t0;
}

/* A worker's claim on ticket value `t`: 1 ran a row, 0 lost a race (look again),
 * -1 nothing to claim. */
static int try_claim(struct replay_pool *p, u64 t, uint32_t thread) {
    struct job *job = &p->jobs[(t >> ROW_BITS) & 1];
    u64 i = t & ROW_MASK;
    const u64 *rows = atomic_load_explicit(&job->rows, memory_order_relaxed);
    u64 count = atomic_load_explicit(&job->count, memory_order_relaxed);
    int64_t stride = atomic_load_explicit(&job->stride, memory_order_relaxed);
    u64 *trace = atomic_load_explicit(&job->trace, memory_order_relaxed);
    if (rows == NULL || i >= count)
        return -1;
    /* the swap succeeds only while the ticket still names this job, so the fields read
     * above are this job's (the caller rewrites a job slot only two generations on) */
    if (!atomic_compare_exchange_strong_explicit(&p->ticket, &t, t + 1, memory_order_acq_rel,
                                                 memory_order_acquire))
        return 0;
    run_row(rows + i * (u64)stride, stride,
              trace == NULL ? NULL : trace + i * REPLAY_TRACE_WORDS, &p->seq, thread);
    atomic_fetch_add_explicit(&p->worker_rows, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->done, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&p->caller_sleeping, memory_order_seq_cst))
        futex_wake(&p->done, 1);
    return 1;
}

static int claimable(struct replay_pool *p, u64 t) {
    struct job *job = &p->jobs[(t >> ROW_BITS) & 1];
    return atomic_load_explicit(&job->rows, memory_order_relaxed) != NULL &&
           (t & ROW_MASK) < atomic_load_explicit(&job->count, memory_order_relaxed);
}

static void worker_sleep(struct replay_pool *p) {
    atomic_fetch_add_explicit(&p->sleepers, 1, memory_order_seq_cst);
    uint32_t seen = atomic_load_explicit(&p->wake, memory_order_seq_cst);
    u64 t = atomic_load_explicit(&p->ticket, memory_order_seq_cst);
    if (!atomic_load_explicit(&p->stop, memory_order_seq_cst) && !claimable(p, t))
        futex_wait(&p->wake, seen);
    atomic_fetch_sub_explicit(&p->sleepers, 1, memory_order_seq_cst);
}

static void *worker_main(void *arg) {
    struct worker *w = arg;
    struct replay_pool *p = w->pool;
    u64 deadline = 0; /* when spinning ends; 0: not spinning yet */
    u64 seen = 0;     /* the ticket last looked at: a new job restarts the spin */
    unsigned spins = 0;
    for (;;) {
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            return NULL;
        u64 t = atomic_load_explicit(&p->ticket, memory_order_acquire);
        int claimed = try_claim(p, t, w->index);
        if (claimed >= 0 || t != seen) {
            deadline = 0;
            seen = t;
            continue;
        }
        if (++spins % SPIN_CHECK) {
            cpu_relax();
            continue;
        }
        u64 now = now_ns();
        if (deadline == 0)
            deadline = now + (u64)p->spin_ns;
        if (now < deadline) {
            cpu_relax();
            continue;
        }
        worker_sleep(p);
        deadline = 0;
    }
}

static void wake_workers(struct replay_pool *p) {
    if (atomic_load_explicit(&p->sleepers, memory_order_seq_cst)) {
        atomic_fetch_add_explicit(&p->wake, 1, memory_order_seq_cst);
        futex_wake(&p->wake, INT_MAX);
    }
}

replay_pool *replay_pool_new(int workers, int64_t spin_ns) {
    if (workers < 0 || spin_ns < 0)
        return NULL;
    replay_pool *p = aligned_alloc(LINE, (sizeof(*p) + LINE - 1) / LINE * LINE);
    if (p == NULL)
        return NULL;
    *p = (replay_pool){0};
    atomic_init(&p->ticket, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->caller_sleeping, 0);
    atomic_init(&p->wake, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->seq, 0);
    atomic_init(&p->worker_rows, 0);
    for (int j = 0; j < 2; j++) {
        atomic_init(&p->jobs[j].rows, NULL);
        atomic_init(&p->jobs[j].count, 0);
        atomic_init(&p->jobs[j].stride, 0);
        atomic_init(&p->jobs[j].trace, NULL);
    }
    p->spin_ns = spin_ns;
    p->workers = workers;
    if (pthread_mutex_init(&p->lock, NULL) != 0) {
        free(p);
        return NULL;
    }
    p->threads = calloc((size_t)workers + 1, sizeof(*p->threads));
    p->args = calloc((size_t)workers + 1, sizeof(*p->args));
    if (p->threads == NULL || p->args == NULL) {
        replay_pool_free(p);
        return NULL;
    }
    /* workers take no process signals: they stay with the interpreter's threads */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int i = 0; i < workers; i++) {
        p->args[i] = (struct worker){p, (uint32_t)i + 1};
        if (pthread_create(&p->threads[i], NULL, worker_main, &p->args[i]) != 0)
            break;
        p->started++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (p->started < workers) {
        replay_pool_free(p);
        return NULL;
    }
    return p;
}

void replay_pool_free(replay_pool *p) {
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->lock); /* no replay in flight */
    atomic_store_explicit(&p->stop, 1, memory_order_seq_cst);
    atomic_fetch_add_explicit(&p->wake, 1, memory_order_seq_cst);
    futex_wake(&p->wake, INT_MAX);
    for (int i = 0; i < p->started; i++)
        pthread_join(p->threads[i], NULL);
    pthread_mutex_unlock(&p->lock);
    pthread_mutex_destroy(&p->lock);
    free(p->threads);
    free(p->args);
    free(p);
}

int replay_pool_workers(const replay_pool *p) { return p == NULL ? 0 : p->workers; }

static void replay_shared(replay_pool *p, const uint64_t *table, int64_t stride,
                          const int64_t *phases, int64_t count, int flags, uint64_t *trace);

/* One phase of `count` rows as a job for the pool (the caller holds the lock). */
static void run_job(replay_pool *p, const u64 *rows, u64 count, int64_t stride, u64 *trace,
                    int flags) {
    u64 gen = ++p->generation;
    struct job *job = &p->jobs[gen & 1];
    atomic_store_explicit(&job->rows, rows, memory_order_relaxed);
    atomic_store_explicit(&job->count, count, memory_order_relaxed);
    atomic_store_explicit(&job->stride, stride, memory_order_relaxed);
    atomic_store_explicit(&job->trace, trace, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->ticket, gen << ROW_BITS, memory_order_seq_cst); /* publish */
    wake_workers(p);
    u64 mine = 0, started = now_ns();
    if (!(flags & REPLAY_SHARE_ALL)) {
        for (;;) {
            u64 i = atomic_fetch_add_explicit(&p->ticket, 1, memory_order_acq_rel) & ROW_MASK;
            if (i >= count)
                break;
            run_row(rows + i * (u64)stride, stride,
                      trace == NULL ? NULL : trace + i * REPLAY_TRACE_WORDS, &p->seq, 0);
            mine++;
        }
    }
    uint32_t need = (uint32_t)(count - mine);
    if (atomic_load_explicit(&p->done, memory_order_acquire) >= need)
        return;
    u64 waiting = now_ns(), deadline = waiting + (u64)p->spin_ns;
    for (unsigned spins = 1;; spins++) {
        if (atomic_load_explicit(&p->done, memory_order_acquire) >= need)
            return;
        if (spins % SPIN_CHECK == 0 && now_ns() >= deadline)
            break;
        cpu_relax();
    }
    atomic_store_explicit(&p->caller_sleeping, 1, memory_order_seq_cst);
    uint32_t seen;
    while ((seen = atomic_load_explicit(&p->done, memory_order_seq_cst)) < need)
        futex_wait(&p->done, seen);
    atomic_store_explicit(&p->caller_sleeping, 0, memory_order_relaxed);
    /* a stall: waited longer than twice a row of the caller's own took (a row a worker
     * started late or was taken off its core), or a millisecond when it ran none */
    u64 waited = now_ns() - waiting;
    u64 row = mine ? (waiting - started) / mine : STALL_NS / 2;
    if (waited > 2 * row && waited > (u64)p->spin_ns)
        p->stalls++;
}

int replay_run(replay_pool *p, const uint64_t *table, int64_t rows, int64_t stride,
               const int64_t *phases, int64_t count, int flags, uint64_t *trace) {
    if (!stride_ok(stride) || rows < 0 || count < 0)
        return -1;
    for (int64_t k = 0; k < count; k++) {
        int64_t first = phases[2 * k], n = phases[2 * k + 1];
        if (first < 0 || n <= 0 || n >= REPLAY_MAX_ROWS || first > rows - n)
            return -1;
    }
    if (p != NULL && p->workers > 0) {
        pthread_mutex_lock(&p->lock);
        p->stats[0]++;
        if (p->cooldown > 0 && !(flags & REPLAY_SHARE_ALL)) {
            p->cooldown--;
            pthread_mutex_unlock(&p->lock);
        } else {
            replay_shared(p, table, stride, phases, count, flags, trace);
            if (p->stalls) { /* a worker kept a row while off its core: back off */
                p->stats[2] += p->stalls;
                p->backoff = p->backoff ? (p->backoff * 2 > BACKOFF_MAX ? BACKOFF_MAX
                                                                        : p->backoff * 2)
                                        : 1;
                p->cooldown = p->backoff;
            } else {
                p->backoff /= 2;
            }
            p->stats[1]++;
            pthread_mutex_unlock(&p->lock);
            return 0;
        }
    }
    _Atomic u64 seq;
    atomic_init(&seq, 0);
    for (int64_t k = 0; k < count; k++)
        for (int64_t s = 0; s < phases[2 * k + 1]; s++) {
            int64_t r = phases[2 * k] + s;
            run_row(table + r * stride, stride,
                    trace == NULL ? NULL : trace + r * REPLAY_TRACE_WORDS, &seq, 0);
        }
    return 0;
}

void replay_pool_stats(replay_pool *p, uint64_t *out) {
    if (p == NULL) {
        memset(out, 0, sizeof(u64) * REPLAY_STATS);
        return;
    }
    pthread_mutex_lock(&p->lock);
    memcpy(out, p->stats, sizeof(p->stats));
    out[3] = atomic_load_explicit(&p->worker_rows, memory_order_relaxed);
    pthread_mutex_unlock(&p->lock);
}

/* The phases on the pool (the caller holds the lock). */
static void replay_shared(replay_pool *p, const uint64_t *table, int64_t stride,
                          const int64_t *phases, int64_t count, int flags, uint64_t *trace) {
    p->stalls = 0;
    atomic_store_explicit(&p->seq, 0, memory_order_relaxed);
    wake_workers(p);
    for (int64_t k = 0; k < count; k++) {
        int64_t first = phases[2 * k], n = phases[2 * k + 1];
        const u64 *row = table + first * stride;
        u64 *tr = trace == NULL ? NULL : trace + first * REPLAY_TRACE_WORDS;
        if (n == 1)
            run_row(row, stride, tr, &p->seq, 0);
        else
            run_job(p, row, (u64)n, stride, tr, flags);
    }
}
