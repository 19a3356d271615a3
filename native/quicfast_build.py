"""cffi build script for the QUIC bulk data path (API mode, compiled at install time).

`setup.py` names this module in `cffi_modules`, so `pip install -e .` compiles
`native/quicfast.c` into `swactor.transport._quicfast_cffi`, linked with OpenSSL's
libcrypto (Debian's libssl-dev, which `scripts/setup.sh` installs). `CDEF` repeats the
declarations of `quicfast.h` Python calls; the compiler checks them against the header.
"""

from __future__ import annotations

from pathlib import Path

from cffi import FFI

NATIVE = Path(__file__).resolve().parent

CDEF = """
#define QF_ABI_VERSION 1
#define QF_SUITE_AES_128_GCM 1
#define QF_SUITE_AES_256_GCM 2
#define QF_TAG_LEN 16
#define QF_PN_LEN 2
#define QF_SLOW 0
#define QF_STREAM 1
#define QF_OTHER_CID 2

typedef struct qf_keys qf_keys;
qf_keys *qf_keys_new(int suite, const uint8_t *key, const uint8_t *iv, const uint8_t *hp);
void qf_keys_free(qf_keys *k);
int qf_hp_mask(qf_keys *k, const uint8_t *sample, uint8_t *mask);

typedef struct qf_tx {
    uint64_t offset;
    uint32_t length;
    uint32_t size;
} qf_tx;

int qf_seal_stream(qf_keys *k, uint8_t first_byte, const uint8_t *dcid, size_t dcid_len,
                   uint64_t pn, uint64_t stream_id, uint64_t offset, const uint8_t *data,
                   size_t data_len, size_t datagram_size, int max_packets, uint8_t *out,
                   size_t out_cap, qf_tx *packets);

typedef struct qf_msg {
    uint32_t at;
    uint32_t len;
    uint32_t seg;
    uint16_t port;
    uint8_t family;
    uint8_t addr[16];
} qf_msg;

typedef struct qf_rx {
    int status;
    uint32_t msg;
    uint32_t index;
    uint32_t count;
    uint64_t pn;
    uint64_t stream_id;
    uint64_t offset;
    uint32_t data_at;
    uint32_t length;
    uint32_t first;
} qf_rx;

int qf_open(qf_keys *k, const uint8_t *buf, const qf_msg *msgs, int nmsgs, const uint8_t *dcid,
            size_t dcid_len, int64_t largest_pn, int key_phase, uint8_t *plain, qf_rx *out,
            int max_out);

#define QF_MAX_MSGS 64
int qf_recv(int fd, uint8_t *buf, size_t slot, int max_msgs, qf_msg *msgs);

int qf_send(int fd, int family, const uint8_t *addr, uint16_t port, uint8_t *const *bufs,
            const uint32_t *lens, const uint16_t *segs, int count);

uint32_t qf_abi_version(void);
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "swactor.transport._quicfast_cffi",
    '#include "quicfast.h"',
    sources=["native/quicfast.c"],  # setup.py runs from the project root
    include_dirs=[str(NATIVE)],
    libraries=["crypto"],
    extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
