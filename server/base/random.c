/* server/base/random.c — random bytes and random hex ids (server/base/random.h). */
#include "server/base/random.h"

#include <errno.h>
#include <stdint.h>
#include <sys/random.h>
#include <time.h>

#include "proto/proto.h"

int srv_random_bytes(void *buf, size_t n)
{
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t r = getrandom(p, n, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

uint64_t srv_random_u64(void)
{
    uint64_t v = 0;
    if (srv_random_bytes(&v, sizeof v) != 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        v = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15u ^ (uint64_t)ts.tv_sec;
    }
    return v;
}

void srv_random_hex(char *out, size_t nbytes)
{
    unsigned char b[32] = {0};
    if (nbytes > sizeof b)
        nbytes = sizeof b;
    for (size_t i = 0; i < nbytes; i += 8) {
        uint64_t v = srv_random_u64();
        for (size_t k = 0; k < 8 && i + k < nbytes; k++)
            b[i + k] = (unsigned char)(v >> (8 * k));
    }
    proto_hex_format(b, nbytes, out);
}
