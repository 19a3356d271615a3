/* quicfast: the bulk data path of a QUIC 1-RTT connection, in C.
 *
 * aioquic builds and parses every packet in Python (~25 us a 16 KiB packet per side);
 * an edge stream's steady state is one kind of packet only: a short-header packet
 * holding one STREAM frame. These two calls build (seal) and parse (open) a batch of
 * exactly those, with the connection's 1-RTT keys (AES-128/256-GCM via OpenSSL's
 * EVP), so Python's work drops to bookkeeping once per packet. Everything else
 * (handshake, ACKs, flow-control frames, retransmission decisions, key updates,
 * anything unusual) stays in aioquic: `qf_open` reports such a packet as
 * QF_SLOW and leaves its bytes untouched for aioquic's own receive path.
 *
 * Wire format (RFC 9000 17.3.1, RFC 9001 5): first byte 0x40 | spin << 5 |
 * key_phase << 2 | (pn_len - 1), destination connection id, packet number (pn_len
 * bytes, truncated), then the AEAD-sealed payload: STREAM frame type 0x0e (OFF|LEN),
 * stream id, offset, length (QUIC varints), data; 16-byte tag. Header protection masks
 * the first byte's low 5 bits and the packet number with AES-ECB of a 16-byte sample
 * taken 4 bytes after the packet number's start.
 */
#ifndef SWACTOR_QUICFAST_H
#define SWACTOR_QUICFAST_H

#include <stddef.h>
#include <stdint.h>

#define QF_ABI_VERSION 1
#define QF_SUITE_AES_128_GCM 1
#define QF_SUITE_AES_256_GCM 2
#define QF_TAG_LEN 16
#define QF_PN_LEN 2

/* qf_open statuses, per datagram */
#define QF_SLOW 0      /* leave to aioquic (other frames, key phase, auth failure, ...) */
#define QF_STREAM 1    /* one STREAM frame decrypted; fields of qf_rx set */
#define QF_OTHER_CID 2 /* not a short-header packet for `dcid`: route it elsewhere */

typedef struct qf_keys qf_keys;

/* One direction's packet keys (key, 12-byte iv, header-protection key). NULL on an
 * unsupported suite or an OpenSSL failure. */
qf_keys *qf_keys_new(int suite, const uint8_t *key, const uint8_t *iv, const uint8_t *hp);
void qf_keys_free(qf_keys *k);

/* The 16-byte header-protection mask of a 16-byte sample (0, or -1 on failure). */
int qf_hp_mask(qf_keys *k, const uint8_t *sample, uint8_t *mask);

typedef struct qf_tx {
    uint64_t offset; /* stream offset of the packet's first data byte */
    uint32_t length; /* data bytes the packet carries */
    uint32_t size;   /* packet (= datagram) bytes */
} qf_tx;

/* Seal up to `max_packets` packets, each one datagram of at most `datagram_size` bytes,
 * carrying data[0:data_len] of stream `stream_id` from stream offset `offset` onwards,
 * packet numbers pn, pn + 1, ... Packets are written back to back into `out`
 * (capacity out_cap); every packet but the last is exactly datagram_size bytes.
 * Returns the number of packets built (0: datagram_size too small or out too small). */
int qf_seal_stream(qf_keys *k, uint8_t first_byte, const uint8_t *dcid, size_t dcid_len,
                   uint64_t pn, uint64_t stream_id, uint64_t offset, const uint8_t *data,
                   size_t data_len, size_t datagram_size, int max_packets, uint8_t *out,
                   size_t out_cap, qf_tx *packets);

typedef struct qf_msg {
    uint32_t at;      /* offset of the message in the receive buffer */
    uint32_t len;     /* bytes received */
    uint32_t seg;     /* GRO segment size (0: one datagram) */
    uint16_t port;    /* source port */
    uint8_t family;   /* 4 or 6 */
    uint8_t addr[16]; /* source address (4 or 16 bytes used) */
} qf_msg;

typedef struct qf_rx {
    int status;        /* QF_SLOW, QF_STREAM or QF_OTHER_CID */
    uint32_t msg;      /* message of the run's first datagram ... */
    uint32_t index;    /* ... and its index in that message */
    uint32_t count;    /* datagrams in the run (always 1 unless QF_STREAM) */
    uint64_t pn;       /* full packet number of the first (QF_STREAM) */
    uint64_t stream_id;
    uint64_t offset;   /* stream offset of the run's first data byte */
    uint32_t data_at;  /* where the run's data lies in `plain` */
    uint32_t length;   /* data bytes of the run */
    uint32_t first;    /* unprotected first byte of the run's last packet (spin bit) */
} qf_rx;

/* Open the datagrams of `nmsgs` received messages (each `len` bytes at buf + at, cut
 * into `seg`-byte datagrams by GRO, the last may be shorter). A datagram is QF_STREAM
 * only if it is a short-header packet for `dcid`, its key phase is `key_phase`, it
 * authenticates, its reserved bits are zero, its packet number is above `largest_pn`
 * and above every QF_STREAM packet before it, and its payload is one STREAM frame
 * without FIN followed only by PADDING. The data of QF_STREAM datagrams is decrypted
 * into `plain` back to back (it needs the messages' total length); consecutive ones
 * continuing the same stream with consecutive packet numbers form one run (one record).
 * `buf` is never modified. Returns the number of records (at most max_out: datagrams
 * after the last record's are left unopened). */
int qf_open(qf_keys *k, const uint8_t *buf, const qf_msg *msgs, int nmsgs, const uint8_t *dcid,
            size_t dcid_len, int64_t largest_pn, int key_phase, uint8_t *plain, qf_rx *out,
            int max_out);

#define QF_MAX_MSGS 64

/* One recvmmsg(MSG_DONTWAIT) of up to max_msgs (<= QF_MAX_MSGS) messages on `fd`, the
 * i-th into buf + i * slot (slot bytes each; a GRO socket may fill 64 KiB), with their
 * GRO segment sizes and source addresses. Returns the count, or -errno (-EAGAIN when
 * nothing is waiting). */
int qf_recv(int fd, uint8_t *buf, size_t slot, int max_msgs, qf_msg *msgs);

/* One sendmmsg(MSG_DONTWAIT) of `count` (<= QF_MAX_MSGS) messages to one address
 * (family 4 or 6, `addr` 4 or 16 bytes, host-order port): message i is bufs[i][0:lens[i]],
 * cut by the kernel into segs[i]-byte datagrams (UDP GSO) when segs[i] is non-zero and
 * below lens[i]. Returns the number of messages sent, or -errno if none was (-EIO or
 * -EINVAL: the device or kernel cannot do GSO). */
int qf_send(int fd, int family, const uint8_t *addr, uint16_t port, uint8_t *const *bufs,
            const uint32_t *lens, const uint16_t *segs, int count);

uint32_t qf_abi_version(void);

#endif
