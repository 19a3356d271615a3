/* quicfast: see quicfast.h for what this is and the wire format it reads and writes. */
#define _GNU_SOURCE /* recvmmsg */
#include "quicfast.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#ifndef UDP_GRO
#define UDP_GRO 104
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif

struct qf_keys {
    EVP_CIPHER_CTX *aead_enc; /* the same key set up once for sealing ... */
    EVP_CIPHER_CTX *aead_dec; /* ... and once for opening */
    EVP_CIPHER_CTX *hp;       /* AES-ECB, no padding: header-protection masks */
    uint8_t iv[12];
};

uint32_t qf_abi_version(void) { return QF_ABI_VERSION; }

void qf_keys_free(qf_keys *k) {
    if (k == NULL) return;
    EVP_CIPHER_CTX_free(k->aead_enc);
    EVP_CIPHER_CTX_free(k->aead_dec);
    EVP_CIPHER_CTX_free(k->hp);
    free(k);
}

qf_keys *qf_keys_new(int suite, const uint8_t *key, const uint8_t *iv, const uint8_t *hp) {
    const EVP_CIPHER *aead, *ecb;
    if (suite == QF_SUITE_AES_128_GCM) {
        aead = EVP_aes_128_gcm();
        ecb = EVP_aes_128_ecb();
    } else if (suite == QF_SUITE_AES_256_GCM) {
        aead = EVP_aes_256_gcm();
        ecb = EVP_aes_256_ecb();
    } else {
        return NULL;
    }
    qf_keys *k = calloc(1, sizeof(*k));
    if (k == NULL) return NULL;
    k->aead_enc = EVP_CIPHER_CTX_new();
    k->aead_dec = EVP_CIPHER_CTX_new();
    k->hp = EVP_CIPHER_CTX_new();
    if (k->aead_enc == NULL || k->aead_dec == NULL || k->hp == NULL ||
        EVP_EncryptInit_ex(k->aead_enc, aead, NULL, key, NULL) != 1 ||
        EVP_DecryptInit_ex(k->aead_dec, aead, NULL, key, NULL) != 1 ||
        EVP_EncryptInit_ex(k->hp, ecb, NULL, hp, NULL) != 1 ||
        EVP_CIPHER_CTX_set_padding(k->hp, 0) != 1) {
        qf_keys_free(k);
        return NULL;
    }
    memcpy(k->iv, iv, 12);
    return k;
}

/* -- helpers ------------------------------------------------------------------------- */

static size_t varint_len(uint64_t v) {
    return v < 64 ? 1 : v < 16384 ? 2 : v < 1073741824 ? 4 : 8;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v, size_t len) {
    switch (len) {
    case 1: p[0] = (uint8_t)v; break;
    case 2: p[0] = (uint8_t)(0x40 | (v >> 8)); p[1] = (uint8_t)v; break;
    case 4:
        p[0] = (uint8_t)(0x80 | (v >> 24)); p[1] = (uint8_t)(v >> 16);
        p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
        break;
    default:
        p[0] = (uint8_t)(0xc0 | (v >> 56));
        for (int i = 1; i < 8; i++) p[i] = (uint8_t)(v >> (56 - 8 * i));
    }
    return p + len;
}

/* Reads a varint at *p (bounded by end); 0 on success, -1 when truncated. */
static int get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    if (*p >= end) return -1;
    size_t len = (size_t)1 << ((*p)[0] >> 6);
    if ((size_t)(end - *p) < len) return -1;
    uint64_t x = (*p)[0] & 0x3f;
    for (size_t i = 1; i < len; i++) x = (x << 8) | (*p)[i];
    *p += len;
    *v = x;
    return 0;
}

static void make_nonce(const qf_keys *k, uint64_t pn, uint8_t nonce[12]) {
    memcpy(nonce, k->iv, 12);
    for (int i = 0; i < 8; i++) nonce[11 - i] ^= (uint8_t)(pn >> (8 * i));
}

