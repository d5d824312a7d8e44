/* server/main.c — the darkserve binary: dispatches to a subcommand. */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/kernels/blas.h"
#include "core/kernels/cpu.h"
#include "server/cli/cli.h"
#include "server/base/version.h"

#include "server/daemon.h"

extern const srv_app_t srv_darkserve_app; /* server/api/api_app.c */

static void usage(FILE *f)
{
    fprintf(f,
            "darkserve %s — LLM inference server with DARKFormer linear attention\n\n"
            "usage: darkserve COMMAND [options]   (darkserve COMMAND --help for its options)\n\n"
            "commands:\n"
            "  serve       run the HTTP server\n"
            "  chat        chat with a server in the terminal (starts one unless --url)\n"
            "  generate    generate text from a prompt on stdout\n"
            "  perplexity  score a text file\n"
            "  tokenize    show the tokens of a text\n"
            "  info        describe a GGUF model file\n"
            "  version     print the version\n",
            DARKSERVE_VERSION);
}

/* See core_blas_better_coretype(): re-execute once with OPENBLAS_CORETYPE
 * set when OpenBLAS picked its generic kernels on a CPU with AVX2/AVX-512.
 * An OPENBLAS_CORETYPE already in the environment (the user's choice, or
 * ours after the re-exec) is kept. If exec fails, run on as we are. */
static void pick_blas_kernels(char **argv)
{
    if (getenv("OPENBLAS_CORETYPE"))
        return;
    const char *ct = core_blas_better_coretype();
    if (!ct || setenv("OPENBLAS_CORETYPE", ct, 1) != 0)
        return;
    execv("/proc/self/exe", argv);
}

/* Attention states are multi-MB blocks that come and go with sessions and
 * requests. glibc raises its mmap threshold each time such a block, mmap'd,
 * is freed (up to 32 MB), so the next ones come from the heap, where one
 * live block above freed ones pins them all: after a soak the RSS stayed
 * 1 GB above the live state. A fixed threshold (which also stops
 * the dynamic one) keeps every block from 1 MiB up in its own mapping,
 * returned to the system when freed. */
#define LARGE_BLOCK_MMAP (1u << 20)

int main(int argc, char **argv)
{
    mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK_MMAP);
    pick_blas_kernels(argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    /* a path the user named that cannot run is refused, not replaced */
    if (core_qdot_env_error()) {
        fprintf(stderr, "darkserve: %s\n", core_qdot_env_error());
        return 2;
    }
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("darkserve %s\nopenblas: %s\nqdot: %s\nqdot paths:", DARKSERVE_VERSION,
               core_blas_corename(), core_qdot_isa_name(core_qdot_isa()));
        for (int i = 0; i < CORE_QDOT_ISA_COUNT_; i++) /* every path this CPU runs */
            if (core_qdot_force_isa((core_qdot_isa_t)i) == 0)
                printf(" %s", core_qdot_isa_name((core_qdot_isa_t)i));
        (void)core_qdot_force_isa(CORE_QDOT_ISA_COUNT_);
        printf("\n");
        return 0;
    }
    if (strcmp(cmd, "serve") == 0)
        return srv_serve_run(argc - 2, argv + 2, &srv_darkserve_app);
    if (strcmp(cmd, "generate") == 0)
        return srv_cli_generate(argc - 2, argv + 2);
    if (strcmp(cmd, "perplexity") == 0)
        return srv_cli_perplexity(argc - 2, argv + 2);
    if (strcmp(cmd, "tokenize") == 0)
        return srv_cli_tokenize(argc - 2, argv + 2);
    if (strcmp(cmd, "chat") == 0)
        return srv_cli_chat(argc - 2, argv + 2);
    if (strcmp(cmd, "info") == 0)
        return srv_cli_info(argc - 2, argv + 2);
    fprintf(stderr, "darkserve: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
