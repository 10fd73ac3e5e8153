/* The stories260K model and llama2.c's greedy reference (../shared/models), loaded once by the
 * suites that check generation against it. Header-only; the including suite links cJSON. */
#ifndef KVS_TESTS_TEST_REFERENCE_H
#define KVS_TESTS_TEST_REFERENCE_H

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine/model.h"
#include "test_util.h"

#define REF_MAX_CASES 8
#define REF_MAX_IDS 300

typedef struct ref_case {
    int32_t prompt[64];
    int n_prompt;
    int32_t completion[REF_MAX_IDS];
    int n_completion;
    char text[4096]; /* completion_text */
} ref_case;

static inline int ref_read_ids(const cJSON *arr, int32_t *out, int cap)
{
    int n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        if (n < cap)
            out[n] = (int32_t)it->valuedouble;
        n++;
    }
    return n;
}

/* Loads the model into *model, on kernel table kernels (NULL = auto), and the reference cases.
 * Returns 1 when loaded, 0 when the files are absent (test_model_path said so; the suite
 * skips), -1 on an error. */
static inline int ref_load_with(engine_model **model, ref_case *cases, int *n_cases,
                                const char *kernels, const struct kern_ops *table);
static inline int ref_load_on(engine_model **model, ref_case *cases, int *n_cases,
                              const char *kernels)
{
    return ref_load_with(model, cases, n_cases, kernels, NULL);
}

/* ref_load_on, with engine_load_params.kern_table (tests' own tables: kern_avx512_emu_ops). */
static inline int ref_load_with(engine_model **model, ref_case *cases, int *n_cases,
                                const char *kernels, const struct kern_ops *table)
{
    char path[1024], ref[1024], err[256];
    *model = NULL;
    *n_cases = 0;
    if (!test_model_path(path, sizeof path, "stories260K.gguf") ||
        !test_model_path(ref, sizeof ref, "reference/stories260K-greedy.json"))
        return 0;
    engine_load_params lp = {.verbose = false, .kernels = kernels, .kern_table = table};
    if (engine_model_load(path, &lp, model, err, sizeof err)) {
        fprintf(stderr, "load failed: %s\n", err);
        return -1;
    }
    FILE *f = fopen(ref, "rb");
    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    buf[fread(buf, 1, (size_t)n, f)] = 0;
    fclose(f);
    cJSON *j = cJSON_Parse(buf);
    free(buf);
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "cases"))
    {
        if (*n_cases == REF_MAX_CASES)
            break;
        ref_case *rc = &cases[(*n_cases)++];
        rc->n_prompt = ref_read_ids(cJSON_GetObjectItem(c, "prompt_ids"), rc->prompt, 64);
        rc->n_completion =
            ref_read_ids(cJSON_GetObjectItem(c, "completion_ids"), rc->completion, REF_MAX_IDS);
        snprintf(rc->text, sizeof rc->text, "%s",
                 cJSON_GetObjectItem(c, "completion_text")->valuestring);
    }
    cJSON_Delete(j);
    return 1;
}

static inline int ref_load(engine_model **model, ref_case *cases, int *n_cases)
{
    return ref_load_on(model, cases, n_cases, NULL);
}

#endif