static int hp_mask(qf_keys *k, const uint8_t *sample, uint8_t mask[16]) {
    int outl = 0;
    return EVP_EncryptUpdate(k->hp, mask, &outl, sample, 16) == 1 && outl == 16 ? 0 : -1;
}

int qf_hp_mask(qf_keys *k, const uint8_t *sample, uint8_t *mask) { return hp_mask(k, sample, mask); }

/* RFC 9000 A.3 */
static uint64_t decode_pn(uint64_t truncated, unsigned bits, uint64_t expected) {
    uint64_t win = (uint64_t)1 << bits, hwin = win / 2, mask = win - 1;
    uint64_t candidate = (expected & ~mask) | truncated;
    if (candidate + hwin <= expected && candidate + win < ((uint64_t)1 << 62))
        return candidate + win;
    if (candidate > expected + hwin && candidate >= win) return candidate - win;
    return candidate;
}

/* -- seal ---------------------------------------------------------------------------- */

int qf_seal_stream(qf_keys *k, uint8_t first_byte, const uint8_t *dcid, size_t dcid_len,
                   uint64_t pn, uint64_t stream_id, uint64_t offset, const uint8_t *data,
                   size_t data_len, size_t datagram_size, int max_packets, uint8_t *out,
                   size_t out_cap, qf_tx *packets) {
    const size_t header_len = 1 + dcid_len + QF_PN_LEN;
    const size_t sid_len = varint_len(stream_id);
    size_t used = 0, done = 0;
    int count = 0;
    first_byte = (uint8_t)((first_byte & ~0x03) | (QF_PN_LEN - 1));
    while (done < data_len && count < max_packets) {
        uint64_t off = offset + done;
        size_t off_len = varint_len(off);
        size_t frame_head = 1 + sid_len + off_len;
        size_t room = out_cap - used < datagram_size ? out_cap - used : datagram_size;
        /* length varint: 2 bytes below 16384 data bytes, else 4 */
        if (room < header_len + frame_head + 2 + QF_TAG_LEN + 1) break;
        size_t max_data = room - header_len - frame_head - QF_TAG_LEN;
        size_t len_len = max_data - 2 < 16384 ? 2 : 4;
        max_data -= len_len;
        size_t n = data_len - done < max_data ? data_len - done : max_data;
        if (off + n >= ((uint64_t)1 << 62) || stream_id >= ((uint64_t)1 << 62)) break;
        uint8_t *pkt = out + used;
        uint8_t *p = pkt;
        *p++ = first_byte;
        memcpy(p, dcid, dcid_len);
        p += dcid_len;
        *p++ = (uint8_t)(pn >> 8);
        *p++ = (uint8_t)pn;
        uint8_t *payload = p;
        *p++ = 0x0e; /* STREAM | OFF | LEN */
        p = put_varint(p, stream_id, sid_len);
        p = put_varint(p, off, off_len);
        p = put_varint(p, n, len_len);
        /* payload protection: the frame header in place, the data straight from the
         * caller's buffer into the packet (no separate copy) */
        size_t head = (size_t)(p - payload);
        uint8_t nonce[12];
        int outl = 0;
        make_nonce(k, pn, nonce);
        if (EVP_EncryptInit_ex(k->aead_enc, NULL, NULL, NULL, nonce) != 1 ||
            EVP_EncryptUpdate(k->aead_enc, NULL, &outl, pkt, (int)header_len) != 1 ||
            EVP_EncryptUpdate(k->aead_enc, payload, &outl, payload, (int)head) != 1 ||
            EVP_EncryptUpdate(k->aead_enc, p, &outl, data + done, (int)n) != 1 ||
            EVP_EncryptFinal_ex(k->aead_enc, p + n, &outl) != 1)
            break;
        p += n;
        if (EVP_CIPHER_CTX_ctrl(k->aead_enc, EVP_CTRL_GCM_GET_TAG, QF_TAG_LEN, p) != 1) break;
        p += QF_TAG_LEN;
        /* header protection: sample 4 bytes past the packet number's start */
        uint8_t mask[16];
        if (hp_mask(k, pkt + 1 + dcid_len + 4, mask) != 0) break;
        pkt[0] ^= mask[0] & 0x1f;
        pkt[1 + dcid_len] ^= mask[1];
        pkt[2 + dcid_len] ^= mask[2];
        packets[count].offset = off;
        packets[count].length = (uint32_t)n;
        packets[count].size = (uint32_t)(p - pkt);
        used += (size_t)(p - pkt);
        done += n;
        pn++;
        count++;
    }
    return count;
}

