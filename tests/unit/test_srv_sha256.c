/* test_srv_sha256.c — SHA-256 against the FIPS 180-4 / NIST example vectors
 * and Python's hashlib for the padding boundaries (55, 56, 63, 64 bytes),
 * and the incremental form against the one-shot one. */
#include "server/base/sha256.h"
#include "tests/unit/check.h"

#include <stdlib.h>

static void hex(const uint8_t *d, char *out)
{
    for (int i = 0; i < SRV_SHA256_BYTES; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static void check_vec(const char *msg, size_t n, const char *want)
{
    uint8_t d[SRV_SHA256_BYTES];
    char got[2 * SRV_SHA256_BYTES + 1];
    srv_sha256(msg, n, d);
    hex(d, got);
    CHECK_MSG(strcmp(got, want) == 0, "sha256 of %zu bytes: %s", n, got);
}

TEST(test_vectors)
{
    check_vec("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    check_vec("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    check_vec("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 56,
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    char a[200];
    memset(a, 'a', sizeof a);
    check_vec(a, 55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
    check_vec(a, 63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34");
    check_vec(a, 64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
    check_vec(a, 200, "c2a908d98f5df987ade41b5fce213067efbcc21ef2240212a41e54b5e7c28ae5");
}

/* The incremental form equals the one-shot one for every split of the
 * input, and a copied context finishes a prefix while the original goes on. */
TEST(test_incremental)
{
    uint8_t msg[300];
    for (size_t i = 0; i < sizeof msg; i++)
        msg[i] = (uint8_t)(i * 7 + 3);
    for (size_t n = 0; n <= sizeof msg; n += 37) {
        uint8_t want[SRV_SHA256_BYTES], got[SRV_SHA256_BYTES];
        srv_sha256(msg, n, want);
        for (size_t cut = 0; cut <= n; cut += 13) {
            srv_sha256_ctx_t c;
            srv_sha256_init(&c);
            srv_sha256_update(&c, msg, cut);
            srv_sha256_ctx_t fork = c;
            srv_sha256_update(&c, msg + cut, n - cut);
            srv_sha256_final(&c, got);
            CHECK_MSG(memcmp(got, want, sizeof got) == 0, "n %zu cut %zu", n, cut);
            uint8_t pre[SRV_SHA256_BYTES];
            srv_sha256(msg, cut, want);
            srv_sha256_final(&fork, pre);
            CHECK_MSG(memcmp(pre, want, sizeof pre) == 0, "prefix %zu", cut);
            srv_sha256(msg, n, want);
        }
    }
}

int main(void)
{
    RUN(test_vectors);
    RUN(test_incremental);
    return CHECK_DONE();
}
