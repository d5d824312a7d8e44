/* server/base/random.h — random bytes and random hex ids from the kernel
 * (getrandom), for session ids, request ids and completion ids. */
#ifndef DARKSERVE_SERVER_RANDOM_H
#define DARKSERVE_SERVER_RANDOM_H

#include <stddef.h>
#include <stdint.h>

/* Fills buf[n] with random bytes (an interrupted call is retried). 0, or the
 * errno of the getrandom call that failed (buf then holds no promise). */
int srv_random_bytes(void *buf, size_t n);

/* 64 random bits; never fails: without getrandom, they come from the
 * clock (for sampler seeds). */
uint64_t srv_random_u64(void);

/* Random lowercase hex id of 2*nbytes characters and a NUL into out
 * (nbytes <= 32), srv_random_u64 8 bytes at a time. Never fails (ids
 * that must be unguessable use srv_random_bytes). */
void srv_random_hex(char *out, size_t nbytes);

#endif