/* -- open ---------------------------------------------------------------------------- */

#define QF_PEEK 32 /* plaintext bytes decrypted first, to read the frame header from */

/* Opens one datagram. Its STREAM data is decrypted straight to plain[cursor...]. */
static int open_one(qf_keys *k, const uint8_t *pkt, size_t len, const uint8_t *dcid,
                    size_t dcid_len, uint64_t expected, int key_phase, uint8_t *plain,
                    size_t cursor, qf_rx *rx) {
    size_t pn_at = 1 + dcid_len;
    if (len < pn_at || (pkt[0] & 0x80) || memcmp(pkt + 1, dcid, dcid_len) != 0)
        return QF_OTHER_CID; /* long header, or another connection's: route it */
    if (len < pn_at + 4 + 16 || !(pkt[0] & 0x40)) return QF_SLOW;
    uint8_t mask[16];
    if (hp_mask(k, pkt + pn_at + 4, mask) != 0) return QF_SLOW;
    uint8_t first = pkt[0] ^ (mask[0] & 0x1f);
    if (first & 0x18) return QF_SLOW;                      /* reserved bits: aioquic closes */
    if (((first >> 2) & 1) != key_phase) return QF_SLOW;   /* key update: aioquic's job */
    size_t pn_len = (size_t)(first & 0x03) + 1;
    if (len < pn_at + pn_len + QF_TAG_LEN + 1) return QF_SLOW;
    uint64_t truncated = 0;
    uint8_t header[1 + 20 + 4];
    if (pn_at + pn_len > sizeof(header)) return QF_SLOW;
    header[0] = first;
    memcpy(header + 1, pkt + 1, dcid_len);
    for (size_t i = 0; i < pn_len; i++) {
        header[pn_at + i] = pkt[pn_at + i] ^ mask[1 + i];
        truncated = (truncated << 8) | header[pn_at + i];
    }
    uint64_t pn = decode_pn(truncated, (unsigned)(8 * pn_len), expected);
    size_t head_len = pn_at + pn_len;
    size_t payload_len = len - head_len - QF_TAG_LEN;
    const uint8_t *src = pkt + head_len;
    uint8_t nonce[12], peek[QF_PEEK];
    size_t peek_len = payload_len < QF_PEEK ? payload_len : QF_PEEK;
    int outl = 0;
    make_nonce(k, pn, nonce);
    if (EVP_DecryptInit_ex(k->aead_dec, NULL, NULL, NULL, nonce) != 1 ||
        EVP_DecryptUpdate(k->aead_dec, NULL, &outl, header, (int)head_len) != 1 ||
        EVP_DecryptUpdate(k->aead_dec, peek, &outl, src, (int)peek_len) != 1)
        return QF_SLOW;
    /* one STREAM frame, no FIN, then only PADDING */
    const uint8_t *p = peek, *end = peek + peek_len;
    uint8_t type = *p++;
    if ((type & 0xf8) != 0x08 || (type & 0x01)) return QF_SLOW;
    uint64_t sid, off = 0, n;
    if (get_varint(&p, end, &sid) != 0) return QF_SLOW;
    if ((type & 0x04) && get_varint(&p, end, &off) != 0) return QF_SLOW;
    size_t frame_head = 0;
    if (type & 0x02) {
        if (get_varint(&p, end, &n) != 0) return QF_SLOW;
        frame_head = (size_t)(p - peek);
        if (n > payload_len - frame_head) return QF_SLOW;
    } else {
        frame_head = (size_t)(p - peek);
        n = payload_len - frame_head;
    }
    if (n == 0 || off + n >= ((uint64_t)1 << 62)) return QF_SLOW;
    /* data (and any padding after it) lands at plain[cursor]: the peeked part first */
    uint8_t *dst = plain + cursor;
    memcpy(dst, peek + frame_head, peek_len - frame_head);
    size_t rest = payload_len - peek_len;
    if (rest && EVP_DecryptUpdate(k->aead_dec, dst + (peek_len - frame_head), &outl,
                                  src + peek_len, (int)rest) != 1)
        return QF_SLOW;
    if (EVP_CIPHER_CTX_ctrl(k->aead_dec, EVP_CTRL_GCM_SET_TAG, QF_TAG_LEN,
                            (void *)(pkt + len - QF_TAG_LEN)) != 1 ||
        EVP_DecryptFinal_ex(k->aead_dec, dst + (payload_len - frame_head), &outl) != 1)
        return QF_SLOW; /* aioquic drops it (or finds a key update) */
    for (size_t i = (size_t)n; i < payload_len - frame_head; i++)
        if (dst[i] != 0) return QF_SLOW; /* a frame after the STREAM frame */
    rx->pn = pn;
    rx->first = first;
    rx->stream_id = sid;
    rx->offset = off;
    rx->data_at = (uint32_t)cursor;
    rx->length = (uint32_t)n;
    return QF_STREAM;
}

