/*
 * replay.h -- run a decode step's CPU kernels on a small pool of threads.
 *
 * Theory of operation
 * -------------------
 * swactor's CpuGraph (swactor/model/cpu_graph.py) lays a tinygrad JIT's CPU kernels out
 * as a table: one row of `stride` uint64 words per call, the kernel's entry address then
 * its arguments.  A kernel that tinygrad split into `core_id` slices (its THREAD opt) has
 * one row per slice.  The table is cut into *phases* of consecutive rows that are
 * independent of each other (the slices of one kernel, which write disjoint outputs, or
 * kernels that touch disjoint memory); every phase may read what the phases before it
 * wrote.  `phases` lists them in order as (first row, row count) pairs.
 *
 * `replay_run` walks the phases in order on the calling thread.  A phase of one row (or
 * any phase when the pool has no workers) is called right there, row by row.  A phase of
 * `n` rows becomes a *job*: the caller publishes it, every thread of the pool (the caller
 * included) claims rows one at a time until none is left, and the caller waits until
 * every claimed row has returned before the next phase starts (the barrier).  Which
 * thread runs a row, and when within its phase, does not change what it computes, so
 * results are bit-identical to the sequential walk.
 *
 * Claims.  `ticket` holds the job's generation (high 40 bits) and its next unclaimed
 * row (low 24 bits).  A worker loads the ticket, reads that generation's job (two job
 * slots, by generation parity) and claims row `i < n` with a compare-and-swap of the
 * whole ticket: a worker that read a job which is already over fails its swap, so it can
 * never run a row of a finished job.  The caller claims with fetch-add.  Claims are
 * dynamic: a worker that is asleep or descheduled (other processes share the cores)
 * simply claims nothing and the caller runs the rows itself; the caller only ever waits
 * for rows another thread has started.
 *
 * Memory order.  The caller writes the job then publishes the ticket (release); a claimer
 * acquires the ticket, so it sees the job and everything the caller's thread saw,
 * including earlier phases' outputs.  A worker counts each finished row into `done`
 * (release); the caller acquires `done` before the next phase, so it sees the rows'
 * outputs, and passes them on with its next release.
 *
 * Waiting is bounded.  A worker spins (a `pause` loop) for at most `spin_ns` after the
 * last job it saw published, then sleeps on a futex, so it stays awake across the jobs
 * of a step (and the graphs of one step, replayed back to back) and sleeps between
 * steps.  The caller spins at most `spin_ns` for rows in flight, then sleeps on a futex
 * until the last one is counted.
 * Both sleeps use the same pattern: announce the sleeper (sequentially consistent store),
 * re-check the condition, then futex-wait on a word whose value was read before the
 * re-check; the other side changes the word before reading the announcement, so no wake
 * is lost.  The caller wakes sleeping workers when it publishes a job (one futex call,
 * only when some worker sleeps).
 *
 * Backing off.  Other processes share the cores: a worker can be taken off its core while
 * it holds a row, and the caller then sleeps until the scheduler runs it again
 * (milliseconds under load), longer than running every row itself.  A *stall* is a wait
 * for the workers' rows longer than `spin_ns` and than twice the caller's own rows of the
 * phase took each (a millisecond when it ran none).  A replay that stalled makes the next
 * `backoff` replays run on the caller alone (the workers stay asleep), `backoff` doubling
 * with each stalled replay up to 64 and halving with each clean one; so a busy machine
 * costs a stall every few replays and an idle one shares every replay.
 *
 * One replay at a time per pool (a mutex serialises callers).  Linux only (futex).
 */
#ifndef SWACTOR_REPLAY_H
#define SWACTOR_REPLAY_H

#include <stdint.h>

#define REPLAY_MAX_ARGS 64        /* widest argument list a row may hold */
#define REPLAY_MAX_ROWS 0xFFFFFF  /* rows per phase (the ticket's low 24 bits) */

/* replay_run flags */
#define REPLAY_SHARE_ALL 1 /* the caller claims no row of a job (tests: workers run them) */

typedef struct replay_pool replay_pool;

/* A pool with `workers` threads besides the caller (0: the sequential walk), spinning at
 * most `spin_ns` nanoseconds before sleeping.  NULL when a thread cannot start. */
replay_pool *replay_pool_new(int workers, int64_t spin_ns);
void replay_pool_free(replay_pool *pool);
int replay_pool_workers(const replay_pool *pool);

#define REPLAY_TRACE_WORDS 5 /* per table row: start, end, runs, thread, nanoseconds */

/* Run the `count` phases of `table` (`rows` rows of `stride` words: the entry, then
 * stride - 1 arguments, stride - 1 one of 4, 8, 16, 32, 64).  `pool` NULL runs them all
 * on the caller.  With `trace` non-NULL (REPLAY_TRACE_WORDS per table row, zeroed by the
 * caller) each row records when it started and ended (one counter for the whole replay,
 * from 1), how many times it ran, the thread that ran it (0 the caller, 1.. the workers)
 * and its duration in nanoseconds.  Returns 0, or -1 (nothing run) for a bad stride, or
 * a phase whose rows are not inside the table or number 0 or REPLAY_MAX_ROWS or more. */
int replay_run(replay_pool *pool, const uint64_t *table, int64_t rows, int64_t stride,
               const int64_t *phases, int64_t count, int flags, uint64_t *trace);

#define REPLAY_STATS 4
/* The pool's counts since it started: replays, replays shared with the workers, stalls
 * (the caller slept for a row a worker held), rows the workers ran. */
void replay_pool_stats(replay_pool *pool, uint64_t *out);

#endif
