/* Stand-in for kvserve generate, built only while server/cmd_generate.c is absent. */
#include <stdio.h>

#include "server/commands.h"

int cmd_generate(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "kvserve generate: not built into this binary\n");
    return 2;
}