int qf_open(qf_keys *k, const uint8_t *buf, const qf_msg *msgs, int nmsgs, const uint8_t *dcid,
            size_t dcid_len, int64_t largest_pn, int key_phase, uint8_t *plain, qf_rx *out,
            int max_out) {
    int runs = 0;
    size_t cursor = 0;
    qf_rx one, *last = NULL;
    for (int m = 0; m < nmsgs; m++) {
        size_t seg = msgs[m].seg ? msgs[m].seg : msgs[m].len;
        size_t base = msgs[m].at, msg_len = msgs[m].len;
        uint32_t index = 0;
        for (size_t at = 0; at < msg_len; at += seg, index++) {
            size_t len = msg_len - at < seg ? msg_len - at : seg;
            memset(&one, 0, sizeof(one));
            uint64_t expected = (uint64_t)(largest_pn + 1);
            one.status = open_one(k, buf + base + at, len, dcid, dcid_len, expected, key_phase,
                                  plain, cursor, &one);
            if (one.status == QF_STREAM && (int64_t)one.pn <= largest_pn)
                one.status = QF_SLOW; /* maybe a duplicate: aioquic decides */
            if (one.status == QF_STREAM) {
                largest_pn = (int64_t)one.pn;
                cursor += one.length;
                if (last != NULL && last->status == QF_STREAM &&
                    last->stream_id == one.stream_id &&
                    last->offset + last->length == one.offset &&
                    last->pn + last->count == one.pn) {
                    last->length += one.length; /* contiguous: one run */
                    last->count++;
                    last->first = one.first;
                    continue;
                }
            }
            if (runs == max_out) return runs;
            one.msg = (uint32_t)m;
            one.index = index;
            one.count = 1;
            out[runs] = one;
            last = &out[runs++];
        }
    }
    return runs;
}

/* -- receive ------------------------------------------------------------------------- */

#define QF_CMSG_SPACE 64

