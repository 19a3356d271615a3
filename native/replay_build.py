"""cffi build script for the kernel replay pool (API mode, compiled at install time).

`setup.py` names this module in `cffi_modules`, so `pip install .` / `pip install -e .`
compiles `native/replay.c` into the extension `swactor.model._replay_cffi` (used by
`swactor.model.cpu_graph`; without it a CPU graph replays its kernels on one thread).
`CDEF` repeats the declarations of `replay.h` that Python calls; the C compiler checks
them against the real header when the extension is built.
"""

from __future__ import annotations

from pathlib import Path

from cffi import FFI

NATIVE = Path(__file__).resolve().parent

CDEF = """
#define REPLAY_MAX_ARGS 64
#define REPLAY_MAX_ROWS 16777215
#define REPLAY_SHARE_ALL 1
#define REPLAY_TRACE_WORDS 5

typedef struct replay_pool replay_pool;

replay_pool *replay_pool_new(int workers, int64_t spin_ns);
void replay_pool_free(replay_pool *pool);
int replay_pool_workers(const replay_pool *pool);
int replay_run(replay_pool *pool, const uint64_t *table, int64_t rows, int64_t stride,
               const int64_t *phases, int64_t count, int flags, uint64_t *trace);
#define REPLAY_STATS 4
void replay_pool_stats(replay_pool *pool, uint64_t *out);
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "swactor.model._replay_cffi",
    '#include "replay.h"',
    sources=["native/replay.c"],  # setup.py runs from the project root
    include_dirs=[str(NATIVE)],
    extra_compile_args=["-std=c11", "-O2", "-Wall"],
    libraries=["pthread"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
