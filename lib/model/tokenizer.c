/* tokenizer.c - byte-level BPE and SentencePiece BPE (see tokenizer.h).
 *
 * Layout: vocabulary and lookups; loading from metadata; special-token
 * splitting; pre-tokenizers; the two BPE loops; encode; detokenize.
 * Both BPE loops keep the word as a linked list of symbols and a binary heap
 * of candidate pairs with lazy deletion, so a word of m bytes costs
 * O(m log m), not O(m^2).
 */
#include "tokenizer.h"

#include "hash.h"
#include "unicode.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOK_MAX_EOG 16
/* Longest text one encode call takes (the scratch arrays scale with it). */
#define TOK_MAX_TEXT (1ull << 30)

typedef struct tok_merge {
    uint64_t key;   /* left id << 32 | right id; UINT64_MAX when the slot is empty */
    int32_t rank;   /* position in tokenizer.ggml.merges */
    int32_t id;     /* the merged token */
} tok_merge;

struct kvp_tokenizer {
    kvp_tok_model model;
    kvp_tok_pre pre;
    uint32_t n_vocab;
    char *text;             /* token texts, each NUL-terminated */
    uint64_t *text_off;     /* n_vocab + 1 offsets into text */
    char *piece;            /* output bytes of each token, same layout */
    uint64_t *piece_off;
    float *score;           /* n_vocab; SentencePiece merge priority */
    uint8_t *type;          /* n_vocab kvp_token_type */
    int32_t *vocab_slot;    /* open addressing over ids, -1 empty */
    uint64_t vocab_mask;
    tok_merge *merge_slot;  /* byte-level BPE: pair -> (rank, merged id) */
    uint64_t merge_mask;
    int32_t *special;       /* ids cut out before BPE, by first byte then longest first */
    uint32_t special_at[257]; /* special[special_at[b] .. special_at[b+1]) start with byte b */
    int32_t bos, eos, unk, eot, eom;
    int32_t eog[TOK_MAX_EOG];
    size_t n_eog;
    int add_bos;
    int add_eos;            /* EOS after the text (add_eos_token), as llama.cpp's add_special */
    int add_space_prefix;   /* SentencePiece dummy prefix */
    int prefix;             /* tok_prefix: which texts get that prefix */
    int split_words;        /* SentencePiece: BPE on each U+2581-led word apart (HF Metaspace split) */
    uint32_t strip_leading; /* KVP_DETOK_STRIP_SPACE: leading spaces dropped (HF Strip decoder) */
    int strip_first_token;  /* KVP_DETOK_STRIP_SPACE: every U+2581 of the first token dropped (HF Metaspace decoder) */
    int ignore_merges;      /* Llama-3: a word that is a token is taken whole */
    int nfc;                /* the text between special tokens in NFC first (HF NFC normalizer) */
    uint8_t *normalized;    /* n_vocab, or NULL: 1 for a token cut out of the NFC text, not the raw */
    int normalized_control; /* a control or unknown token among those */
    char *note;             /* kvp_tokenizer_note, or NULL */
    int32_t byte_tok[256];  /* byte-level: token of byte b's code point; SPM: <0xNN> */
    uint16_t byte_cp[256];  /* byte-level: the code point byte b stands for */
};

/* Which texts between special tokens a SentencePiece tokenizer starts with
 * U+2581 (tok_spm_wants_prefix). */
typedef enum tok_prefix {
    TOK_PREFIX_EVERY = 0, /* each (llama.cpp's add_space_prefix; HF's Prepend normalizer) */
    TOK_PREFIX_ALWAYS,    /* each that does not already start with one (HF Metaspace "always") */
    TOK_PREFIX_FIRST,     /* that, only for the text at offset 0 (HF Metaspace "first") */
    TOK_PREFIX_NEVER,     /* none (HF Metaspace "never"; add_space_prefix false) */
} tok_prefix;

/* ------------------------------------------------------------------ */
/* vocabulary                                                          */

static const char *tok_text(const kvp_tokenizer *t, int32_t id, size_t *len)
{
    *len = (size_t)(t->text_off[id + 1] - t->text_off[id] - 1);
    return t->text + t->text_off[id];
}

static uint64_t tok_hash(const char *s, size_t len) { return kvp_xxh64(s, len, 0x6b7670u); }

int32_t kvp_tokenizer_find(const kvp_tokenizer *t, const char *s, size_t len)
{
    uint64_t h = tok_hash(s, len) & t->vocab_mask;
    for (;; h = (h + 1) & t->vocab_mask) {
        int32_t id = t->vocab_slot[h];
        size_t l;
        if (id < 0)
            return -1;
        const char *x = tok_text(t, id, &l);
        if (l == len && memcmp(x, s, len) == 0)
            return id;
    }
}

static uint64_t tok_pow2_above(uint64_t n)
{
    uint64_t c = 16;
    while (c < 2 * n)
        c <<= 1;
    return c;
}

static int tok_build_vocab_hash(kvp_tokenizer *t)
{
    uint64_t cap = tok_pow2_above(t->n_vocab);
    t->vocab_slot = malloc(cap * sizeof *t->vocab_slot);
    if (!t->vocab_slot)
        return KVP_ENOMEM;
    memset(t->vocab_slot, 0xff, cap * sizeof *t->vocab_slot);
    t->vocab_mask = cap - 1;
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        size_t len;
        const char *s = tok_text(t, (int32_t)id, &len);
        /* A duplicate text keeps its first id, so lookups are stable. */
        if (kvp_tokenizer_find(t, s, len) >= 0)
            continue;
        uint64_t h = tok_hash(s, len) & t->vocab_mask;
        while (t->vocab_slot[h] >= 0)
            h = (h + 1) & t->vocab_mask;
        t->vocab_slot[h] = (int32_t)id;
    }
    return 0;
}

static uint64_t tok_pair_slot(uint64_t key, uint64_t mask)
{
    return (key * 0x9E3779B97F4A7C15ull >> 17) & mask;
}

static const tok_merge *tok_merge_find(const kvp_tokenizer *t, int32_t l, int32_t r)
{
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    for (uint64_t h = tok_pair_slot(key, t->merge_mask);; h = (h + 1) & t->merge_mask) {
        const tok_merge *m = &t->merge_slot[h];
        if (m->key == key)
            return m;
        if (m->key == UINT64_MAX)
            return NULL;
    }
}

/* Whether id may be produced by merging or by a whole-word lookup. */
static int tok_is_mergeable(const kvp_tokenizer *t, int32_t id)
{
    return t->type[id] == KVP_TOKEN_NORMAL || t->type[id] == KVP_TOKEN_USER_DEFINED ||
           t->type[id] == KVP_TOKEN_UNDEFINED;
}

static int tok_is_special_type(uint8_t ty)
{
    return ty == KVP_TOKEN_CONTROL || ty == KVP_TOKEN_USER_DEFINED || ty == KVP_TOKEN_UNKNOWN;
}

static int tok_is_control(const kvp_tokenizer *t, int32_t id)
{
    return t->type[id] == KVP_TOKEN_CONTROL || t->type[id] == KVP_TOKEN_UNKNOWN;
}

/* ------------------------------------------------------------------ */
/* loading                                                             */

/* GPT-2's printable stand-ins: bytes 33-126, 161-172 and 174-255 are their
 * own code points; the other 68, in order, become U+0100 + n. */
static void tok_byte_map(uint16_t cp[256])
{
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        cp[b] = (uint16_t)(self ? b : 256 + n++);
    }
}

/* ---- the checks (kvp_tokenizer_check_meta): every count, type and id the
 * builders below then rely on ---- */

/* "A B": the length of A (the split is the first space after the first
 * byte), or 0 when s is not a merge. */
static size_t tok_merge_split(const char *s, size_t len)
{
    const char *sp = len > 1 && len <= 2 * KVP_TOK_MAX_TOKEN_BYTES ? memchr(s + 1, ' ', len - 1) : NULL;
    return sp ? (size_t)(sp - s) : 0;
}

static int tok_check_tokens(const kvp_meta *m, const char *src, uint32_t *n_vocab, kvp_err *err)
{
    const kvp_meta_entry *e = kvp_meta_find(m, "tokenizer.ggml.tokens");
    if (!e)
        return kvp_err_set(err, KVP_ENOTFOUND, "%s: tokenizer.ggml.tokens: missing", src);
    if (e->type != KVP_META_ARR_STR)
        return kvp_err_set(err, KVP_EFORMAT, "%s: tokenizer.ggml.tokens: is %s, want arr[str]", src,
                           kvp_meta_type_name(e->type));
    if (e->n == 0 || e->n > KVP_TOK_MAX_VOCAB)
        return kvp_err_set(err, KVP_ELIMIT, "%s: tokenizer.ggml.tokens: %llu tokens (want 1..%u)", src,
                           (unsigned long long)e->n, KVP_TOK_MAX_VOCAB);
    for (uint64_t i = 0; i < e->n; i++) {
        if (e->off[i + 1] <= e->off[i] || e->off[i + 1] - e->off[i] - 1 > KVP_TOK_MAX_TOKEN_BYTES)
            return kvp_err_set(err, KVP_EFORMAT, "%s: tokenizer.ggml.tokens[%llu]: bad length", src,
                               (unsigned long long)i);
    }
    *n_vocab = (uint32_t)e->n;
    return 0;
}

