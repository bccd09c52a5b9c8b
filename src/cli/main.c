/* pipescope CLI entry point: a command table, one file per subcommand. */
#include <stdio.h>
#include <string.h>

#include "ps_config.h"

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "version") == 0) {
        printf("pipescope %s\n", PS_VERSION);
        return 0;
    }
    fprintf(stderr, "usage: pipescope COMMAND SPEC [options]\n");
    return 2;
}
