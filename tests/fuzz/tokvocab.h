/* tokvocab.h - small GGUF-style vocabularies for the tokenizer harnesses
 * (fuzz_tokenizer.c, and the seeds of fuzz_tokvocab.c): a byte-level BPE one
 * whose 256 byte tokens make every input encodable and decodable back to the
 * same bytes, and a SentencePiece one with <0xNN> byte fallback.  Header-only
 * (static inline functions, so a file may use one and not the other) so each
 * harness stays one file plus replay.c; tests/unit/test_prompts.c uses it too. */
#ifndef KVP_FUZZ_TOKVOCAB_H
#define KVP_FUZZ_TOKVOCAB_H

#include "meta.h"
#include "unicode.h"

#include <stdio.h>
#include <string.h>

#define TV_MAX 400

typedef struct tv_list {
    char text[TV_MAX][24];
    const char *ptr[TV_MAX];
    size_t len[TV_MAX];
    int32_t type[TV_MAX];
    float score[TV_MAX];
    size_t n;
} tv_list;

static inline void tv_add(tv_list *l, const char *s, size_t len, int32_t type, float score)
{
    memcpy(l->text[l->n], s, len);
    l->text[l->n][len] = '\0';
    l->len[l->n] = len;
    l->type[l->n] = type;
    l->score[l->n] = score;
    l->n++;
}

/* GPT-2's byte -> code point map (FACTS.md, "GPT-2 byte-level BPE"). */
static inline uint32_t tv_byte_cp(int b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
        return (uint32_t)b;
    int n = 0;
    for (int k = 0; k < b; k++)
        if (!((k >= 33 && k <= 126) || (k >= 161 && k <= 172) || k >= 174))
            n++;
    return 0x100u + (uint32_t)n;
}

static inline int tv_finish(kvp_meta *m, tv_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        l->ptr[i] = l->text[i];
    int rc = kvp_meta_set_strarr(m, "tokenizer.ggml.tokens", l->ptr, l->len, l->n);
    rc = rc ? rc : kvp_meta_set_arr(m, "tokenizer.ggml.token_type", KVP_META_ARR_I32, l->type, l->n);
    return rc;
}

/* Byte-level BPE: the 256 byte tokens, a few merges, two control tokens.
 * pre: "gpt2", "smollm", "llama-bpe" or "qwen2". */
static inline int tv_gpt2(kvp_meta *m, const char *pre)
{
    static tv_list l;
    l.n = 0;
    char s[8];
    tv_add(&l, "<|endoftext|>", 13, 3, 0);
    tv_add(&l, "<|im_start|>", 12, 3, 0);
    tv_add(&l, "<|im_end|>", 10, 3, 0);
    for (int b = 0; b < 256; b++)
        tv_add(&l, s, kvp_unicode_encode(tv_byte_cp(b), s), 1, 0);
    /* "\xc4\xa0" is U+0120, the byte-level space */
    static const char *const merged[] = {"\xc4\xa0t", "he", "\xc4\xa0the", "in", "\xc4\xa0\x61" /* a: a hex escape takes every hex digit */, "12", "\xc4\xa0\xc4\xa0"};
    static const char *const merges[] = {"\xc4\xa0 t", "h e", "\xc4\xa0t he", "i n", "\xc4\xa0 a", "1 2",
                                         "\xc4\xa0 \xc4\xa0"};
    for (size_t i = 0; i < sizeof merged / sizeof merged[0]; i++)
        tv_add(&l, merged[i], strlen(merged[i]), 1, 0);
    size_t lens[7];
    for (int i = 0; i < 7; i++)
        lens[i] = strlen(merges[i]);
    int rc = kvp_meta_set_str(m, "tokenizer.ggml.model", "gpt2", 4);
    rc = rc ? rc : kvp_meta_set_str(m, "tokenizer.ggml.pre", pre, strlen(pre));
    rc = rc ? rc : tv_finish(m, &l);
    rc = rc ? rc : kvp_meta_set_strarr(m, "tokenizer.ggml.merges", merges, lens, 7);
    rc = rc ? rc : kvp_meta_set_u64(m, "tokenizer.ggml.bos_token_id", 1);
    rc = rc ? rc : kvp_meta_set_u64(m, "tokenizer.ggml.eos_token_id", 2);
    return rc;
}

/* SentencePiece BPE: <unk> <s> </s>, the 256 <0xNN> byte tokens, pieces with scores. */
static inline int tv_spm(kvp_meta *m)
{
    static tv_list l;
    l.n = 0;
    tv_add(&l, "<unk>", 5, 2, 0);
    tv_add(&l, "<s>", 3, 3, 0);
    tv_add(&l, "</s>", 4, 3, 0);
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        tv_add(&l, s, 6, 6, 0);
    }
    /* "\xe2\x96\x81" is U+2581, SentencePiece's space */
    static const char *const pieces[] = {"\xe2\x96\x81", "t", "h", "e", "a", "\xe2\x96\x81t", "he",
                                         "\xe2\x96\x81the", "\xc3\xa9", "\xe2\x96\x81\xe2\x96\x81"};
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++)
        tv_add(&l, pieces[i], strlen(pieces[i]), 1, -(float)i);
    int rc = kvp_meta_set_str(m, "tokenizer.ggml.model", "llama", 5);
    rc = rc ? rc : tv_finish(m, &l);
    rc = rc ? rc : kvp_meta_set_arr(m, "tokenizer.ggml.scores", KVP_META_ARR_F32, l.score, l.n);
    rc = rc ? rc : kvp_meta_set_u64(m, "tokenizer.ggml.bos_token_id", 1);
    rc = rc ? rc : kvp_meta_set_u64(m, "tokenizer.ggml.eos_token_id", 2);
    rc = rc ? rc : kvp_meta_set_u64(m, "tokenizer.ggml.unknown_token_id", 0);
    return rc;
}

#endif
