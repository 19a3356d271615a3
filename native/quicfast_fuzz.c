/* quicfast_fuzz: qf_open on mangled and random datagrams under AddressSanitizer and
 * UndefinedBehaviorSanitizer (`just test-native`).
 *
 * qf_open parses bytes from the network, so it must stay inside its buffers whatever
 * arrives. Each round seals a few real packets (random stream id, offset, lengths,
 * datagram size), then mangles the batch (bit flips, truncation, random bytes, a random
 * GRO segment size, random message splits) and opens it. Checks, beyond the
 * sanitizers' own: every record's status is known, runs cover at most the datagrams
 * given, every accepted run's data lies inside `plain` and, when the batch was not
 * mangled, equals what was sealed. A second phase seals crafted plaintexts (random
 * frame types, varints and lengths, as an authenticated but hostile peer could send)
 * with the same keys, so the frame parser itself meets bad input.
 * Deterministic (fixed seed); exit 0 on success. */
#include "quicfast.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROUNDS 100000
#define MAX_DGRAM 16383
#define MAX_PACKETS 8
#define BUF (MAX_PACKETS * MAX_DGRAM + 64)

static uint64_t state = 0x9e3779b97f4a7c15ULL;

static uint64_t next(void) { /* xorshift64* */
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 2685821657736338717ULL;
}

static size_t below(size_t n) { return n ? (size_t)(next() % n) : 0; }

static int fail(const char *what, int round) {
    fprintf(stderr, "quicfast_fuzz: round %d: %s\n", round, what);
    return 1;
}

static uint8_t key[16], iv[12], hp[16], dcid[8];

/* A short-header packet (2-byte packet number) around an arbitrary plaintext payload. */
static size_t seal_raw(const uint8_t *payload, size_t plen, uint64_t pn, uint8_t *out) {
    size_t head = 1 + sizeof(dcid) + 2;
    out[0] = 0x41;
    memcpy(out + 1, dcid, sizeof(dcid));
    out[head - 2] = (uint8_t)(pn >> 8);
    out[head - 1] = (uint8_t)pn;
    uint8_t nonce[12];
    memcpy(nonce, iv, 12);
    for (int i = 0; i < 8; i++) nonce[11 - i] ^= (uint8_t)(pn >> (8 * i));
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    int outl = 0;
    EVP_EncryptInit_ex(c, EVP_aes_128_gcm(), NULL, key, nonce);
    EVP_EncryptUpdate(c, NULL, &outl, out, (int)head);
    EVP_EncryptUpdate(c, out + head, &outl, payload, (int)plen);
    EVP_EncryptFinal_ex(c, out + head + plen, &outl);
    EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, 16, out + head + plen);
    EVP_CIPHER_CTX_free(c);
    uint8_t mask[16];
    c = EVP_CIPHER_CTX_new();
    EVP_EncryptInit_ex(c, EVP_aes_128_ecb(), NULL, hp, NULL);
    EVP_CIPHER_CTX_set_padding(c, 0);
    EVP_EncryptUpdate(c, mask, &outl, out + head - 2 + 4, 16);
    EVP_CIPHER_CTX_free(c);
    out[0] ^= mask[0] & 0x1f;
    out[head - 2] ^= mask[1];
    out[head - 1] ^= mask[2];
    return head + plen + 16;
}

static size_t put_random_varint(uint8_t *p) {
    size_t len = (size_t)1 << below(4);
    p[0] = (uint8_t)((below(4) << 6) | (next() & 0x3f)); /* the prefix may lie */
    for (size_t i = 1; i < len; i++) p[i] = (uint8_t)next();
    return len;
}

static int crafted(qf_keys *k) {
    static uint8_t payload[4096], buf[8192], plain[8192];
    static qf_rx rx[8];
    long taken = 0;
    for (int round = 0; round < ROUNDS; round++) {
        size_t plen = 4 + below(sizeof(payload) - 4);
        for (size_t i = 0; i < plen; i++) payload[i] = below(4) ? 0 : (uint8_t)next();
        size_t at = 0;
        payload[at++] = (uint8_t)(0x08 | below(8)); /* STREAM with random OFF/LEN/FIN */
        at += put_random_varint(payload + at);    /* stream id */
        at += put_random_varint(payload + at);    /* offset */
        if (at + 8 < plen) at += put_random_varint(payload + at); /* length */
        if (below(4) == 0) payload[0] = (uint8_t)next();           /* any frame type */
        uint64_t pn = (uint64_t)round;
        size_t len = seal_raw(payload, plen, pn, buf);
        qf_msg msg = {.at = 0, .len = (uint32_t)len, .seg = 0};
        memset(plain, 0xAA, sizeof(plain));
        int runs = qf_open(k, buf, &msg, 1, dcid, sizeof(dcid), (int64_t)pn - 1, 0, plain,
                           rx, 8);
        if (runs != 1) return fail("a crafted packet did not give one record", round);
        if (rx[0].status == QF_STREAM) {
            taken++;
            if ((size_t)rx[0].data_at + rx[0].length > plen)
                return fail("crafted run data outside its payload", round);
        } else if (rx[0].status != QF_SLOW) {
            return fail("a crafted packet was not ours", round);
        }
    }
    printf("quicfast_fuzz: %d crafted plaintexts, %ld taken as STREAM\n", ROUNDS, taken);
    return 0;
}

