/* test_runopts.c - the run options' defaults that depend on other options
 * (lib/engine/runopts.c): the step's token budget by backend. */
#include "runopts.h"
#include "unit.h"

/* The budget after init, the given options (getopt codes and arguments,
 * n of them) and kvp_runopts_set_budget. */
static uint32_t budget(const char *backend, int n, const int *codes, const char *const *args)
{
    kvp_runopts o;
    kvp_runopts_init(&o);
    for (int i = 0; i < n; i++)
        CHECK(kvp_runopts_parse(&o, codes[i], args[i]) == 1);
    if (backend)
        o.backend = backend;
    kvp_runopts_set_budget(&o);
    uint32_t b = o.sched.max_batched_tokens;
    kvp_runopts_free(&o);
    return b;
}

int main(void)
{
    /* no option: 512 on the CPU (the default backend, or named), 2048 on a GPU */
    CHECK(budget(NULL, 0, NULL, NULL) == KVP_BUDGET_CPU);
    CHECK(budget("cpu", 0, NULL, NULL) == 512);
    CHECK(budget("cuda", 0, NULL, NULL) == 2048);
    /* -g names the CUDA backend as --backend cuda does */
    int g = 'g';
    const char *none[] = {NULL};
    CHECK(budget(NULL, 1, &g, none) == KVP_BUDGET_GPU);
    /* a budget given is kept on either backend, by --max-batched-tokens or --chunk */
    int mbt = KVP_OPT_MAX_BATCHED, chunk = KVP_OPT_CHUNK;
    const char *a100[] = {"100"};
    CHECK(budget("cuda", 1, &mbt, a100) == 100);
    CHECK(budget(NULL, 1, &mbt, a100) == 100);
    CHECK(budget("cuda", 1, &chunk, a100) == 100);
    return unit_done();
}
