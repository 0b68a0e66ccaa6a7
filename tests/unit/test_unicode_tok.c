/* test_unicode_tok.c - characters added in Unicode 15.0 and 15.1 tokenize as
 * llama.cpp tokenizes them (its unicode-data.cpp is 15.1): letters and
 * numbers of CJK Ext-H and Ext-I, Kawi, Kaktovik numerals, Nag Mundari,
 * Cyrillic Ext-D, Latin Ext-G and Khojki join their words and split off
 * "'s" as a letter would, where tables older than 15.0 took them for
 * punctuation.  Ids from llama-cpp-python 0.3.36,
 * Llama(path, vocab_only=True).tokenize(s, add_bos=True, special=False).
 * Needs llama.cpp's Llama-3 vocabulary and the SmolLM2 GGUF in the cache;
 * each part skips with a note when its file is absent. */
#include "gguf.h"
#include "tokenizer.h"
#include "unit.h"

#include <unistd.h>

typedef struct tok_case {
    const char *text;
    int32_t ids[12];
    size_t n;
} tok_case;

static const tok_case llama3_cases[] = {
    {"\U00031350's", {128000, 172, 109, 235, 238, 596}, 6},                 /* CJK Ext-H (15.0) */
    {" \U00011F50!", {128000, 220, 172, 239, 121, 238, 0}, 7},              /* Kawi digit zero (15.0) */
    {"\U0002EBF0\U0002EBF1's", {128000, 172, 106, 107, 108, 172, 106, 107, 109, 596}, 10}, /* CJK Ext-I (15.1) */
    {"x \U0001D2C0\U0001D2C1!", {128000, 87, 220, 57352, 233, 222, 57352, 233, 223, 0}, 10}, /* Kaktovik */
    {" \U0001E4D0\U0001E4D1's", {128000, 109697, 252, 241, 238, 172, 252, 241, 239, 596}, 10}, /* Nag Mundari */
    {" \U0001E030\U0001E031's", {128000, 109697, 252, 222, 108, 172, 252, 222, 109, 596}, 10}, /* Cyrillic Ext-D */
    {"\U0001DF25's", {128000, 172, 46981, 98, 596}, 5},                    /* Latin Ext-G (15.0) */
    {" \U0001123F's", {128000, 109697, 239, 230, 123, 596}, 6},            /* Khojki (15.0) */
    {"\U0001E4F1\U0001E4F2's 1", {128000, 172, 252, 241, 109, 172, 252, 241, 110, 596, 220, 16}, 12}, /* Nag Mundari digits */
};

static const tok_case smollm2_cases[] = {
    {"\U00031350's", {187, 126, 231, 234, 506}, 5},
    {" \U00011F50!", {216, 187, 235, 138, 234, 17}, 6},
    {"\U0002EBF0\U0002EBF1's", {187, 123, 124, 125, 187, 123, 124, 126, 506}, 9},
    {"x \U0001D2C0\U0001D2C1!", {104, 216, 23159, 229, 218, 23159, 229, 219, 17}, 9},
    {" \U0001E4D0\U0001E4D1's", {216, 187, 248, 237, 234, 187, 248, 237, 235, 506}, 10},
    {" \U0001E030\U0001E031's", {216, 187, 248, 218, 125, 187, 248, 218, 126, 506}, 10},
    {"\U0001DF25's", {23159, 137, 115, 506}, 4},
    {" \U0001123F's", {216, 187, 235, 226, 140, 506}, 6},
    {"\U0001E4F1\U0001E4F2's 1", {187, 248, 237, 126, 187, 248, 237, 127, 506, 216, 33}, 11},
};

static void print_ids(const char *what, const int32_t *ids, size_t n)
{
    printf("  %s:", what);
    for (size_t i = 0; i < n; i++)
        printf(" %d", ids[i]);
    putchar('\n');
}

/* Each case through the vocabulary at path, BOS as the vocabulary says. */
static void run_cases(const char *path, const char *name, const tok_case *c, size_t nc)
{
    kvp_gguf g;
    kvp_err err;
    kvp_tokenizer *t = NULL;
    if (access(path, R_OK) != 0) {
        printf("skip: %s absent: %s cases not run\n", path, name);
        return;
    }
    if (kvp_gguf_open(&g, path, &err) < 0) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    int rc = kvp_tokenizer_load_meta(&t, &g.meta, path, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    for (size_t i = 0; t && i < nc; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        rc = kvp_tokenizer_encode(t, c[i].text, strlen(c[i].text), 0, -1, &ids, &n, &err);
        int same = rc == 0 && n == c[i].n && memcmp(ids, c[i].ids, n * sizeof *ids) == 0;
        CHECK_MSG(same, "%s case %zu", name, i);
        if (!same) {
            print_ids("want", c[i].ids, c[i].n);
            print_ids("got ", ids, rc == 0 ? n : 0);
        }
        free(ids);
    }
    kvp_tokenizer_free(t);
    kvp_gguf_close(&g);
}

int main(void)
{
    char path[4096];
    const char *cache = getenv("KVPIPE_CACHE"), *home = getenv("HOME");
    if (cache && *cache)
        snprintf(path, sizeof path, "%s/vocab/ggml-vocab-llama-bpe.gguf", cache);
    else
        snprintf(path, sizeof path, "%s/.cache/kvpipe/vocab/ggml-vocab-llama-bpe.gguf", home ? home : ".");
    run_cases(path, "Llama-3", llama3_cases, sizeof llama3_cases / sizeof *llama3_cases);
    run_cases(unit_model_path(), "SmolLM2", smollm2_cases, sizeof smollm2_cases / sizeof *smollm2_cases);
    return unit_done();
}
