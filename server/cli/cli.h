/* server/cli/cli.h — the one-shot subcommands of the darkserve binary. Each takes
 * the arguments after its name and returns the process exit code
 * (0 ok, 1 runtime failure, 2 usage error). */
#ifndef DARKSERVE_SERVER_CLI_H
#define DARKSERVE_SERVER_CLI_H

int srv_cli_info(int argc, char **argv);
int srv_cli_generate(int argc, char **argv);
int srv_cli_perplexity(int argc, char **argv);
int srv_cli_tokenize(int argc, char **argv);
/* server/cli/cli_chat.c: the interactive terminal client of a (started) server */
int srv_cli_chat(int argc, char **argv);

#endif