static int tok_check_scores_types(const kvp_meta *m, uint32_t n_vocab, const char *src, kvp_err *err)
{
    const kvp_meta_entry *e = kvp_meta_find(m, "tokenizer.ggml.scores");
    if (e && (e->type != KVP_META_ARR_F32 || e->n != n_vocab))
        return kvp_err_set(err, KVP_EFORMAT, "%s: tokenizer.ggml.scores: want arr[f32] of %u, got %s of %llu", src,
                           n_vocab, kvp_meta_type_name(e->type), (unsigned long long)e->n);
    e = kvp_meta_find(m, "tokenizer.ggml.token_type");
    if (!e)
        return 0;
    if (e->type != KVP_META_ARR_I32 || e->n != n_vocab)
        return kvp_err_set(err, KVP_EFORMAT, "%s: tokenizer.ggml.token_type: want arr[i32] of %u, got %s of %llu",
                           src, n_vocab, kvp_meta_type_name(e->type), (unsigned long long)e->n);
    const int32_t *ty = e->arr;
    for (uint32_t i = 0; i < n_vocab; i++)
        if (ty[i] < 0 || ty[i] > KVP_TOKEN_BYTE)
            return kvp_err_set(err, KVP_EFORMAT, "%s: tokenizer.ggml.token_type[%u]: %d is not a token type", src, i,
                               (int)ty[i]);
    return 0;
}

/* tokenizer.ggml.<name>_token_id: -1 when absent, an error when out of range. */
static int tok_load_id(const kvp_meta *m, const char *name, uint32_t n_vocab, int32_t *id, const char *src,
                       kvp_err *err)
{
    char key[96];
    uint64_t v;
    snprintf(key, sizeof key, "tokenizer.ggml.%s_token_id", name);
    *id = -1;
    int rc = kvp_meta_get_u64(m, key, &v);
    if (rc == KVP_ENOTFOUND)
        return 0;
    if (rc < 0)
        return kvp_err_set(err, KVP_EFORMAT, "%s: %s: not an unsigned integer", src, key);
    if (v >= n_vocab)
        return kvp_err_set(err, KVP_EFORMAT, "%s: %s: %llu is outside the vocabulary of %u", src, key,
                           (unsigned long long)v, n_vocab);
    *id = (int32_t)v;
    return 0;
}

static int tok_load_bool(const kvp_meta *m, const char *key, int dflt, int *out, const char *src, kvp_err *err)
{
    uint64_t v;
    int rc = kvp_meta_get_u64(m, key, &v);
    *out = dflt;
    if (rc == KVP_ENOTFOUND)
        return 0;
    if (rc < 0)
        return kvp_err_set(err, KVP_EFORMAT, "%s: %s: not a boolean", src, key);
    *out = v != 0;
    return 0;
}

static const char *const tok_special_names[] = {"bos", "eos", "unknown", "eot", "eom"};

static int tok_check_merges(const kvp_meta *m, const char *src, kvp_err *err)
{
    const kvp_meta_entry *e = kvp_meta_find(m, "tokenizer.ggml.merges");
    if (!e)
        return kvp_err_set(err, KVP_ENOTFOUND, "%s: tokenizer.ggml.merges: missing (needed by a gpt2 tokenizer)", src);
    if (e->type != KVP_META_ARR_STR || e->n > 4ull * KVP_TOK_MAX_VOCAB)
        return kvp_err_set(err, KVP_EFORMAT, "%s: tokenizer.ggml.merges: want arr[str] of at most %u, got %s of %llu",
                           src, 4 * KVP_TOK_MAX_VOCAB, kvp_meta_type_name(e->type), (unsigned long long)e->n);
    for (uint64_t i = 0; i < e->n; i++) {
        size_t len;
        const char *s = kvp_meta_str_at(e, i, &len);
        if (!tok_merge_split(s, len))
            return kvp_err_set(err, KVP_EFORMAT, "%s: tokenizer.ggml.merges[%llu]: \"%.40s\" is not \"A B\"", src,
                               (unsigned long long)i, s);
    }
    return 0;
}

static const char *const tok_prefix_names[] = {"always", "first", "never"};

/* tokenizer.kvpipe.prepend_scheme: -1 when absent, else TOK_PREFIX_ALWAYS..NEVER;
 * KVP_EFORMAT for another value or type. */
static int tok_load_prepend_scheme(const kvp_meta *m, int *prefix, const char *src, kvp_err *err)
{
    const kvp_meta_entry *e = kvp_meta_find(m, "tokenizer.kvpipe.prepend_scheme");
    *prefix = -1;
    if (!e)
        return 0;
    for (int i = 0; e->type == KVP_META_STR && i < 3; i++)
        if (e->n == strlen(tok_prefix_names[i]) && memcmp(e->str, tok_prefix_names[i], e->n) == 0) {
            *prefix = TOK_PREFIX_ALWAYS + i;
            return 0;
        }
    if (e->type != KVP_META_STR)
        return kvp_err_set(err, KVP_EFORMAT, "%s: tokenizer.kvpipe.prepend_scheme: is %s, want str", src,
                           kvp_meta_type_name(e->type));
    return kvp_err_set(err, KVP_EFORMAT, "%s: tokenizer.kvpipe.prepend_scheme: \"%.*s\" is not always, first or never",
                       src, (int)(e->n > 40 ? 40 : e->n), e->str);
}

/* tokenizer.kvpipe.normalizer: *nfc 1 for "nfc", 0 when absent;
 * KVP_EFORMAT for another value or type (a normalizer this version does not
 * apply must not be skipped). */
static int tok_load_normalizer(const kvp_meta *m, int *nfc, const char *src, kvp_err *err)
{
    const kvp_meta_entry *e = kvp_meta_find(m, "tokenizer.kvpipe.normalizer");
    *nfc = 0;
    if (!e)
        return 0;
    if (e->type != KVP_META_STR)
        return kvp_err_set(err, KVP_EFORMAT, "%s: tokenizer.kvpipe.normalizer: is %s, want str", src,
                           kvp_meta_type_name(e->type));
    if (e->n != 3 || memcmp(e->str, "nfc", 3) != 0)
        return kvp_err_set(err, KVP_EFORMAT, "%s: tokenizer.kvpipe.normalizer: \"%.*s\" is not one kvpipe applies (nfc)",
                           src, (int)(e->n > 40 ? 40 : e->n), e->str);
    *nfc = 1;
    return 0;
}

/* tokenizer.kvpipe.normalized_tokens: ids of control, unknown or
 * user-defined tokens (n_vocab tokens, types as in token_type, NULL when
 * the key is absent) that are cut out of the normalized text. */
static int tok_check_normalized_tokens(const kvp_meta *m, uint32_t n_vocab, const char *src, kvp_err *err)
{
    const kvp_meta_entry *e = kvp_meta_find(m, "tokenizer.kvpipe.normalized_tokens");
    if (!e)
        return 0;
    if (e->type != KVP_META_ARR_I32)
        return kvp_err_set(err, KVP_EFORMAT, "%s: tokenizer.kvpipe.normalized_tokens: is %s, want arr[i32]", src,
                           kvp_meta_type_name(e->type));
    const kvp_meta_entry *te = kvp_meta_find(m, "tokenizer.ggml.token_type");
    const int32_t *ids = e->arr, *ty = te ? te->arr : NULL;
    for (uint64_t i = 0; i < e->n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= n_vocab)
            return kvp_err_set(err, KVP_EFORMAT, "%s: tokenizer.kvpipe.normalized_tokens[%llu]: %d is outside the "
                               "vocabulary of %u", src, (unsigned long long)i, (int)ids[i], n_vocab);
        if (!ty || !tok_is_special_type((uint8_t)ty[ids[i]]))
            return kvp_err_set(err, KVP_EFORMAT, "%s: tokenizer.kvpipe.normalized_tokens[%llu]: token %d is not a "
                               "control, unknown or user-defined token", src, (unsigned long long)i, (int)ids[i]);
    }
    return 0;
}

/* The keys kvp_tokenizer_meta_from_json adds for HF's rules around the BPE
 * (GGUF has none: their absence is llama.cpp's behaviour). */
static int tok_check_hf_rules(const kvp_meta *m, uint32_t n_vocab, const char *src, kvp_err *err)
{
    int prefix, flag, rc;
    uint64_t v;
    if ((rc = tok_load_normalizer(m, &flag, src, err)) < 0 ||
        (rc = tok_check_normalized_tokens(m, n_vocab, src, err)) < 0 ||
        (rc = tok_load_prepend_scheme(m, &prefix, src, err)) < 0 ||
        (rc = tok_load_bool(m, "tokenizer.kvpipe.metaspace_split", 0, &flag, src, err)) < 0 ||
        (rc = tok_load_bool(m, "tokenizer.kvpipe.decode_metaspace", 0, &flag, src, err)) < 0)
        return rc;
    rc = kvp_meta_get_u64(m, "tokenizer.kvpipe.decode_strip", &v);
    if (rc == KVP_EFORMAT || (rc == 0 && v > 64))
        return kvp_err_set(err, KVP_EFORMAT, "%s: tokenizer.kvpipe.decode_strip: not a count of 0 to 64 spaces", src);
    return 0;
}

