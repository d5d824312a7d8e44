/* server/store/store_test.h — for tests and fuzz targets only: the parts of the
 * session store (server/store/store.h) that no production code calls.
 *
 * The server sets a held session's chat flag (srv_session_set_has_chat) and
 * the store keeps it in the session's file, but nothing reads it back
 * through the API; the unit tests do, to check that it survives a write
 * and a load.
 *
 * Implemented in server/store/store.c; nothing under server/ other than that file
 * includes this header.
 */
#ifndef DARKSERVE_SERVER_STORE_TEST_H
#define DARKSERVE_SERVER_STORE_TEST_H

#include "server/store/store.h"

/* 1 when the held session's conversation started with a chat render. */
int srv_session_has_chat(const srv_session_t *s);

#endif