int qf_recv(int fd, uint8_t *buf, size_t slot, int max_msgs, qf_msg *msgs) {
    if (max_msgs > QF_MAX_MSGS) max_msgs = QF_MAX_MSGS;
    struct mmsghdr hdrs[QF_MAX_MSGS];
    struct iovec iovs[QF_MAX_MSGS];
    struct sockaddr_storage names[QF_MAX_MSGS];
    uint8_t controls[QF_MAX_MSGS][QF_CMSG_SPACE];
    memset(hdrs, 0, sizeof(hdrs[0]) * (size_t)max_msgs);
    for (int i = 0; i < max_msgs; i++) {
        iovs[i].iov_base = buf + (size_t)i * slot;
        iovs[i].iov_len = slot;
        hdrs[i].msg_hdr.msg_iov = &iovs[i];
        hdrs[i].msg_hdr.msg_iovlen = 1;
        hdrs[i].msg_hdr.msg_name = &names[i];
        hdrs[i].msg_hdr.msg_namelen = sizeof(names[i]);
        hdrs[i].msg_hdr.msg_control = controls[i];
        hdrs[i].msg_hdr.msg_controllen = QF_CMSG_SPACE;
    }
    int n = recvmmsg(fd, hdrs, (unsigned)max_msgs, MSG_DONTWAIT, NULL);
    if (n < 0) return -errno;
    for (int i = 0; i < n; i++) {
        qf_msg *m = &msgs[i];
        memset(m, 0, sizeof(*m));
        m->at = (uint32_t)((size_t)i * slot);
        m->len = hdrs[i].msg_len;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&hdrs[i].msg_hdr); c != NULL;
             c = CMSG_NXTHDR(&hdrs[i].msg_hdr, c)) {
            if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
                int seg = 0;
                memcpy(&seg, CMSG_DATA(c), sizeof(seg));
                if (seg > 0 && (uint32_t)seg < m->len) m->seg = (uint32_t)seg;
            }
        }
        if (names[i].ss_family == AF_INET) {
            struct sockaddr_in *a = (struct sockaddr_in *)&names[i];
            m->family = 4;
            m->port = ntohs(a->sin_port);
            memcpy(m->addr, &a->sin_addr, 4);
        } else if (names[i].ss_family == AF_INET6) {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&names[i];
            m->family = 6;
            m->port = ntohs(a->sin6_port);
            memcpy(m->addr, &a->sin6_addr, 16);
        }
    }
    return n;
}

/* -- send ---------------------------------------------------------------------------- */

int qf_send(int fd, int family, const uint8_t *addr, uint16_t port, uint8_t *const *bufs,
            const uint32_t *lens, const uint16_t *segs, int count) {
    if (count > QF_MAX_MSGS) count = QF_MAX_MSGS;
    struct mmsghdr hdrs[QF_MAX_MSGS];
    struct iovec iovs[QF_MAX_MSGS];
    union {
        char buf[CMSG_SPACE(sizeof(uint16_t))];
        struct cmsghdr align;
    } controls[QF_MAX_MSGS];
    struct sockaddr_in v4;
    struct sockaddr_in6 v6;
    void *name;
    socklen_t name_len;
    if (family == 4) {
        memset(&v4, 0, sizeof(v4));
        v4.sin_family = AF_INET;
        v4.sin_port = htons(port);
        memcpy(&v4.sin_addr, addr, 4);
        name = &v4;
        name_len = sizeof(v4);
    } else {
        memset(&v6, 0, sizeof(v6));
        v6.sin6_family = AF_INET6;
        v6.sin6_port = htons(port);
        memcpy(&v6.sin6_addr, addr, 16);
        name = &v6;
        name_len = sizeof(v6);
    }
    memset(hdrs, 0, sizeof(hdrs[0]) * (size_t)count);
    for (int i = 0; i < count; i++) {
        iovs[i].iov_base = bufs[i];
        iovs[i].iov_len = lens[i];
        struct msghdr *h = &hdrs[i].msg_hdr;
        h->msg_name = name;
        h->msg_namelen = name_len;
        h->msg_iov = &iovs[i];
        h->msg_iovlen = 1;
        if (segs[i] && segs[i] < lens[i]) { /* a GSO run: the kernel cuts it */
            h->msg_control = controls[i].buf;
            h->msg_controllen = sizeof(controls[i].buf);
            struct cmsghdr *c = CMSG_FIRSTHDR(h);
            c->cmsg_level = SOL_UDP;
            c->cmsg_type = UDP_SEGMENT;
            c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
            memcpy(CMSG_DATA(c), &segs[i], sizeof(uint16_t));
        }
    }
    int sent = 0;
    while (sent < count) {
        int n = sendmmsg(fd, hdrs + sent, (unsigned)(count - sent), MSG_DONTWAIT);
        if (n < 0) return sent ? sent : -errno;
        sent += n;
    }
    return sent;
}