int kvp_tokenizer_check_meta(const kvp_meta *m, const char *source, kvp_err *err)
{
    const char *src = source ? source : "tokenizer";
    const char *model = kvp_meta_get_str(m, "tokenizer.ggml.model");
    uint32_t n_vocab = 0;
    int rc, flag;
    int32_t id;
    if (!model)
        return kvp_err_set(err, KVP_ENOTFOUND, "%s: tokenizer.ggml.model: missing", src);
    if ((rc = tok_check_tokens(m, src, &n_vocab, err)) < 0 || (rc = tok_check_scores_types(m, n_vocab, src, err)) < 0)
        return rc;
    if (strcmp(model, "gpt2") == 0 && (rc = tok_check_merges(m, src, err)) < 0)
        return rc;
    for (size_t i = 0; i < sizeof tok_special_names / sizeof *tok_special_names; i++)
        if ((rc = tok_load_id(m, tok_special_names[i], n_vocab, &id, src, err)) < 0)
            return rc;
    if ((rc = tok_load_bool(m, "tokenizer.ggml.add_bos_token", 0, &flag, src, err)) < 0 ||
        (rc = tok_load_bool(m, "tokenizer.ggml.add_eos_token", 0, &flag, src, err)) < 0 ||
        (rc = tok_load_bool(m, "tokenizer.ggml.add_space_prefix", 0, &flag, src, err)) < 0)
        return rc;
    return tok_check_hf_rules(m, n_vocab, src, err);
}

/* ---- building, from metadata kvp_tokenizer_check_meta accepted ---- */

static int tok_load_tokens(kvp_tokenizer *t, const kvp_meta *m, const char *src, kvp_err *err)
{
    const kvp_meta_entry *e = kvp_meta_find(m, "tokenizer.ggml.tokens");
    t->n_vocab = (uint32_t)e->n;
    uint64_t bytes = e->off[e->n];
    t->text = malloc(bytes ? bytes : 1);
    t->text_off = malloc((e->n + 1) * sizeof *t->text_off);
    t->score = calloc(e->n, sizeof *t->score);
    t->type = malloc(e->n);
    if (!t->text || !t->text_off || !t->score || !t->type)
        return kvp_err_set(err, KVP_ENOMEM, "%s: tokenizer: out of memory for %llu tokens", src,
                           (unsigned long long)e->n);
    memcpy(t->text, e->chars, bytes);
    memcpy(t->text_off, e->off, (e->n + 1) * sizeof *t->text_off);
    memset(t->type, KVP_TOKEN_NORMAL, e->n);
    const kvp_meta_entry *sc = kvp_meta_find(m, "tokenizer.ggml.scores");
    if (sc)
        memcpy(t->score, sc->arr, t->n_vocab * sizeof *t->score);
    const kvp_meta_entry *ty = kvp_meta_find(m, "tokenizer.ggml.token_type");
    for (uint32_t i = 0; ty && i < t->n_vocab; i++)
        t->type[i] = (uint8_t)((const int32_t *)ty->arr)[i];
    return 0;
}

static int tok_load_merges(kvp_tokenizer *t, const kvp_meta *m, const char *src, kvp_err *err)
{
    const kvp_meta_entry *e = kvp_meta_find(m, "tokenizer.ggml.merges");
    uint64_t cap = tok_pow2_above(e->n);
    t->merge_slot = malloc(cap * sizeof *t->merge_slot);
    char *both = malloc(2 * KVP_TOK_MAX_TOKEN_BYTES + 2);
    if (!t->merge_slot || !both) {
        free(both);
        return kvp_err_set(err, KVP_ENOMEM, "%s: tokenizer.ggml.merges: out of memory", src);
    }
    for (uint64_t i = 0; i < cap; i++)
        t->merge_slot[i].key = UINT64_MAX;
    t->merge_mask = cap - 1;
    for (uint64_t i = 0; i < e->n; i++) {
        size_t len;
        const char *s = kvp_meta_str_at(e, i, &len);
        size_t la = tok_merge_split(s, len), lb = len - la - 1;
        const char *b_text = s + la + 1;
        int32_t a = kvp_tokenizer_find(t, s, la), b = kvp_tokenizer_find(t, b_text, lb);
        memcpy(both, s, la);
        memcpy(both + la, b_text, lb);
        int32_t ab = kvp_tokenizer_find(t, both, la + lb);
        /* A merge naming absent tokens can never fire; converters leave a few. */
        if (a < 0 || b < 0 || ab < 0)
            continue;
        uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
        uint64_t h = tok_pair_slot(key, t->merge_mask);
        while (t->merge_slot[h].key != UINT64_MAX && t->merge_slot[h].key != key)
            h = (h + 1) & t->merge_mask;
        if (t->merge_slot[h].key == key)
            continue; /* the first (lowest) rank wins */
        t->merge_slot[h] = (tok_merge){key, (int32_t)i, ab};
    }
    free(both);
    return 0;
}

typedef struct tok_special_key {
    uint8_t first;
    uint32_t len;
    int32_t id;
} tok_special_key;

/* By first byte, then longest first, so the first match is the longest. */
static int tok_special_cmp(const void *pa, const void *pb)
{
    const tok_special_key *a = pa, *b = pb;
    if (a->first != b->first)
        return a->first < b->first ? -1 : 1;
    if (a->len != b->len)
        return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static int tok_load_specials(kvp_tokenizer *t)
{
    size_t n = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++)
        n += tok_is_special_type(t->type[i]) && t->text_off[i + 1] - t->text_off[i] > 1;
    tok_special_key *keys = malloc((n ? n : 1) * sizeof *keys);
    t->special = malloc((n ? n : 1) * sizeof *t->special);
    if (!keys || !t->special) {
        free(keys);
        return KVP_ENOMEM;
    }
    n = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        size_t len;
        const char *s = tok_text(t, (int32_t)i, &len);
        if (tok_is_special_type(t->type[i]) && len > 0)
            keys[n++] = (tok_special_key){(uint8_t)s[0], (uint32_t)len, (int32_t)i};
    }
    qsort(keys, n, sizeof *keys, tok_special_cmp);
    size_t j = 0;
    for (int b = 0; b < 256; b++) {
        t->special_at[b] = (uint32_t)j;
        while (j < n && keys[j].first == b)
            j++;
    }
    t->special_at[256] = (uint32_t)n;
    for (size_t i = 0; i < n; i++)
        t->special[i] = keys[i].id;
    free(keys);
    return 0;
}

static int tok_make_pieces(kvp_tokenizer *t)
{
    /* A byte-level code point decodes to one byte; U+2581 (3 bytes) to one;
     * <0xNN> (6) to one: a piece is never longer than its text. */
    t->piece = malloc(t->text_off[t->n_vocab] ? t->text_off[t->n_vocab] : 1);
    t->piece_off = malloc((t->n_vocab + 1) * sizeof *t->piece_off);
    if (!t->piece || !t->piece_off)
        return KVP_ENOMEM;
    int16_t inv[324];
    memset(inv, 0xff, sizeof inv);
    for (int b = 0; b < 256; b++)
        inv[t->byte_cp[b]] = (int16_t)b;
    uint64_t at = 0;
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        size_t len;
        const char *s = tok_text(t, (int32_t)id, &len);
        t->piece_off[id] = at;
        uint8_t ty = t->type[id];
        unsigned hex;
        if (t->model == KVP_TOK_MODEL_SPM && ty == KVP_TOKEN_BYTE && len == 6 &&
            sscanf(s, "<0x%2X>", &hex) == 1) {
            t->piece[at++] = (char)hex;
        } else if (tok_is_control(t, (int32_t)id) || ty == KVP_TOKEN_USER_DEFINED) {
            memcpy(t->piece + at, s, len);
            at += len;
        } else if (t->model == KVP_TOK_MODEL_SPM) {
            for (size_t i = 0; i < len; i++) {
                if (i + 3 <= len && memcmp(s + i, "\xE2\x96\x81", 3) == 0) {
                    t->piece[at++] = ' ';
                    i += 2;
                } else {
                    t->piece[at++] = s[i];
                }
            }
        } else {
            for (size_t i = 0; i < len;) {
                uint32_t cp;
                size_t k = kvp_unicode_decode(s + i, len - i, &cp);
                if (cp < 324 && inv[cp] >= 0) {
                    t->piece[at++] = (char)inv[cp];
                } else {
                    memcpy(t->piece + at, s + i, k); /* not a byte stand-in: keep it */
                    at += k;
                }
                i += k;
            }
        }
        t->piece[at++] = '\0';
    }
    t->piece_off[t->n_vocab] = at;
    return 0;
}

static void tok_add_eog(kvp_tokenizer *t, int32_t id)
{
    if (id < 0 || t->n_eog == TOK_MAX_EOG)
        return;
    for (size_t i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id)
            return;
    t->eog[t->n_eog++] = id;
}

static void tok_find_eog(kvp_tokenizer *t)
{
    static const char *const turn_end[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                                           "<|endoftext|>", "<|eom_id|>", "<EOT>", "<|end_of_text|>"};
    tok_add_eog(t, t->eos);
    tok_add_eog(t, t->eot);
    tok_add_eog(t, t->eom);
    for (size_t i = 0; i < sizeof turn_end / sizeof *turn_end; i++) {
        int32_t id = kvp_tokenizer_find(t, turn_end[i], strlen(turn_end[i]));
        if (id >= 0 && tok_is_control(t, id))
            tok_add_eog(t, id);
    }
}

/* A byte-level vocabulary that names no pre-tokenizer: llama.cpp's
 * 'default' one, as llama.cpp takes it (with a warning to regenerate the
 * file); the note says so, for the program to show. */
static int tok_assume_default_pre(kvp_tokenizer *t, const char *src, kvp_err *err)
{
    static const char fmt[] = "%s: no tokenizer.ggml.pre: tokenized with llama.cpp's 'default' pre-tokenizer, as "
                              "llama.cpp does (it warns that generation quality will be degraded: regenerate the "
                              "GGUF with a current converter)";
    int n = snprintf(NULL, 0, fmt, src);
    t->note = n > 0 ? malloc((size_t)n + 1) : NULL;
    if (!t->note)
        return kvp_err_set(err, KVP_ENOMEM, "%s: tokenizer: out of memory", src);
    snprintf(t->note, (size_t)n + 1, fmt, src);
    t->pre = KVP_TOK_PRE_DEFAULT;
    return 0;
}

