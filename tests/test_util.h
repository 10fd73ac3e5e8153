/* Helpers shared by the cmocka suites: where the shared models live, and skipping when absent. */
#ifndef KVS_TESTS_TEST_UTIL_H
#define KVS_TESTS_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* KVS_SHARED_MODELS is set by meson to ../shared/models (override with the env variable). */
static inline const char *test_models_dir(void)
{
    const char *env = getenv("KVS_SHARED_MODELS");
    return env && *env ? env : KVS_SHARED_MODELS;
}

/* Fills buf with models_dir/rel; returns 1 if the file exists, else prints why and returns 0. */
static inline int test_model_path(char *buf, size_t cap, const char *rel)
{
    snprintf(buf, cap, "%s/%s", test_models_dir(), rel);
    if (access(buf, R_OK) == 0)
        return 1;
    fprintf(stderr, "SKIP: %s not found (tests read ../shared/models; see MODELS.md)\n", buf);
    return 0;
}

#endif
