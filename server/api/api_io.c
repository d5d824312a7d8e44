/* server/api/api_io.c — the session store's disk work off the loop thread.
 *
 * Writing, reading and fsyncing a session state takes milliseconds to
 * seconds (3-15 MB for DARKFormer states, hundreds of MB for long exact
 * ones); on the loop thread it would stop every other connection meanwhile
 * (measured: /health took 616 ms under 20 forks + exports). So one I/O thread
 * runs the store calls that touch the disk, in the order they were
 * submitted, and hands each back to the loop thread for its answer (through
 * app->wake, like the engine's events).
 *
 * One thread, not libuv's pool: submission order is execution order, and
 * the stop hook can finish every queued item synchronously (join the
 * thread, run the completions) before it frees the store. After
 * api_io_stop, submissions run inline.
 */
#include "server/api/api.h"

#include <stddef.h>
#include <stdlib.h>

static void *io_main(void *arg)
{
    api_app_t *app = arg;
    pthread_mutex_lock(&app->io_mu);
    for (;;) {
        while (!app->io_head && !app->io_quit)
            pthread_cond_wait(&app->io_cv, &app->io_mu);
        api_io_t *io = app->io_head;
        if (!io)
            break; /* quit, and nothing left */
        app->io_head = io->next;
        if (!app->io_head)
            app->io_tail = NULL;
        pthread_mutex_unlock(&app->io_mu);
        io->next = NULL;
        io->work(io);
        pthread_mutex_lock(&app->io_mu);
        if (app->io_done_tail)
            app->io_done_tail->next = io;
        else
            app->io_done_head = io;
        app->io_done_tail = io;
        pthread_mutex_unlock(&app->io_mu);
        uv_async_send(&app->wake);
        pthread_mutex_lock(&app->io_mu);
    }
    pthread_mutex_unlock(&app->io_mu);
    return NULL;
}

int api_io_start(api_app_t *app)
{
    pthread_mutex_init(&app->io_mu, NULL);
    pthread_cond_init(&app->io_cv, NULL);
    if (pthread_create(&app->io_thread, NULL, io_main, app) != 0) {
        pthread_cond_destroy(&app->io_cv);
        pthread_mutex_destroy(&app->io_mu);
        return -1;
    }
    app->io_running = 1;
    return 0;
}

void api_io_submit(api_app_t *app, api_io_t *io)
{
    io->next = NULL;
    app->io_pending++;
    if (!app->io_running) { /* stopping (or never started): synchronously */
        io->work(io);
        app->io_pending--;
        io->done(io);
        return;
    }
    pthread_mutex_lock(&app->io_mu);
    if (app->io_tail)
        app->io_tail->next = io;
    else
        app->io_head = io;
    app->io_tail = io;
    pthread_cond_signal(&app->io_cv);
    pthread_mutex_unlock(&app->io_mu);
}

void api_io_pump(api_app_t *app)
{
    if (!app->io_running && !app->io_done_head)
        return;
    pthread_mutex_lock(&app->io_mu);
    api_io_t *io = app->io_done_head;
    app->io_done_head = app->io_done_tail = NULL;
    pthread_mutex_unlock(&app->io_mu);
    while (io) {
        api_io_t *next = io->next;
        app->io_pending--;
        io->done(io); /* frees io */
        io = next;
    }
}

void api_io_stop(api_app_t *app)
{
    if (!app->io_running)
        return;
    pthread_mutex_lock(&app->io_mu);
    app->io_quit = 1;
    pthread_cond_signal(&app->io_cv);
    pthread_mutex_unlock(&app->io_mu);
    pthread_join(app->io_thread, NULL); /* it runs everything queued first */
    app->io_running = 0; /* what the completions submit now runs inline */
    api_io_pump(app);
    pthread_cond_destroy(&app->io_cv);
    pthread_mutex_destroy(&app->io_mu);
}