static int tok_load_pre(kvp_tokenizer *t, const kvp_meta *m, const char *src, kvp_err *err)
{
    const char *pre = kvp_meta_get_str(m, "tokenizer.ggml.pre");
    if (t->model == KVP_TOK_MODEL_SPM) {
        t->pre = KVP_TOK_PRE_NONE;
        return 0;
    }
    if (!kvp_meta_find(m, "tokenizer.ggml.pre") || (pre && !*pre)) /* llama.cpp: empty is missing */
        return tok_assume_default_pre(t, src, err);
    if (!pre)
        return kvp_err_set(err, KVP_EFORMAT, "%s: tokenizer.ggml.pre: not a string", src);
    /* "gpt2" is no name llama.cpp knows (it refuses the file), but it is
     * the one kvp_tokenizer_meta_from_json wrote into KVP files for a
     * byte-level tokenizer.json before it wrote "gpt-2" */
    if (!strcmp(pre, "default"))
        t->pre = KVP_TOK_PRE_DEFAULT;
    else if (!strcmp(pre, "gpt-2") || !strcmp(pre, "gpt2"))
        t->pre = KVP_TOK_PRE_GPT2;
    else if (!strcmp(pre, "smollm"))
        t->pre = KVP_TOK_PRE_SMOLLM;
    else if (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3") || !strcmp(pre, "llama-v3"))
        t->pre = KVP_TOK_PRE_LLAMA3;
    else if (!strcmp(pre, "qwen2"))
        t->pre = KVP_TOK_PRE_QWEN2;
    else
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: tokenizer.ggml.pre: \"%.64s\" is not a pre-tokenizer we know "
                           "(default, gpt-2, smollm, llama-bpe, qwen2)", src, pre);
    t->ignore_merges = t->pre == KVP_TOK_PRE_LLAMA3;
    return 0;
}

static int tok_load_bytes(kvp_tokenizer *t)
{
    tok_byte_map(t->byte_cp);
    for (int b = 0; b < 256; b++) {
        char s[8];
        size_t len;
        if (t->model == KVP_TOK_MODEL_GPT2) {
            len = kvp_unicode_encode(t->byte_cp[b], s);
        } else {
            snprintf(s, sizeof s, "<0x%02X>", b);
            len = 6;
        }
        t->byte_tok[b] = kvp_tokenizer_find(t, s, len);
    }
    return 0;
}

/* Where the SentencePiece prefix goes and what decoding strips: llama.cpp's
 * rules (add_space_prefix) unless the tokenizer.kvpipe.* keys of an HF
 * tokenizer.json say HF's.  kvp_tokenizer_check_meta checked the keys. */
static void tok_load_spm_rules(kvp_tokenizer *t, const kvp_meta *m)
{
    int prefix, flag;
    uint64_t v;
    kvp_err ignored;
    (void)tok_load_prepend_scheme(m, &prefix, "", &ignored);
    t->prefix = prefix >= 0 ? prefix : t->add_space_prefix ? TOK_PREFIX_EVERY : TOK_PREFIX_NEVER;
    (void)tok_load_bool(m, "tokenizer.kvpipe.metaspace_split", 0, &t->split_words, "", &ignored);
    (void)tok_load_bool(m, "tokenizer.kvpipe.decode_metaspace", 0, &flag, "", &ignored);
    t->strip_first_token = flag;
    /* llama.cpp drops the one space its prefix put in front */
    t->strip_leading = kvp_meta_get_u64(m, "tokenizer.kvpipe.decode_strip", &v) == 0 ? (uint32_t)v
                                                                                      : (uint32_t)t->add_space_prefix;
    if (t->model != KVP_TOK_MODEL_SPM) {
        t->prefix = TOK_PREFIX_NEVER;
        t->split_words = t->strip_first_token = 0;
        t->strip_leading = 0;
    }
}

/* HF's normalizer, as kvp_tokenizer_meta_from_json recorded it (checked):
 * NFC, and the tokens matched in the NFC text rather than the raw. */
static int tok_load_normalizer_rules(kvp_tokenizer *t, const kvp_meta *m)
{
    kvp_err ignored;
    (void)tok_load_normalizer(m, &t->nfc, "", &ignored);
    const kvp_meta_entry *e = kvp_meta_find(m, "tokenizer.kvpipe.normalized_tokens");
    if (!t->nfc || !e || e->n == 0)
        return 0;
    t->normalized = calloc(t->n_vocab, 1);
    if (!t->normalized)
        return KVP_ENOMEM;
    const int32_t *ids = e->arr;
    for (uint64_t i = 0; i < e->n; i++) {
        t->normalized[ids[i]] = 1;
        t->normalized_control |= t->type[ids[i]] != KVP_TOKEN_USER_DEFINED;
    }
    return 0;
}

static int tok_load(kvp_tokenizer *t, const kvp_meta *m, const char *src, kvp_err *err)
{
    int rc = kvp_tokenizer_check_meta(m, src, err);
    if (rc < 0)
        return rc;
    /* well formed; now what we can run */
    const char *model = kvp_meta_get_str(m, "tokenizer.ggml.model");
    if (!strcmp(model, "gpt2"))
        t->model = KVP_TOK_MODEL_GPT2;
    else if (!strcmp(model, "llama"))
        t->model = KVP_TOK_MODEL_SPM;
    else
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: tokenizer.ggml.model: \"%s\" is not supported (gpt2, llama)",
                           src, model);
    if ((rc = tok_load_pre(t, m, src, err)) < 0 || (rc = tok_load_tokens(t, m, src, err)) < 0)
        return rc;
    if (tok_build_vocab_hash(t) < 0)
        return kvp_err_set(err, KVP_ENOMEM, "%s: tokenizer: out of memory", src);
    if (t->model == KVP_TOK_MODEL_GPT2 && (rc = tok_load_merges(t, m, src, err)) < 0)
        return rc;
    int32_t *ids[] = {&t->bos, &t->eos, &t->unk, &t->eot, &t->eom};
    _Static_assert(sizeof ids / sizeof *ids == sizeof tok_special_names / sizeof *tok_special_names, "an id a name");
    for (size_t i = 0; i < sizeof ids / sizeof *ids; i++) /* checked: cannot fail */
        (void)tok_load_id(m, tok_special_names[i], t->n_vocab, ids[i], src, err);
    int spm = t->model == KVP_TOK_MODEL_SPM;
    /* Without the key, BOS as llama.cpp adds it: SentencePiece and the
     * Llama-3 pre-tokenizer (whose models' own tokenizers add it too).
     * kvp_tokenizer_check_meta checked both keys: these cannot fail. */
    int bos_dflt = spm || t->pre == KVP_TOK_PRE_LLAMA3;
    (void)tok_load_bool(m, "tokenizer.ggml.add_bos_token", bos_dflt, &t->add_bos, src, err);
    (void)tok_load_bool(m, "tokenizer.ggml.add_eos_token", 0, &t->add_eos, src, err);
    (void)tok_load_bool(m, "tokenizer.ggml.add_space_prefix", spm, &t->add_space_prefix, src, err);
    if (!spm)
        t->add_space_prefix = 0; /* byte-level BPE has no dummy prefix */
    tok_load_spm_rules(t, m);
    tok_load_bytes(t);
    if (tok_load_normalizer_rules(t, m) < 0 || tok_load_specials(t) < 0 || tok_make_pieces(t) < 0)
        return kvp_err_set(err, KVP_ENOMEM, "%s: tokenizer: out of memory", src);
    tok_find_eog(t);
    return 0;
}