int main(void) {
    for (size_t i = 0; i < sizeof(key); i++) key[i] = (uint8_t)next();
    for (size_t i = 0; i < sizeof(iv); i++) iv[i] = (uint8_t)next();
    for (size_t i = 0; i < sizeof(hp); i++) hp[i] = (uint8_t)next();
    for (size_t i = 0; i < sizeof(dcid); i++) dcid[i] = (uint8_t)next();
    qf_keys *k = qf_keys_new(QF_SUITE_AES_128_GCM, key, iv, hp);
    if (k == NULL) return fail("qf_keys_new failed", -1);
    static uint8_t data[BUF], buf[BUF], plain[BUF];
    static qf_tx tx[MAX_PACKETS];
    static qf_msg msgs[QF_MAX_MSGS];
    static qf_rx rx[64];
    for (size_t i = 0; i < sizeof(data); i++) data[i] = (uint8_t)next();
    uint64_t pn = 0;
    long accepted = 0;
    for (int round = 0; round < ROUNDS; round++) {
        size_t size = 1200 + below(MAX_DGRAM - 1200 + 1);
        int count = 1 + (int)below(MAX_PACKETS);
        size_t len = 1 + below((size_t)count * (size - 40));
        uint64_t offset = next() >> (3 + below(59));
        uint64_t sid = next() >> (2 + below(61));
        int built = qf_seal_stream(k, 0x40, dcid, sizeof(dcid), pn, sid, offset, data, len,
                                   size, count, buf, sizeof(buf), tx);
        if (built <= 0) return fail("seal built nothing", round);
        size_t total = 0;
        for (int i = 0; i < built; i++) total += tx[i].size;
        int mangled = (int)below(3); /* 0: as sealed; 1: a few bit flips; 2: random */
        if (mangled == 1) {
            for (size_t f = 1 + below(4); f; f--) buf[below(total)] ^= (uint8_t)(1u << below(8));
        } else if (mangled == 2) {
            for (size_t i = 0; i < total; i++) buf[i] = (uint8_t)next();
        }
        if (mangled && below(2)) total = below(total + 1); /* truncated */
        /* messages: the sealed sizes (one GRO buffer of equal segments) or random cuts */
        int nmsgs = 0;
        if (!mangled || below(2)) {
            msgs[0] = (qf_msg){.at = 0, .len = (uint32_t)total, .seg = (uint32_t)size};
            nmsgs = 1;
        } else {
            size_t at = 0;
            while (at < total && nmsgs < QF_MAX_MSGS) {
                size_t piece = below(total - at + 1);
                msgs[nmsgs] = (qf_msg){.at = (uint32_t)at, .len = (uint32_t)piece,
                                       .seg = (uint32_t)below(piece + 1)};
                at += piece;
                nmsgs++;
            }
        }
        memset(plain, 0xAA, sizeof(plain));
        int runs = qf_open(k, buf, msgs, nmsgs, dcid, sizeof(dcid), (int64_t)pn - 1, 0, plain,
                           rx, 64);
        if (runs < 0 || runs > 64) return fail("run count out of range", round);
        uint64_t seen = 0;
        for (int r = 0; r < runs; r++) {
            if (rx[r].status != QF_SLOW && rx[r].status != QF_STREAM &&
                rx[r].status != QF_OTHER_CID)
                return fail("unknown status", round);
            if ((int)rx[r].msg >= nmsgs) return fail("run names a message not given", round);
            seen += rx[r].count;
            if (rx[r].status != QF_STREAM) continue;
            accepted += rx[r].count;
            if ((size_t)rx[r].data_at + rx[r].length > total)
                return fail("run data outside plain", round);
            if (!mangled) {
                if (rx[r].stream_id != sid) return fail("wrong stream id", round);
                uint64_t at = rx[r].offset - offset;
                if (rx[r].offset < offset || at + rx[r].length > len ||
                    memcmp(plain + rx[r].data_at, data + at, rx[r].length) != 0)
                    return fail("opened data differs from sealed", round);
            }
        }
        if (!mangled && (runs != 1 || rx[0].status != QF_STREAM || rx[0].count != (uint32_t)built))
            return fail("an intact batch did not open as one run", round);
        if (seen > (uint64_t)built * 64 + 64) return fail("more datagrams than given", round);
        pn += (uint64_t)built + below(3);
    }
    printf("quicfast_fuzz: %d rounds, %ld packets accepted\n", ROUNDS, accepted);
    int rc = crafted(k);
    qf_keys_free(k);
    if (rc == 0) printf("quicfast_fuzz: sanitizers clean\n");
    return rc;
}
