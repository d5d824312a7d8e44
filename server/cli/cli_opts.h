/* server/cli/cli_opts.h — declarative option tables for the CLI subcommands.
 *
 * Each subcommand describes its flags once (name, kind, target, bounds, help);
 * the same table drives parsing (--name VALUE and --name=VALUE), validation
 * with a message naming the flag, and --help. Unknown flags and bad values are
 * errors. The daemon's own configuration (server/config.h) has its own richer
 * table with env vars; this one is for the one-shot commands.
 */
#ifndef DARKSERVE_SERVER_CLI_OPTS_H
#define DARKSERVE_SERVER_CLI_OPTS_H

#include <stddef.h>
#include <stdint.h>

typedef enum srv_opt_kind {
    SRV_OPT_STR,   /* const char **target; borrowed from argv */
    SRV_OPT_INT,   /* int64_t *target, bounds min..max */
    SRV_OPT_FLOAT, /* double *target, bounds min..max */
    SRV_OPT_FLAG   /* int *target set to 1, takes no value */
} srv_opt_kind_t;

typedef struct srv_opt {
    const char *name; /* without the leading "--" */
    srv_opt_kind_t kind;
    void *target;
    double min, max;  /* for INT and FLOAT */
    const char *help;
} srv_opt_t;

/* Parses argv[0..argc) against opts[0..n). Positional arguments are stored in
 * pos[] (borrowed from argv) up to max_pos. Returns 0, 1 when --help was given
 * (help already printed to stdout), or -1 after printing an error to stderr. */
int srv_opts_parse(const char *cmd, const char *usage, const srv_opt_t *opts, size_t n, int argc,
                   char **argv, const char **pos, int max_pos, int *n_pos);

#endif