int kvp_tokenizer_load_meta(kvp_tokenizer **out, const kvp_meta *m, const char *source, kvp_err *err)
{
    *out = NULL;
    if (!source)
        source = "tokenizer";
    kvp_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return kvp_err_set(err, KVP_ENOMEM, "%s: tokenizer: out of memory", source);
    int rc = tok_load(t, m, source, err);
    if (rc < 0) {
        kvp_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void kvp_tokenizer_free(kvp_tokenizer *t)
{
    if (!t)
        return;
    free(t->text);
    free(t->text_off);
    free(t->piece);
    free(t->piece_off);
    free(t->score);
    free(t->type);
    free(t->vocab_slot);
    free(t->merge_slot);
    free(t->special);
    free(t->normalized);
    free(t->note);
    free(t);
}

/* ------------------------------------------------------------------ */
/* accessors                                                           */

size_t kvp_tokenizer_n_vocab(const kvp_tokenizer *t) { return t->n_vocab; }
kvp_tok_model kvp_tokenizer_model(const kvp_tokenizer *t) { return t->model; }
kvp_tok_pre kvp_tokenizer_pre(const kvp_tokenizer *t) { return t->pre; }
int32_t kvp_tokenizer_bos(const kvp_tokenizer *t) { return t->bos; }
int32_t kvp_tokenizer_eos(const kvp_tokenizer *t) { return t->eos; }
int kvp_tokenizer_add_bos(const kvp_tokenizer *t) { return t->add_bos && t->bos >= 0; }
const char *kvp_tokenizer_note(const kvp_tokenizer *t) { return t->note; }

const int32_t *kvp_tokenizer_eog(const kvp_tokenizer *t, size_t *n)
{
    *n = t->n_eog;
    return t->eog;
}

int kvp_tokenizer_is_eog(const kvp_tokenizer *t, int32_t id)
{
    for (size_t i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id)
            return 1;
    return 0;
}

const char *kvp_tokenizer_token_text(const kvp_tokenizer *t, int32_t id, size_t *len)
{
    size_t l;
    if (id < 0 || (uint32_t)id >= t->n_vocab)
        return NULL;
    const char *s = tok_text(t, id, &l);
    if (len)
        *len = l;
    return s;
}

kvp_token_type kvp_tokenizer_token_type(const kvp_tokenizer *t, int32_t id)
{
    if (id < 0 || (uint32_t)id >= t->n_vocab)
        return KVP_TOKEN_UNDEFINED;
    return (kvp_token_type)t->type[id];
}

const char *kvp_tokenizer_piece(const kvp_tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || (uint32_t)id >= t->n_vocab)
        return NULL;
    if (len)
        *len = (size_t)(t->piece_off[id + 1] - t->piece_off[id] - 1);
    return t->piece + t->piece_off[id];
}

/* ------------------------------------------------------------------ */
/* encoding state                                                      */

typedef struct tok_heap_item {
    uint64_t key;  /* priority << 32 | left symbol: smallest first */
    int32_t l, r;  /* the pair */
    int32_t a, b;  /* what l and r were when pushed (ids, or byte lengths) */
} tok_heap_item;

/* Scratch for one encode call.  Text arrays are sized to the longest
 * fragment, symbol arrays to the longest word (the whole fragment for
 * SentencePiece, which has no pre-tokenizer). */
typedef struct tok_work {
    const kvp_tokenizer *t;
    int32_t *ids;       /* output */
    size_t n_ids, cap_ids;
    size_t cap_text;    /* code points the three arrays below hold, less 1 */
    uint32_t *cp;       /* decoded code points of a fragment */
    uint8_t *cls;       /* their KVP_UNICODE_* classes */
    size_t *boff;       /* byte offset of each code point, + 1 */
    size_t cap_sym;     /* symbols the arrays below hold */
    int32_t *sym_id, *sym_prev, *sym_next;
    uint32_t *sym_at, *sym_len; /* SPM: byte range of a symbol in buf */
    tok_heap_item *heap; /* each merge pushes at most 2 pairs: 3 per symbol in all */
    size_t n_heap;
    size_t cap_buf;
    char *buf;          /* SPM normalized text / byte-level word text */
    kvp_err *err;
} tok_work;

static void tok_work_free(tok_work *w)
{
    free(w->cp);
    free(w->cls);
    free(w->boff);
    free(w->sym_id);
    free(w->sym_prev);
    free(w->sym_next);
    free(w->sym_at);
    free(w->sym_len);
    free(w->heap);
    free(w->buf);
}

/* realloc *p to n elements of size sz; 0 or KVP_ENOMEM (*p kept). */
static int tok_grow(void *pp, size_t n, size_t sz)
{
    void **p = pp;
    void *q = realloc(*p, n * sz);
    if (!q)
        return KVP_ENOMEM;
    *p = q;
    return 0;
}

static int tok_reserve_text(tok_work *w, size_t n)
{
    if (n <= w->cap_text && w->cp)
        return 0;
    if (tok_grow(&w->cp, n + 1, sizeof *w->cp) || tok_grow(&w->cls, n + 1, 1) ||
        tok_grow(&w->boff, n + 1, sizeof *w->boff))
        return kvp_err_set(w->err, KVP_ENOMEM, "tokenizer: out of memory for a text of %zu bytes", n);
    w->cap_text = n;
    return 0;
}

static int tok_reserve_word(tok_work *w, size_t n_sym, size_t n_buf)
{
    if (n_sym > w->cap_sym || !w->sym_id) {
        if (tok_grow(&w->sym_id, n_sym + 1, sizeof *w->sym_id) ||
            tok_grow(&w->sym_prev, n_sym + 1, sizeof *w->sym_prev) ||
            tok_grow(&w->sym_next, n_sym + 1, sizeof *w->sym_next) ||
            tok_grow(&w->sym_at, n_sym + 1, sizeof *w->sym_at) ||
            tok_grow(&w->sym_len, n_sym + 1, sizeof *w->sym_len) ||
            tok_grow(&w->heap, 3 * n_sym + 1, sizeof *w->heap))
            return kvp_err_set(w->err, KVP_ENOMEM, "tokenizer: out of memory for a word of %zu symbols", n_sym);
        w->cap_sym = n_sym;
    }
    if (n_buf > w->cap_buf || !w->buf) {
        if (tok_grow(&w->buf, n_buf + 1, 1))
            return kvp_err_set(w->err, KVP_ENOMEM, "tokenizer: out of memory for a word of %zu bytes", n_buf);
        w->cap_buf = n_buf;
    }
    return 0;
}

static int tok_emit(tok_work *w, int32_t id)
{
    if (w->n_ids == w->cap_ids) {
        size_t cap = w->cap_ids ? 2 * w->cap_ids : 64;
        int32_t *p = realloc(w->ids, cap * sizeof *p);
        if (!p)
            return kvp_err_set(w->err, KVP_ENOMEM, "tokenizer: out of memory for %zu ids", cap);
        w->ids = p;
        w->cap_ids = cap;
    }
    w->ids[w->n_ids++] = id;
    return 0;
}

static void tok_heap_push(tok_work *w, tok_heap_item it)
{
    size_t i = w->n_heap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (w->heap[p].key <= it.key)
            break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = it;
}

static tok_heap_item tok_heap_pop(tok_work *w)
{
    tok_heap_item top = w->heap[0], last = w->heap[--w->n_heap];
    size_t i = 0, n = w->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && w->heap[c + 1].key < w->heap[c].key)
            c++;
        if (last.key <= w->heap[c].key)
            break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n)
        w->heap[i] = last;
    return top;
}

/* ------------------------------------------------------------------ */
/* byte-level BPE                                                      */

static void tok_gpt2_try_pair(tok_work *w, int32_t l)
{
    if (l < 0 || w->sym_next[l] < 0)
        return;
    int32_t r = w->sym_next[l];
    const tok_merge *m = tok_merge_find(w->t, w->sym_id[l], w->sym_id[r]);
    if (!m)
        return;
    tok_heap_push(w, (tok_heap_item){(uint64_t)(uint32_t)m->rank << 32 | (uint32_t)l, l, r, w->sym_id[l],
                                     w->sym_id[r]});
}

/* BPE over the bytes s[0..n) of one pre-tokenized word. */
static int tok_gpt2_word(tok_work *w, const uint8_t *s, size_t n)
{
    const kvp_tokenizer *t = w->t;
    /* A byte's stand-in is at most 2 bytes of UTF-8 (U+0143). */
    int rc = tok_reserve_word(w, n, 2 * n);
    if (rc < 0)
        return rc;
    if (t->ignore_merges && n > 1) {
        size_t at = 0;
        for (size_t i = 0; i < n; i++)
            at += kvp_unicode_encode(t->byte_cp[s[i]], w->buf + at);
        int32_t id = kvp_tokenizer_find(t, w->buf, at);
        if (id >= 0 && tok_is_mergeable(t, id))
            return tok_emit(w, id);
    }
    /* A byte whose stand-in is not in the vocabulary is dropped, as HF's BPE
     * (no unk_token) and llama.cpp do; its neighbours become adjacent. */
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_tok[s[i]];
        if (id < 0)
            continue;
        w->sym_id[m] = id;
        w->sym_prev[m] = (int32_t)m - 1;
        w->sym_next[m] = (int32_t)m + 1;
        m++;
    }
    if (m == 0)
        return 0;
    w->sym_next[m - 1] = -1;
    w->n_heap = 0;
    for (size_t i = 0; i + 1 < m; i++)
        tok_gpt2_try_pair(w, (int32_t)i);
    while (w->n_heap) {
        tok_heap_item it = tok_heap_pop(w);
        int32_t l = it.l, r = it.r;
        if (w->sym_next[l] != r || w->sym_id[l] != it.a || w->sym_id[r] != it.b)
            continue; /* stale: a neighbour merged since */
        w->sym_id[l] = tok_merge_find(t, it.a, it.b)->id;
        w->sym_id[r] = -1;
        w->sym_next[l] = w->sym_next[r];
        if (w->sym_next[r] >= 0)
            w->sym_prev[w->sym_next[r]] = l;
        tok_gpt2_try_pair(w, w->sym_prev[l]);
        tok_gpt2_try_pair(w, l);
    }
    for (int32_t i = 0; i >= 0; i = w->sym_next[i])
        if ((rc = tok_emit(w, w->sym_id[i])) < 0)
            return rc;
    return 0;
}

/* ------------------------------------------------------------------ */
/* pre-tokenizers: each returns the length in code points of the match
 * at i in the segment [.., n), as the regex alternation would.          */

#define L KVP_UNICODE_LETTER
#define N KVP_UNICODE_NUMBER
#define S KVP_UNICODE_SPACE

static size_t tok_run(const uint8_t *cls, size_t j, size_t n, int want)
{
    while (j < n && (cls[j] & want))
        j++;
    return j;
}

static size_t tok_run_other(const uint8_t *cls, size_t j, size_t n)
{
    while (j < n && !(cls[j] & (L | N | S)))
        j++;
    return j;
}

