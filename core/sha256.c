/* SHA-256 fingerprints of raw bytes and of arrays, via nettle (a maintained library, not hand-rolled). */
#include "tpk/io.h"

#include <nettle/sha2.h>
#include <stdint.h>
#include <string.h>

/* nettle rather than OpenSSL: its hash calls cannot fail (no provider loading, no allocation),
 * which is what a void-returning tpk_sha256_hex needs. */

static void to_hex(const uint8_t digest[SHA256_DIGEST_SIZE], char out[65])
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < SHA256_DIGEST_SIZE; i++) {
        out[2 * i] = hex[digest[i] >> 4];
        out[2 * i + 1] = hex[digest[i] & 15];
    }
    out[64] = '\0';
}

void tpk_sha256_hex(const void *data, size_t n, char out[65])
{
    struct sha256_ctx h;
    uint8_t digest[SHA256_DIGEST_SIZE];
    sha256_init(&h);
    if (n > 0)
        sha256_update(&h, n, data);
    sha256_digest(&h, sizeof digest, digest);
    to_hex(digest, out);
}

static int host_is_little_endian(void)
{
    const uint16_t one = 1;
    uint8_t first;
    memcpy(&first, &one, 1);
    return first == 1;
}

void tpk_sha256_array_hex(const tpk_array *a, char out[65])
{
    struct sha256_ctx h;
    uint8_t digest[SHA256_DIGEST_SIZE];
    size_t n = tpk_array_size(a);
    sha256_init(&h);
    if (host_is_little_endian()) {
        if (n > 0)
            sha256_update(&h, n * sizeof(double), (const uint8_t *)a->data);
    } else {
        /* The fingerprint is defined on little-endian bytes so it is the same on every host;
         * convert in small blocks rather than copying the whole array. */
        uint8_t block[512 * 8];
        size_t i = 0;
        while (i < n) {
            size_t m = n - i < 512 ? n - i : 512;
            for (size_t k = 0; k < m; k++) {
                uint64_t u;
                memcpy(&u, &a->data[i + k], 8);
                for (int b = 0; b < 8; b++)
                    block[8 * k + (size_t)b] = (uint8_t)(u >> (8 * b));
            }
            sha256_update(&h, 8 * m, block);
            i += m;
        }
    }
    sha256_digest(&h, sizeof digest, digest);
    to_hex(digest, out);
}
