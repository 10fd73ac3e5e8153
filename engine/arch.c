/* The registry of model families: one row per family file (arch.h). */
#include "engine/arch.h"

#include <stdio.h>
#include <string.h>

static const engine_arch *const ARCHS[] = {
    &engine__arch_llama,        &engine__arch_qwen2,      &engine__arch_qwen3,
    &engine__arch_qwen3moe,     &engine__arch_gemma2,     &engine__arch_gemma3,
    &engine__arch_phi3,         &engine__arch_gpt_oss,    &engine__arch_smollm3,
    &engine__arch_granite,      &engine__arch_granitemoe, &engine__arch_ernie4_5,
    &engine__arch_ernie4_5_moe, &engine__arch_lfm2,       &engine__arch_lfm2moe,
    &engine__arch_olmo2,        &engine__arch_mistral3,   &engine__arch_gemma3n,
};

#define N_ARCHS (sizeof ARCHS / sizeof ARCHS[0])

const engine_arch *engine__arch_find(const char *name, size_t len)
{
    for (size_t i = 0; i < N_ARCHS; i++)
        if (strlen(ARCHS[i]->name) == len && !memcmp(ARCHS[i]->name, name, len))
            return ARCHS[i];
    return NULL;
}

const char *engine__arch_list(char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < N_ARCHS && n + 1 < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", ARCHS[i]->name);
    return buf;
}