static uint32_t tok_ascii_lower(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* 's 't 're 've 'm 'll 'd (case-folded when fold): the match length or 0. */
static size_t tok_contraction(const uint32_t *cp, size_t i, size_t n, int fold)
{
    if (cp[i] != '\'' || i + 1 >= n)
        return 0;
    uint32_t a = fold ? tok_ascii_lower(cp[i + 1]) : cp[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if (i + 2 >= n)
        return 0;
    uint32_t b = fold ? tok_ascii_lower(cp[i + 2]) : cp[i + 2];
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return 3;
    return 0;
}

/* \s+(?!\S) then \s+: a whitespace run gives up its last character when a
 * non-space follows, so that character can lead the next word. */
static size_t tok_space_run(const uint8_t *cls, size_t i, size_t n)
{
    size_t k = tok_run(cls, i, n, S);
    if (k < n && k - i >= 2)
        return k - 1 - i;
    return k - i;
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t tok_match_gpt2(const uint32_t *cp, const uint8_t *cls, size_t i, size_t n)
{
    size_t k = tok_contraction(cp, i, n, 0);
    if (k)
        return k;
    size_t j = cp[i] == ' ' ? i + 1 : i;
    if (j < n && (cls[j] & L))
        return tok_run(cls, j, n, L) - i;
    if (j < n && (cls[j] & N))
        return tok_run(cls, j, n, N) - i;
    if (j < n && !(cls[j] & (L | N | S)))
        return tok_run_other(cls, j, n) - i;
    if (cls[i] & S)
        return tok_space_run(cls, i, n);
    return 1;
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}
 * | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t tok_match_llama3(const uint32_t *cp, const uint8_t *cls, size_t i, size_t n, size_t max_digits)
{
    size_t k = tok_contraction(cp, i, n, 1);
    if (k)
        return k;
    uint32_t c = cp[i];
    if (c != '\r' && c != '\n' && !(cls[i] & (L | N)) && i + 1 < n && (cls[i + 1] & L))
        return tok_run(cls, i + 1, n, L) - i;
    if (cls[i] & L)
        return tok_run(cls, i, n, L) - i;
    if (cls[i] & N) {
        size_t j = i;
        while (j < n && (cls[j] & N) && j - i < max_digits)
            j++;
        return j - i;
    }
    size_t j = c == ' ' ? i + 1 : i;
    if (j < n && !(cls[j] & (L | N | S))) {
        j = tok_run_other(cls, j, n);
        while (j < n && (cp[j] == '\r' || cp[j] == '\n'))
            j++;
        return j - i;
    }
    if (cls[i] & S) {
        size_t last = SIZE_MAX;
        for (j = i; j < n && (cls[j] & S); j++)
            if (cp[j] == '\r' || cp[j] == '\n')
                last = j;
        if (last != SIZE_MAX)
            return last + 1 - i;
        return tok_space_run(cls, i, n);
    }
    return 1;
}

/* \p{P} or one of $ + < = > ^ ~ | : the first of llama.cpp's 'default'
 * regexes (cls: the KVP_UNICODE_* class of c).  In ASCII that is every
 * printable character but letters, digits and the backtick (\p{Sk}, and not
 * in the list). */
static int tok_is_default_punct(uint32_t c, uint8_t cls)
{
    return (cls & KVP_UNICODE_PUNCT) || c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' ||
           c == '~' || c == '|';
}

static int tok_is_ascii_digit(uint32_t c) { return c >= '0' && c <= '9'; }

static int tok_three_digits(const uint32_t *cp)
{
    return tok_is_ascii_digit(cp[0]) && tok_is_ascii_digit(cp[1]) && tok_is_ascii_digit(cp[2]);
}

/* The last two of llama.cpp's 'default' regexes on the word [lo, hi):
 * \p{N}+ cuts its runs of numbers out, then [0-9][0-9][0-9] three ASCII
 * digits at a time, leftmost first; the text between matches stays a piece
 * of its own (llama.cpp's unicode_regex_split keeps it). */
static int tok_split_numbers(tok_work *w, const uint8_t *text, size_t lo, size_t hi)
{
    int rc = 0;
    for (size_t i = lo; i < hi && rc == 0;) {
        int num = (w->cls[i] & N) != 0;
        size_t j = i;
        while (j < hi && ((w->cls[j] & N) != 0) == num)
            j++;
        size_t from = i;
        for (size_t k = i; num && k + 3 <= j && rc == 0;) {
            if (!tok_three_digits(w->cp + k)) {
                k++;
                continue;
            }
            if (k > from)
                rc = tok_gpt2_word(w, text + w->boff[from], w->boff[k] - w->boff[from]);
            if (rc == 0)
                rc = tok_gpt2_word(w, text + w->boff[k], w->boff[k + 3] - w->boff[k]);
            from = k += 3;
        }
        if (rc == 0 && from < j)
            rc = tok_gpt2_word(w, text + w->boff[from], w->boff[j] - w->boff[from]);
        i = j;
    }
    return rc;
}

/* llama.cpp's pre-tokenizer for a BPE vocabulary that names none
 * (LLAMA_VOCAB_PRE_TYPE_DEFAULT): four regexes, each cutting the pieces
 * the one before left, matches and the text between them alike:
 *   [\p{P}\$\+<=>\^~\|]+   runs of punctuation
 *   the GPT-2 pattern
 *   \p{N}+, [0-9][0-9][0-9]  (tok_split_numbers) */
static int tok_split_default(tok_work *w, const uint8_t *text, size_t lo, size_t hi)
{
    int rc = 0;
    for (size_t i = lo; i < hi && rc == 0;) {
        int punct = tok_is_default_punct(w->cp[i], w->cls[i]);
        size_t j = i;
        while (j < hi && tok_is_default_punct(w->cp[j], w->cls[j]) == punct)
            j++;
        for (size_t a = i; a < j && rc == 0;) {
            size_t k = tok_match_gpt2(w->cp, w->cls, a, j);
            rc = tok_split_numbers(w, text, a, a + k);
            a += k;
        }
        i = j;
    }
    return rc;
}

#undef L
#undef N
#undef S

/* Cut code points [lo, hi) into words with one pattern and BPE each. */
static int tok_split_pattern(tok_work *w, const uint8_t *text, size_t lo, size_t hi)
{
    for (size_t i = lo; i < hi;) {
        size_t k;
        switch (w->t->pre) {
        case KVP_TOK_PRE_LLAMA3: k = tok_match_llama3(w->cp, w->cls, i, hi, 3); break;
        case KVP_TOK_PRE_QWEN2: k = tok_match_llama3(w->cp, w->cls, i, hi, 1); break;
        default: k = tok_match_gpt2(w->cp, w->cls, i, hi); break;
        }
        int rc = tok_gpt2_word(w, text + w->boff[i], w->boff[i + k] - w->boff[i]);
        if (rc < 0)
            return rc;
        i += k;
    }
    return 0;
}

static int tok_encode_gpt2(tok_work *w, const uint8_t *text, size_t len)
{
    int rc = tok_reserve_text(w, len);
    if (rc < 0)
        return rc;
    size_t n = 0;
    for (size_t at = 0; at < len; n++) {
        w->boff[n] = at;
        at += kvp_unicode_decode((const char *)text + at, len - at, &w->cp[n]);
        w->cls[n] = (uint8_t)kvp_unicode_class_of(w->cp[n]);
    }
    w->boff[n] = len;
    if (w->t->pre == KVP_TOK_PRE_DEFAULT)
        return tok_split_default(w, text, 0, n);
    if (w->t->pre != KVP_TOK_PRE_SMOLLM)
        return tok_split_pattern(w, text, 0, n);
    /* SmolLM: every \p{N} is a word of its own; the pattern runs between. */
    size_t seg = 0;
    for (size_t i = 0; i < n; i++) {
        if (!(w->cls[i] & KVP_UNICODE_NUMBER))
            continue;
        rc = tok_split_pattern(w, text, seg, i);
        if (rc < 0 || (rc = tok_gpt2_word(w, text + w->boff[i], w->boff[i + 1] - w->boff[i])) < 0)
            return rc;
        seg = i + 1;
    }
    return tok_split_pattern(w, text, seg, n);
}

/* ------------------------------------------------------------------ */
/* SentencePiece BPE                                                   */

/* The ordered bits of -score: a higher score pops first. */
static uint32_t tok_score_key(float score)
{
    float neg = -score;
    uint32_t u;
    memcpy(&u, &neg, sizeof u);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

static void tok_spm_try_pair(tok_work *w, int32_t l)
{
    if (l < 0 || w->sym_next[l] < 0)
        return;
    int32_t r = w->sym_next[l];
    int32_t id = kvp_tokenizer_find(w->t, w->buf + w->sym_at[l], w->sym_len[l] + w->sym_len[r]);
    if (id < 0 || !tok_is_mergeable(w->t, id))
        return;
    tok_heap_push(w, (tok_heap_item){(uint64_t)tok_score_key(w->t->score[id]) << 32 | (uint32_t)l, l, r,
                                     (int32_t)w->sym_len[l], (int32_t)w->sym_len[r]});
}

static int tok_spm_emit_symbol(tok_work *w, int32_t s)
{
    const kvp_tokenizer *t = w->t;
    const char *p = w->buf + w->sym_at[s];
    int32_t id = kvp_tokenizer_find(t, p, w->sym_len[s]);
    if (id >= 0 && tok_is_mergeable(t, id))
        return tok_emit(w, id);
    for (uint32_t i = 0; i < w->sym_len[s]; i++) {
        uint8_t b = (uint8_t)p[i];
        id = t->byte_tok[b] >= 0 ? t->byte_tok[b] : t->unk;
        if (id < 0)
            return kvp_err_set(w->err, KVP_EFORMAT,
                               "tokenizer: no token for byte 0x%02x (no <0x%02X> and no unknown token)", b, b);
        int rc = tok_emit(w, id);
        if (rc < 0)
            return rc;
        if (id == t->unk)
            break; /* one <unk> stands for the whole character */
    }
    return 0;
}

/* BPE over the symbols [lo, hi) of w->buf as one word, then emit it. */
static int tok_spm_word(tok_work *w, int32_t lo, int32_t hi)
{
    for (int32_t i = lo; i < hi; i++) {
        w->sym_prev[i] = i > lo ? i - 1 : -1;
        w->sym_next[i] = i + 1 < hi ? i + 1 : -1;
    }
    w->n_heap = 0;
    for (int32_t i = lo; i + 1 < hi; i++)
        tok_spm_try_pair(w, i);
    while (w->n_heap) {
        tok_heap_item it = tok_heap_pop(w);
        int32_t l = it.l, r = it.r;
        if (w->sym_next[l] != r || (int32_t)w->sym_len[l] != it.a || (int32_t)w->sym_len[r] != it.b)
            continue;
        w->sym_len[l] += w->sym_len[r];
        w->sym_len[r] = 0;
        w->sym_next[l] = w->sym_next[r];
        w->sym_next[r] = -1;
        if (w->sym_next[l] >= 0)
            w->sym_prev[w->sym_next[l]] = l;
        tok_spm_try_pair(w, w->sym_prev[l]);
        tok_spm_try_pair(w, l);
    }
    int rc = 0;
    for (int32_t s = lo < hi ? lo : -1; s >= 0 && rc == 0; s = w->sym_next[s])
        rc = tok_spm_emit_symbol(w, s);
    return rc;
}

static int tok_is_metaspace(const void *p) { return memcmp(p, "\xE2\x96\x81", 3) == 0; }

/* Whether the text (len > 0 bytes, between special tokens; at_start: it
 * begins the whole text) gets a leading U+2581.  HF's Metaspace checks for
 * one after spaces became U+2581, so " lead" gets no second. */
static int tok_spm_wants_prefix(const kvp_tokenizer *t, const uint8_t *text, size_t len, int at_start)
{
    int has = text[0] == ' ' || (len >= 3 && tok_is_metaspace(text));
    switch (t->prefix) {
    case TOK_PREFIX_EVERY: return 1;
    case TOK_PREFIX_ALWAYS: return !has;
    case TOK_PREFIX_FIRST: return at_start && !has;
    default: return 0;
    }
}

static int tok_encode_spm(tok_work *w, const uint8_t *text, size_t len, int at_start)
{
    /* Every input byte is at most one symbol; a space grows to 3 bytes. */
    int rc = tok_reserve_word(w, len + 1, 3 * len + 3);
    if (rc < 0)
        return rc;
    size_t at = 0;
    if (tok_spm_wants_prefix(w->t, text, len, at_start)) {
        memcpy(w->buf, "\xE2\x96\x81", 3);
        at = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(w->buf + at, "\xE2\x96\x81", 3);
            at += 3;
        } else {
            w->buf[at++] = (char)text[i];
        }
    }
    int32_t n = 0;
    for (size_t i = 0; i < at; n++) {
        uint32_t cp;
        size_t k = kvp_unicode_decode(w->buf + i, at - i, &cp);
        w->sym_at[n] = (uint32_t)i;
        w->sym_len[n] = (uint32_t)k;
        i += k;
    }
    /* HF's Metaspace with split: each U+2581 starts a word (it goes with
     * what follows), and no merge crosses from one word to the next. */
    int32_t lo = 0;
    for (int32_t i = 1; i <= n && rc == 0; i++)
        if (i == n || (w->t->split_words && w->sym_len[i] == 3 && tok_is_metaspace(w->buf + w->sym_at[i]))) {
            rc = tok_spm_word(w, lo, i);
            lo = i;
        }
    return rc;
}

/* ------------------------------------------------------------------ */
/* encode                                                              */

/* A text between special tokens; at_start: it begins the whole text. */
static int tok_encode_raw(tok_work *w, const uint8_t *text, size_t len, int at_start)
{
    if (len == 0)
        return 0;
    if (w->t->model == KVP_TOK_MODEL_SPM)
        return tok_encode_spm(w, text, len, at_start);
    return tok_encode_gpt2(w, text, len);
}

/* Special tokens are cut out of the text as llama.cpp's tokenizer does
 * (tokenizer_st_partition): every token, longest first (equal lengths by id),
 * takes each occurrence, left to right, that lies wholly in text no longer
 * token has taken.  That differs from a leftmost-longest scan only where two
 * tokens overlap ("ab" + "bcd" in "abcd" gives a|bcd, not ab|cd).  A control
 * or unknown token is taken only inside a special span; a user-defined one
 * anywhere.  With an NFC normalizer, as HF's added vocabulary: the tokens
 * tokenizer.kvpipe.normalized_tokens lists are cut out of the text between
 * the others after that is normalized, the others out of the raw text. */
typedef enum tok_cut_pass {
    TOK_CUT_ALL,        /* every token (no normalizer) */
    TOK_CUT_RAW,        /* those matched before normalization */
    TOK_CUT_NORMALIZED, /* those matched after it */
} tok_cut_pass;

typedef struct tok_cut {
    uint64_t key;  /* ~len << 32 | id: the order tokens take their turn in */
    size_t at;     /* byte offset in the text */
} tok_cut;

static int tok_cut_cmp(const void *pa, const void *pb)
{
    const tok_cut *a = pa, *b = pb;
    if (a->key != b->key)
        return a->key < b->key ? -1 : 1;
    return a->at < b->at ? -1 : a->at > b->at;
}

static int tok_cut_at_cmp(const void *pa, const void *pb)
{
    const tok_cut *a = pa, *b = pb;
    return a->at < b->at ? -1 : a->at > b->at;
}

/* Whether [at, at + len) lies inside one of the sorted spans, from *k on
 * (*k only moves forward as at grows). */
static int tok_in_span(const kvp_tok_span *sp, size_t n_sp, size_t *k, size_t at, size_t len)
{
    while (*k < n_sp && sp[*k].off + sp[*k].len <= at)
        (*k)++;
    return *k < n_sp && sp[*k].off <= at && at + len <= sp[*k].off + sp[*k].len;
}

/* The accepted cuts of text, sorted by offset, into *out (*n_out). */
static int tok_find_cuts(const kvp_tokenizer *t, const uint8_t *s, size_t len, const kvp_tok_span *sp,
                         size_t n_sp, tok_cut_pass pass, tok_cut **out, size_t *n_out, kvp_err *err)
{
    tok_cut *c = NULL;
    size_t n = 0, cap = 0, k = 0;
    *out = NULL;
    *n_out = 0;
    for (size_t i = 0; i < len; i++) {
        for (uint32_t j = t->special_at[s[i]]; j < t->special_at[s[i] + 1]; j++) {
            int32_t id = t->special[j];
            size_t l;
            const char *x = tok_text(t, id, &l);
            if (l > len - i || memcmp(x, s + i, l) != 0)
                continue;
            if (pass != TOK_CUT_ALL && (t->normalized && t->normalized[id]) != (pass == TOK_CUT_NORMALIZED))
                continue;
            if (t->type[id] != KVP_TOKEN_USER_DEFINED && !tok_in_span(sp, n_sp, &k, i, l))
                continue;
            if (n == cap) {
                size_t nc = cap ? 2 * cap : 16;
                tok_cut *g = realloc(c, nc * sizeof *c);
                if (!g) {
                    free(c);
                    return kvp_err_set(err, KVP_ENOMEM, "tokenizer: out of memory");
                }
                c = g;
                cap = nc;
            }
            c[n++] = (tok_cut){(uint64_t)(UINT32_MAX - (uint32_t)l) << 32 | (uint32_t)id, i};
        }
    }
    if (n == 0)
        return 0;
    /* Taken bytes as a bitmap over the text: a cut is accepted when none of
     * its bytes is taken. */
    uint8_t *taken = calloc(len / 8 + 1, 1);
    if (!taken) {
        free(c);
        return kvp_err_set(err, KVP_ENOMEM, "tokenizer: out of memory");
    }
    qsort(c, n, sizeof *c, tok_cut_cmp);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        size_t at = c[i].at, l = UINT32_MAX - (uint32_t)(c[i].key >> 32), b;
        for (b = at; b < at + l && !(taken[b >> 3] >> (b & 7) & 1); b++)
            ;
        if (b < at + l)
            continue;
        for (b = at; b < at + l; b++)
            taken[b >> 3] |= (uint8_t)(1u << (b & 7));
        c[m++] = c[i];
    }
    free(taken);
    qsort(c, m, sizeof *c, tok_cut_at_cmp);
    *out = c;
    *n_out = m;
    return 0;
}

static int tok_encode_segment(tok_work *w, const uint8_t *text, size_t len, int at_start, int special);

/* The raw text's [from, end), between the tokens cut from it, to
 * tok_encode_segment: whole, as HF normalizes it, or, when control tokens
 * are matched after normalization, in parts cut where the special spans
 * begin and end, so that each part is special throughout or not at all
 * (*k: the first span that may hold from). */
static int tok_encode_segments(tok_work *w, const uint8_t *s, size_t from, size_t end, const kvp_tok_span *sp,
                               size_t n_sp, size_t *k)
{
    if (!w->t->normalized_control)
        return tok_encode_segment(w, s + from, end - from, from == 0, tok_in_span(sp, n_sp, k, from, end - from));
    int rc = 0;
    while (from < end && rc == 0) {
        while (*k < n_sp && sp[*k].off + sp[*k].len <= from)
            (*k)++;
        int special = *k < n_sp && sp[*k].off <= from;
        size_t stop = *k == n_sp ? end : special ? sp[*k].off + sp[*k].len : sp[*k].off;
        stop = stop < end ? stop : end;
        rc = tok_encode_segment(w, s + from, stop - from, from == 0, special);
        from = stop;
    }
    return rc;
}

/* The text s[0..len) with its cuts (sorted by offset): each token's id, and
 * the pieces between encoded, at_start telling whether s begins the whole
 * text.  raw_text: s is the caller's text, sp its special spans, and each
 * piece a segment to normalize (tok_encode_segment); else s is normalized. */
static int tok_encode_cut(tok_work *w, const uint8_t *s, size_t len, const tok_cut *cut, size_t n_cut, int at_start,
                          int raw_text, const kvp_tok_span *sp, size_t n_sp)
{
    size_t from = 0, k = 0;
    int rc = 0;
    for (size_t i = 0; i <= n_cut && rc == 0; i++) {
        size_t end = i < n_cut ? cut[i].at : len;
        if (!raw_text)
            rc = tok_encode_raw(w, s + from, end - from, at_start && from == 0);
        else if (end > from)
            rc = tok_encode_segments(w, s, from, end, sp, n_sp, &k);
        if (rc < 0 || i == n_cut)
            break;
        int32_t id = (int32_t)(uint32_t)cut[i].key;
        size_t l;
        tok_text(w->t, id, &l);
        rc = tok_emit(w, id);
        from = cut[i].at + l;
    }
    return rc;
}

/* A text between the tokens cut from the raw text (special: it lies in
 * one special span).  With an NFC normalizer it is encoded as HF encodes
 * it: in NFC, with the tokens matched after normalization cut out of that
 * (control ones only where special). */
static int tok_encode_segment(tok_work *w, const uint8_t *text, size_t len, int at_start, int special)
{
    const kvp_tokenizer *t = w->t;
    if (!t->nfc)
        return tok_encode_raw(w, text, len, at_start);
    char *norm;
    size_t nl, n_cut = 0;
    tok_cut *cut = NULL;
    int rc = kvp_unicode_nfc((const char *)text, len, &norm, &nl, w->err);
    if (rc < 0)
        return rc;
    kvp_tok_span all = {0, nl};
    if (t->normalized)
        rc = tok_find_cuts(t, (const uint8_t *)norm, nl, &all, special ? 1 : 0, TOK_CUT_NORMALIZED, &cut, &n_cut,
                           w->err);
    if (rc == 0)
        rc = tok_encode_cut(w, (const uint8_t *)norm, nl, cut, n_cut, at_start, 0, NULL, 0);
    free(cut);
    free(norm);
    return rc;
}

int kvp_tokenizer_encode_spans(const kvp_tokenizer *t, const char *text, size_t len, const kvp_tok_span *special,
                               size_t n_special, int add_bos, int32_t **ids, size_t *n, kvp_err *err)
{
    *ids = NULL;
    *n = 0;
    if (!text && len)
        return kvp_err_set(err, KVP_EINVAL, "tokenizer: NULL text");
    if (len > TOK_MAX_TEXT)
        return kvp_err_set(err, KVP_ELIMIT, "tokenizer: text of %zu bytes is over the %llu-byte limit", len,
                           (unsigned long long)TOK_MAX_TEXT);
    for (size_t i = 0; i < n_special; i++)
        if (special[i].off > len || special[i].len > len - special[i].off ||
            (i && special[i].off < special[i - 1].off + special[i - 1].len))
            return kvp_err_set(err, KVP_EINVAL, "tokenizer: special span %zu (%zu+%zu) is out of order or outside "
                               "the %zu-byte text", i, special[i].off, special[i].len, len);
    tok_work w = {.t = t, .err = err};
    const uint8_t *s = (const uint8_t *)text;
    tok_cut *cut = NULL;
    size_t n_cut = 0;
    int rc = tok_find_cuts(t, s, len, special, n_special, t->nfc ? TOK_CUT_RAW : TOK_CUT_ALL, &cut, &n_cut, err);
    int vocab_choice = add_bos < 0;
    if (add_bos < 0)
        add_bos = t->add_bos;
    if (rc == 0 && add_bos && t->bos >= 0)
        rc = tok_emit(&w, t->bos);
    if (rc == 0)
        rc = tok_encode_cut(&w, s, len, cut, n_cut, 1, 1, special, n_special);
    if (rc == 0 && vocab_choice && t->add_eos && t->eos >= 0)
        rc = tok_emit(&w, t->eos);
    free(cut);
    tok_work_free(&w);
    if (rc < 0) {
        free(w.ids);
        return rc;
    }
    *ids = w.ids;
    *n = w.n_ids;
    return 0;
}

int kvp_tokenizer_encode(const kvp_tokenizer *t, const char *text, size_t len, int parse_special, int add_bos,
                         int32_t **ids, size_t *n, kvp_err *err)
{
    kvp_tok_span all = {0, len};
    return kvp_tokenizer_encode_spans(t, text, len, &all, parse_special ? 1 : 0, add_bos, ids, n, err);
}

/* ------------------------------------------------------------------ */
/* detokenize                                                          */

void kvp_detok_init(kvp_detok *d, const kvp_tokenizer *t, int flags)
{
    memset(d, 0, sizeof *d);
    d->t = t;
    d->flags = flags;
    d->strip_left = flags & KVP_DETOK_STRIP_SPACE ? t->strip_leading : 0;
}

/* Append the first token's piece without the spaces its U+2581 became
 * (HF's Metaspace decoder drops them all from the first token). */
static void tok_put_without_spaces(kvp_buf *out, const char *p, size_t len)
{
    for (size_t i = 0; i < len;) {
        size_t k = i;
        while (k < len && p[k] != ' ')
            k++;
        kvp_buf_put(out, p + i, k - i);
        i = k + 1;
    }
}

static int tok_all_spaces(const char *p, size_t len)
{
    while (len && *p == ' ')
        p++, len--;
    return len == 0;
}

int kvp_detok_push(kvp_detok *d, int32_t id, kvp_buf *out, kvp_err *err)
{
    const kvp_tokenizer *t = d->t;
    size_t len;
    const char *p = kvp_tokenizer_piece(t, id, &len);
    /* An id past the tokenizer's tokens is one of a model's padded
     * embedding rows (Qwen2.5: 151,936 rows, 151,665 tokens): a legal
     * draw that has no text, as HF's tokenizers decode skips it (an error
     * here ended every sequence of the job at one sampled pad). */
    if (!p && id >= 0)
        return 0;
    if (!p)
        return kvp_err_set(err, KVP_EINVAL, "detokenize: token id %d is negative", (int)id);
    if (tok_is_control(t, id) && !(d->flags & KVP_DETOK_SPECIAL))
        return 0;
    if (len == 0)
        return 0;
    int drop_spaces = !d->started && (d->flags & KVP_DETOK_STRIP_SPACE) && t->strip_first_token &&
                      t->type[id] == KVP_TOKEN_NORMAL;
    d->started = 1;
    /* HF's Strip decoder: up to strip_leading spaces off the start of the
     * whole text, however many tokens they take (after the Metaspace
     * decoder's, which leaves no space in the first token) */
    while (!drop_spaces && d->strip_left && len && p[0] == ' ')
        p++, len--, d->strip_left--;
    if (len && !(drop_spaces && tok_all_spaces(p, len)))
        d->strip_left = 0;
    size_t start = out->len;
    kvp_buf_put(out, d->pend, d->n_pend);
    if (drop_spaces)
        tok_put_without_spaces(out, p, len);
    else
        kvp_buf_put(out, p, len);
    if (out->oom)
        return kvp_err_set(err, KVP_ENOMEM, "detokenize: out of memory");
    if (out->len == start)
        return 0; /* a piece that was only the stripped space */
    /* Hold back a character that later bytes may finish. */
    size_t ok = kvp_unicode_complete_prefix((const char *)out->data + start, out->len - start);
    d->n_pend = out->len - start - ok;
    memcpy(d->pend, out->data + start + ok, d->n_pend);
    out->len = start + ok;
    return 0;
}

int kvp_detok_flush(kvp_detok *d, kvp_buf *out, kvp_err *err)
{
    kvp_buf_put(out, d->pend, d->n_pend);
    d->n_pend = 0;
    if (out->oom)
        return kvp_err_set(err, KVP_ENOMEM, "detokenize: out of memory");
    return 0;
}

int kvp_detok_resume(kvp_detok *d, const uint32_t *ids, size_t n, kvp_err *err)
{
    kvp_buf shown; /* their text, a token's at a time: only what d holds back is kept */
    kvp_buf_init(&shown);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        shown.len = 0;
        rc = kvp_detok_push(d, (int32_t)ids[i], &shown, err);
    }
    kvp_buf_free(&shown);
    return rc;
}

int kvp_tokenizer_decode(const kvp_tokenizer *t, const int32_t *ids, size_t n, int flags, kvp_buf *out,
                         kvp_err *err)
{
    kvp_detok d;
    kvp_detok_init(&d, t, flags);
    for (size_t i = 0; i < n; i++) {
        int rc = kvp_detok_push(&d, ids[i], out, err);
        if (rc < 0)
            return rc;
    }
    return kvp_detok_flush(&d, out, err);
}

int64_t kvp_tokenizer_vocab_diff(const kvp_tokenizer *a, const kvp_tokenizer *b)
{
    size_t na = kvp_tokenizer_n_vocab(a), nb = kvp_tokenizer_n_vocab(b), n = na < nb ? na : nb;
    for (size_t i = 0; i < n; i++) {
        size_t la = 0, lb = 0;
        const char *pa = kvp_tokenizer_piece(a, (int32_t)i, &la), *pb = kvp_tokenizer_piece(b, (int32_t)i, &lb);
        if (!pa || !pb || la != lb || (la && memcmp(pa, pb, la) != 0))
            return (int64_t)i;
    }
    return na == nb ? -1 : (int64_t)n;
}
