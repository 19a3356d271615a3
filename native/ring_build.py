"""cffi build script for the native ring helper (API mode, compiled at install time).

`setup.py` names this module in `cffi_modules`, so `pip install .` / `pip install -e .`
compiles `native/ring.c` into the extension `swactor.ring._ring_cffi`.  Nothing is ever
compiled at run time.  `CDEF` repeats the declarations of `ring.h` that Python calls; the
C compiler checks them against the real header when the extension is built.
"""

from __future__ import annotations

from pathlib import Path

from cffi import FFI

NATIVE = Path(__file__).resolve().parent

CDEF = """
#define RING_ABI_VERSION 1
#define RING_MAGIC 0x47525753
#define RING_VERSION_COMPACT 1
#define RING_VERSION_SPLIT 2
#define RING_HEADER_ALIGN 64
#define RING_OK 0
#define RING_E_VERSION -1
#define RING_E_LAYOUT -2
#define RING_E_RANGE -3
#define RING_E_STATE -4
#define RING_E_NOMEM -5
#define RING_STATE_OPEN 1
#define RING_STATE_CLOSED 2
#define RING_STATE_FAULTED 3
#define RING_WAKE_READABLE 1
#define RING_WAKE_WRITABLE 2

typedef struct ring_layout {
    uint64_t ring_id;
    uint64_t arena_offset;
    uint64_t total_len;
    uint64_t header_offset;
    uint64_t data_offset;
    uint64_t data_capacity;
    uint32_t alignment;
} ring_layout;

typedef struct ring_handle ring_handle;

uint32_t ring_abi_version(void);
uint16_t ring_header_len(uint16_t version);
int ring_init(uint8_t *arena_base, uint64_t arena_len, const ring_layout *layout,
              uint16_t version);
int ring_open(uint8_t *arena_base, uint64_t arena_len, const ring_layout *layout,
              ring_handle **out);
void ring_close(ring_handle *h);
uint64_t ring_readable_span(ring_handle *h, uint64_t max_len, uint64_t *data_offset);
int ring_advance_consume(ring_handle *h, uint64_t n);
uint64_t ring_writable_span(ring_handle *h, uint64_t max_len, uint64_t *data_offset);
int ring_advance_commit(ring_handle *h, uint64_t n);
uint32_t ring_state(ring_handle *h);
int ring_close_producer(ring_handle *h);
int ring_fault(ring_handle *h, uint32_t reason);
int ring_commit_mark(ring_handle *h, uint64_t n);
int ring_consume_mark(ring_handle *h, uint64_t n);
uint64_t ring_write(ring_handle *h, const uint8_t *src, uint64_t len, int *wake);
uint64_t ring_read(ring_handle *h, uint8_t *dst, uint64_t len, int *wake);
int ring_mark_pending(ring_handle *h, uint32_t bit);
void ring_clear_pending(ring_handle *h, uint32_t bit);
uint32_t ring_wake_word(ring_handle *h);
uint64_t ring_commit(ring_handle *h);
uint64_t ring_consume(ring_handle *h);
uint64_t ring_capacity(ring_handle *h);
uint64_t ring_id(ring_handle *h);
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "swactor.ring._ring_cffi",
    '#include "ring.h"',
    sources=["native/ring.c"],  # setup.py runs from the project root
    include_dirs=[str(NATIVE)],
    extra_compile_args=["-std=c11", "-O2", "-Wall"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
