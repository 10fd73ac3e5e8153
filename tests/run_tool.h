/* Runs a helper program (kvs-mkmodel, llama-quantize) for a test's fixture: header-only, shared
 * by the suites that write their own model files. */
#ifndef KVS_TESTS_RUN_TOOL_H
#define KVS_TESTS_RUN_TOOL_H

#include <fcntl.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

/* argv[0] with argv (NULL-terminated), its output to /dev/null; 0 if it exited with 0 */
static inline int run_tool_quiet(const char *const argv[])
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) {
            dup2(devnull, 1);
            dup2(devnull, 2);
        }
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return -1;
    return 0;
}

#endif
