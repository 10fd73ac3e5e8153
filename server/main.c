/* kvserve entry point: dispatches to a subcommand. The only place that exits the process. */
#include <stdio.h>
#include <string.h>

#include "server/commands.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvserve <command> [options]\n"
            "\n"
            "commands:\n"
            "  serve      run the OpenAI-compatible HTTP server (kvserve serve --help)\n"
            "  generate   complete one prompt from the command line (kvserve generate --help)\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "serve"))
        return cmd_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "generate"))
        return cmd_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        /* The whole manual: every flag of every command, with its default. */
        usage(stdout);
        char *serve_help[] = {"serve", "--help", NULL};
        char *gen_help[] = {"generate", "--help", NULL};
        printf("\n");
        cmd_serve(2, serve_help);
        printf("\n");
        cmd_generate(2, gen_help);
        return 0;
    }
    fprintf(stderr, "kvserve: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
