/* tests/helpers/chat_render.c — renders a conversation with core/chat for the
 * Python oracle (tests/reference/test_chat_oracle.py compares it with the
 * model's own Jinja template).
 *
 *   chat_render (--template FILE | --name NAME) [--gen] [--bos]
 *               [--continue [--open]] [--info]
 *   stdin: messages as role NUL content NUL role NUL content NUL ...
 *   stdout: the rendered text, byte for byte; with --info instead
 *           "kind=NAME fallback=0|1 default_system_len=N" and a second line
 *           with the default system prompt.
 *   Exit status 2 and the error on stderr when a core call fails.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/text/chat.h"

#define MAX_INPUT (4u << 20)
#define MAX_MSGS 4096

static char *read_all(FILE *f, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *b = malloc(cap + 1);
    if (!b)
        return NULL;
    for (;;) {
        if (n == cap) {
            if (cap >= MAX_INPUT) {
                free(b);
                return NULL;
            }
            cap *= 2;
            char *nb = realloc(b, cap + 1);
            if (!nb) {
                free(b);
                return NULL;
            }
            b = nb;
        }
        size_t r = fread(b + n, 1, cap - n, f);
        if (r == 0)
            break;
        n += r;
    }
    b[n] = '\0';
    *len = n;
    return b;
}

int main(int argc, char **argv)
{
    const char *tfile = NULL, *name = NULL;
    int info = 0, cont = 0;
    core_chat_opts_t o = {0, 0, 0, 0};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--template") == 0 && i + 1 < argc)
            tfile = argv[++i];
        else if (strcmp(argv[i], "--name") == 0 && i + 1 < argc)
            name = argv[++i];
        else if (strcmp(argv[i], "--gen") == 0)
            o.add_generation_prompt = 1;
        else if (strcmp(argv[i], "--bos") == 0)
            o.add_bos_text = 1;
        else if (strcmp(argv[i], "--continue") == 0)
            cont = 1;
        else if (strcmp(argv[i], "--open") == 0)
            o.assistant_turn_open = 1;
        else if (strcmp(argv[i], "--info") == 0)
            info = 1;
        else {
            fprintf(stderr, "chat_render: unknown argument '%s'\n", argv[i]);
            return 1;
        }
    }
    core_error_t e = {0};
    core_chat_tmpl_t t;
    char *text = NULL;
    if (tfile) {
        FILE *f = fopen(tfile, "rb");
        size_t tl;
        if (!f || !(text = read_all(f, &tl))) {
            fprintf(stderr, "chat_render: cannot read %s\n", tfile);
            return 1;
        }
        fclose(f);
    }
    if (core_chat_tmpl_init(name, text, &t, &e) != 0) {
        fprintf(stderr, "chat_render: %s\n", e.msg);
        return 2;
    }
    free(text);
    if (info) {
        printf("kind=%s fallback=%d default_system_len=%zu\n%.*s\n", core_chat_kind_name(t.kind),
               t.fallback, t.default_system_len, (int)t.default_system_len, t.default_system);
        return 0;
    }
    size_t len;
    char *in = read_all(stdin, &len);
    if (!in)
        return 1;
    static core_chat_msg_t msgs[MAX_MSGS];
    size_t n = 0, pos = 0;
    while (pos < len) {
        const char *role = in + pos;
        pos += strlen(role) + 1;
        if (pos >= len + 1 || n == MAX_MSGS) {
            fprintf(stderr, "chat_render: malformed input\n");
            return 1;
        }
        const char *content = in + pos;
        pos += strlen(content) + 1;
        msgs[n++] = (core_chat_msg_t){role, content};
    }
    char *out = NULL;
    size_t olen = 0;
    int rc = cont ? core_chat_render_continue(&t, msgs, n, &o, CORE_CHAT_MAX_OUTPUT, &out, &olen, &e)
                  : core_chat_render(&t, msgs, n, &o, CORE_CHAT_MAX_OUTPUT, &out, &olen, &e);
    if (rc != 0) {
        fprintf(stderr, "chat_render: %s\n", e.msg);
        return 2;
    }
    fwrite(out, 1, olen, stdout);
    free(out);
    free(in);
    return 0;
}
