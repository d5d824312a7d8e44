/* server/cli/cli_opts.c — table-driven flag parsing for the CLI subcommands. */
#include "server/cli/cli_opts.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The --help text of a subcommand, to stdout. */
static void srv_opts_help(const char *cmd, const char *usage, const srv_opt_t *opts, size_t n)
{
    printf("usage: darkserve %s %s\n\noptions:\n", cmd, usage);
    for (size_t i = 0; i < n; i++) {
        const srv_opt_t *o = &opts[i];
        const char *arg = o->kind == SRV_OPT_STR ? " TEXT" : o->kind == SRV_OPT_INT ? " N"
                          : o->kind == SRV_OPT_FLOAT ? " X" : "";
        printf("  --%s%s\n      %s", o->name, arg, o->help);
        if (o->kind == SRV_OPT_INT)
            printf(" [%.0f..%.0f]", o->min, o->max);
        else if (o->kind == SRV_OPT_FLOAT)
            printf(" [%g..%g]", o->min, o->max);
        printf("\n");
    }
    printf("  --help\n      this text\n");
}

static int set_value(const char *cmd, const srv_opt_t *o, const char *val)
{
    char *end = NULL;
    errno = 0;
    switch (o->kind) {
    case SRV_OPT_STR:
        *(const char **)o->target = val;
        return 0;
    case SRV_OPT_INT: {
        long long v = strtoll(val, &end, 10);
        if (errno || end == val || *end || (double)v < o->min || (double)v > o->max) {
            fprintf(stderr, "darkserve %s: --%s expects an integer in [%.0f, %.0f], got '%s'\n",
                    cmd, o->name, o->min, o->max, val);
            return -1;
        }
        *(int64_t *)o->target = v;
        return 0;
    }
    case SRV_OPT_FLOAT: {
        double v = strtod(val, &end);
        if (errno || end == val || *end || !isfinite(v) || v < o->min || v > o->max) {
            fprintf(stderr, "darkserve %s: --%s expects a number in [%g, %g], got '%s'\n", cmd,
                    o->name, o->min, o->max, val);
            return -1;
        }
        *(double *)o->target = v;
        return 0;
    }
    case SRV_OPT_FLAG:
        *(int *)o->target = 1;
        return 0;
    }
    return -1;
}

int srv_opts_parse(const char *cmd, const char *usage, const srv_opt_t *opts, size_t n, int argc,
                   char **argv, const char **pos, int max_pos, int *n_pos)
{
    *n_pos = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            for (i++; i < argc; i++) {
                if (*n_pos >= max_pos)
                    goto too_many;
                pos[(*n_pos)++] = argv[i];
            }
            break;
        }
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            if (*n_pos >= max_pos)
                goto too_many;
            pos[(*n_pos)++] = a;
            continue;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            srv_opts_help(cmd, usage, opts, n);
            return 1;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const srv_opt_t *o = NULL;
        for (size_t k = 0; k < n; k++)
            if (strlen(opts[k].name) == len && strncmp(opts[k].name, name, len) == 0)
                o = &opts[k];
        if (!o) {
            fprintf(stderr, "darkserve %s: unknown option '%.*s' (see --help)\n", cmd,
                    (int)(len + 2), a);
            return -1;
        }
        const char *val = NULL;
        if (o->kind == SRV_OPT_FLAG) {
            if (eq) {
                fprintf(stderr, "darkserve %s: --%s takes no value\n", cmd, o->name);
                return -1;
            }
        } else if (eq) {
            val = eq + 1;
        } else if (i + 1 < argc) {
            val = argv[++i];
        } else {
            fprintf(stderr, "darkserve %s: --%s needs a value\n", cmd, o->name);
            return -1;
        }
        if (set_value(cmd, o, val) < 0)
            return -1;
    }
    return 0;
too_many:
    fprintf(stderr, "darkserve %s: too many arguments (usage: darkserve %s %s)\n", cmd, cmd, usage);
    return -1;
}
