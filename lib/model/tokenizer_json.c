/* tokenizer_json.c - an HF tokenizer.json as tokenizer.ggml.* metadata.
 *
 * We translate rather than keep a second tokenizer: the keys written here are
 * the ones a GGUF converter writes, so one code path (kvp_tokenizer_load_meta)
 * serves GGUF, KVP TOKENIZER records and HF folders, and quantize can store
 * the result as is.  Only BPE models are accepted: byte-level ones (a
 * ByteLevel pre-tokenizer or decoder) and SentencePiece-style ones (byte
 * fallback, U+2581 for spaces).
 */
#include "json.h"
#include "tokenizer.h"
#include "unicode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TJ_LLAMA3_RE "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define TJ_QWEN2_RE "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

typedef struct tj_vocab {
    uint64_t n;
    const char **text;
    size_t *len;
    int32_t *type;
    float *score;
    uint8_t *normalized; /* an added token HF matches in the normalized text */
} tj_vocab;

static void tj_vocab_free(tj_vocab *v)
{
    free(v->text);
    free(v->len);
    free(v->type);
    free(v->score);
    free(v->normalized);
}

/* What tokenizer.json's normalizer does, of what kvpipe can do too. */
typedef struct tj_norm {
    int nfc;     /* NFC */
    int prepend; /* Prepend "\u2581" (SentencePiece-style) */
} tj_norm;

/* Does the component v (or any member of a Sequence) have "type": name? */
static const kvp_json *tj_find_type(const kvp_json *v, const char *name)
{
    const char *ty = kvp_json_get_str(v, "type");
    if (!ty)
        return NULL;
    if (!strcmp(ty, name))
        return v;
    if (strcmp(ty, "Sequence"))
        return NULL;
    const kvp_json *list = kvp_json_get(v, "pretokenizers");
    if (!list)
        list = kvp_json_get(v, "normalizers");
    if (!list)
        list = kvp_json_get(v, "decoders");
    if (!list)
        list = kvp_json_get(v, "processors");
    for (size_t i = 0; list && i < list->n; i++) {
        const kvp_json *hit = tj_find_type(kvp_json_at(list, i), name);
        if (hit)
            return hit;
    }
    return NULL;
}

/* HF's normalizer v (null, one, or a Sequence of them, nested or not) into
 * *out.  kvpipe does NFC, and for a SentencePiece-style vocabulary
 * (!byte_level) a Prepend of U+2581 (llama.cpp's add_space_prefix) and a
 * Replace of " " with U+2581 (what its encoder does anyway); in any order,
 * as these commute.  Any other normalizer (NFD, NFKC, NFKD, Lowercase,
 * Strip, StripAccents, BertNormalizer, Precompiled, another Prepend or
 * Replace, ...) would change HF's ids and is refused, not skipped. */
static int tj_normalizer(const kvp_json *v, int byte_level, tj_norm *out, const char *src, kvp_err *err)
{
    if (!v || v->type == KVP_JSON_NULL)
        return 0;
    const char *ty = kvp_json_get_str(v, "type");
    char show[64];
    if (!ty)
        return kvp_err_set(err, KVP_EFORMAT, "%s: normalizer: not an object with a \"type\"", src);
    if (!strcmp(ty, "Sequence")) {
        const kvp_json *list = kvp_json_get(v, "normalizers");
        if (!list || list->type != KVP_JSON_ARRAY)
            return kvp_err_set(err, KVP_EFORMAT, "%s: normalizer: a Sequence without a \"normalizers\" array", src);
        for (size_t i = 0; i < list->n; i++) {
            int rc = tj_normalizer(&list->items[i], byte_level, out, src, err);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    if (!strcmp(ty, "NFC")) {
        out->nfc = 1;
        return 0;
    }
    int spm = !byte_level && (!strcmp(ty, "Prepend") || !strcmp(ty, "Replace"));
    if (spm && !strcmp(ty, "Prepend")) {
        const kvp_json *p = kvp_json_get(v, "prepend");
        if (p && p->type == KVP_JSON_STRING && !strcmp(p->str, "\xE2\x96\x81")) {
            out->prepend = 1;
            return 0;
        }
        int str = p && p->type == KVP_JSON_STRING;
        kvp_json_show(show, sizeof show, str ? p->str : "", str ? p->len : 0);
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: normalizer: Prepend %s is not supported (U+2581 only)", src,
                           show);
    }
    if (spm) {
        const kvp_json *from = kvp_json_get(kvp_json_get(v, "pattern"), "String");
        const kvp_json *to = kvp_json_get(v, "content");
        if (from && from->type == KVP_JSON_STRING && !strcmp(from->str, " ") && to && to->type == KVP_JSON_STRING &&
            !strcmp(to->str, "\xE2\x96\x81"))
            return 0;
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: normalizer: a Replace other than \" \" with U+2581 is not "
                           "supported", src);
    }
    kvp_json_show(show, sizeof show, ty, strlen(ty));
    return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: normalizer: %s is not supported (kvpipe applies NFC%s): the ids "
                       "would differ from HF's", src, show,
                       byte_level ? "" : ", and Prepend and Replace of U+2581 for a SentencePiece-style vocabulary");
}

/* With an NFC normalizer, the added tokens HF matches in the normalized
 * text (normalized: true, the default of one that is not special), as
 * tokenizer.kvpipe.normalized_tokens; the others it matches before.  Such
 * a token whose own text NFC changes would match only its NFC form, and a
 * SentencePiece-style vocabulary puts U+2581 in front before they are
 * matched: kvpipe does neither, and refuses them. */
static int tj_normalized_tokens(kvp_meta *m, const tj_vocab *v, int byte_level, const char *src, kvp_err *err)
{
    int32_t *ids = malloc(v->n * sizeof *ids);
    uint64_t n = 0;
    int rc = ids ? 0 : kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", src);
    for (uint64_t i = 0; rc == 0 && i < v->n; i++) {
        if (!v->normalized[i])
            continue;
        char show[64], *nfc = NULL;
        size_t nl;
        kvp_json_show(show, sizeof show, v->text[i], v->len[i]);
        if (!byte_level)
            rc = kvp_err_set(err, KVP_EUNSUPPORTED, "%s: added token %llu %s: matched after the NFC normalizer "
                             "(normalized: true) in a SentencePiece-style vocabulary: not supported", src,
                             (unsigned long long)i, show);
        else if ((rc = kvp_unicode_nfc(v->text[i], v->len[i], &nfc, &nl, err)) == 0 &&
                 (nl != v->len[i] || memcmp(nfc, v->text[i], nl) != 0))
            rc = kvp_err_set(err, KVP_EUNSUPPORTED, "%s: added token %llu %s: not in NFC, and matched after the "
                             "NFC normalizer (normalized: true): not supported", src, (unsigned long long)i, show);
        free(nfc);
        if (rc == 0)
            ids[n++] = (int32_t)i;
    }
    if (rc == 0 && n && kvp_meta_set_arr(m, "tokenizer.kvpipe.normalized_tokens", KVP_META_ARR_I32, ids, n) < 0)
        rc = kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", src);
    free(ids);
    return rc;
}

static int32_t tj_lookup(const tj_vocab *v, const char *s)
{
    size_t len = strlen(s);
    for (uint64_t i = 0; i < v->n; i++)
        if (v->text[i] && v->len[i] == len && memcmp(v->text[i], s, len) == 0)
            return (int32_t)i;
    return -1;
}

static int tj_read_vocab(tj_vocab *v, const kvp_json *root, const kvp_json *model, const char *src, kvp_err *err)
{
    const kvp_json *vocab = kvp_json_get(model, "vocab");
    const kvp_json *added = kvp_json_get(root, "added_tokens");
    if (!vocab || vocab->type != KVP_JSON_OBJECT)
        return kvp_err_set(err, KVP_EFORMAT, "%s: model.vocab: missing or not an object", src);
    uint64_t n = 0, id;
    for (size_t i = 0; i < vocab->n; i++) {
        if (kvp_json_to_u64(&vocab->items[i], &id) < 0 || id >= KVP_TOK_MAX_VOCAB)
            return kvp_err_set(err, KVP_EFORMAT, "%s: model.vocab[\"%.40s\"]: id is not an integer below %u", src,
                               vocab->keys[i], KVP_TOK_MAX_VOCAB);
        n = id + 1 > n ? id + 1 : n;
    }
    for (size_t i = 0; added && i < added->n; i++) {
        if (kvp_json_get_u64(&added->items[i], "id", &id) < 0 || id >= KVP_TOK_MAX_VOCAB ||
            !kvp_json_get_str(&added->items[i], "content"))
            return kvp_err_set(err, KVP_EFORMAT, "%s: added_tokens[%zu]: needs an id below %u and a content", src, i,
                               KVP_TOK_MAX_VOCAB);
        n = id + 1 > n ? id + 1 : n;
    }
    if (n == 0)
        return kvp_err_set(err, KVP_EFORMAT, "%s: model.vocab: empty", src);
    v->n = n;
    v->text = calloc(n, sizeof *v->text);
    v->len = calloc(n, sizeof *v->len);
    v->type = calloc(n, sizeof *v->type);
    v->score = calloc(n, sizeof *v->score);
    v->normalized = calloc(n, 1);
    if (!v->text || !v->len || !v->type || !v->score || !v->normalized)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory for %llu tokens", src, (unsigned long long)n);
    for (size_t i = 0; i < vocab->n; i++) {
        kvp_json_to_u64(&vocab->items[i], &id);
        if (v->text[id])
            return kvp_err_set(err, KVP_EFORMAT, "%s: model.vocab: id %llu is given twice", src,
                               (unsigned long long)id);
        v->text[id] = vocab->keys[i];
        v->len[id] = vocab->key_lens[i];
        v->type[id] = KVP_TOKEN_NORMAL;
    }
    for (size_t i = 0; added && i < added->n; i++) {
        const kvp_json *a = &added->items[i];
        int special = 0, normalized;
        kvp_json_get_u64(a, "id", &id);
        kvp_json_get_bool(a, "special", &special);
        normalized = !special; /* tokenizers' default for an added token */
        kvp_json_get_bool(a, "normalized", &normalized);
        const kvp_json *c = kvp_json_get(a, "content");
        v->text[id] = c->str;
        v->len[id] = c->len;
        v->type[id] = special ? KVP_TOKEN_CONTROL : KVP_TOKEN_USER_DEFINED;
        v->normalized[id] = normalized != 0;
    }
    return 0;
}

/* Merges as "A B" strings (tokenizer.json has them as strings or as pairs). */
static int tj_merges(kvp_meta *m, const kvp_json *model, const char *src, kvp_err *err)
{
    const kvp_json *mg = kvp_json_get(model, "merges");
    if (!mg)
        return 0;
    if (mg->type != KVP_JSON_ARRAY)
        return kvp_err_set(err, KVP_EFORMAT, "%s: model.merges: not an array", src);
    char **s = calloc(mg->n ? mg->n : 1, sizeof *s);
    size_t *lens = calloc(mg->n ? mg->n : 1, sizeof *lens);
    int rc = 0;
    if (!s || !lens)
        rc = kvp_err_set(err, KVP_ENOMEM, "%s: out of memory for %zu merges", src, mg->n);
    for (size_t i = 0; rc == 0 && i < mg->n; i++) {
        const kvp_json *e = &mg->items[i];
        if (e->type == KVP_JSON_STRING) {
            /* not strdup: a merge may hold "\u0000", and lens[i] counts past it */
            s[i] = malloc(e->len + 1);
            if (s[i])
                memcpy(s[i], e->str, e->len + 1);
            lens[i] = e->len;
        } else if (e->type == KVP_JSON_ARRAY && e->n == 2 && e->items[0].type == KVP_JSON_STRING &&
                   e->items[1].type == KVP_JSON_STRING) {
            lens[i] = e->items[0].len + 1 + e->items[1].len;
            s[i] = malloc(lens[i] + 1);
            if (s[i]) {
                memcpy(s[i], e->items[0].str, e->items[0].len);
                s[i][e->items[0].len] = ' ';
                memcpy(s[i] + e->items[0].len + 1, e->items[1].str, e->items[1].len + 1);
            }
        } else {
            rc = kvp_err_set(err, KVP_EFORMAT, "%s: model.merges[%zu]: not \"A B\" nor [\"A\", \"B\"]", src, i);
            break;
        }
        if (!s[i])
            rc = kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", src);
    }
    if (rc == 0 && kvp_meta_set_strarr(m, "tokenizer.ggml.merges", (const char *const *)s, lens, mg->n) < 0)
        rc = kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", src);
    free(lens);
    for (size_t i = 0; s && i < mg->n; i++)
        free(s[i]);
    free(s);
    return rc;
}

static int tj_pre(const kvp_json *root, const char **pre, const char *src, kvp_err *err)
{
    const kvp_json *pt = kvp_json_get(root, "pre_tokenizer");
    const kvp_json *digits = tj_find_type(pt, "Digits");
    const kvp_json *split = tj_find_type(pt, "Split");
    if (digits) {
        int indiv = 0;
        kvp_json_get_bool(digits, "individual_digits", &indiv);
        if (!indiv || split)
            return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: pre_tokenizer: this Digits/Split combination is not one we know",
                               src);
        *pre = "smollm";
        return 0;
    }
    if (split) {
        const char *re = kvp_json_get_str(kvp_json_get(split, "pattern"), "Regex");
        if (re && !strcmp(re, TJ_LLAMA3_RE)) {
            *pre = "llama-bpe";
            return 0;
        }
        if (re && !strcmp(re, TJ_QWEN2_RE)) {
            *pre = "qwen2";
            return 0;
        }
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: pre_tokenizer: Split pattern \"%.80s\" is not one we know", src,
                           re ? re : "(not a regex)");
    }
    *pre = "gpt-2"; /* llama.cpp's name for it */
    return 0;
}

/* HF's Metaspace component (pre-tokenizer or decoder) v: its prepend
 * scheme ("always", "first", "never") and split, as tokenizers reads it:
 * a file older than prepend_scheme has add_prefix_space, true meaning
 * "always" and false "never". */
static int tj_metaspace(const kvp_json *v, const char *field, const char **scheme, int *split, const char *src,
                        kvp_err *err)
{
    const char *rep = kvp_json_get_str(v, "replacement");
    if (rep && strcmp(rep, "\xE2\x96\x81") != 0)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: %s: Metaspace replacement \"%.20s\" is not supported "
                           "(U+2581)", src, field, rep);
    const char *ps = kvp_json_get_str(v, "prepend_scheme");
    int aps = 1, has_aps = kvp_json_get_bool(v, "add_prefix_space", &aps) == 0;
    if (ps && strcmp(ps, "always") && strcmp(ps, "first") && strcmp(ps, "never"))
        return kvp_err_set(err, KVP_EFORMAT, "%s: %s: Metaspace prepend_scheme \"%.20s\" is not always, first or "
                           "never", src, field, ps);
    if (has_aps && !aps && ps && strcmp(ps, "never"))
        return kvp_err_set(err, KVP_EFORMAT, "%s: %s: Metaspace add_prefix_space false contradicts prepend_scheme "
                           "\"%s\"", src, field, ps);
    *scheme = ps ? ps : aps ? "always" : "never";
    *split = 1;
    kvp_json_get_bool(v, "split", split);
    return 0;
}

/* The SentencePiece-style rules HF applies around the BPE, as
 * tokenizer.kvpipe.* keys (kvp(5)); without them a reader follows
 * llama.cpp's add_space_prefix rules, which differ:
 *   a Prepend normalizer puts U+2581 before every text between special
 *   tokens, as llama.cpp does (add_space_prefix, no scheme key);
 *   a Metaspace pre-tokenizer puts it only where its prepend_scheme says
 *   and the text does not start with one already, and with split BPE runs
 *   on each U+2581-led word apart;
 *   decoding a text from its start drops the spaces the decoder drops: a
 *   Strip decoder's leading ones, a Metaspace decoder's of the first token. */
static int tj_spm_rules(kvp_meta *m, const kvp_json *root, int prepend, const char *src, kvp_err *err)
{
    const kvp_json *ms = tj_find_type(kvp_json_get(root, "pre_tokenizer"), "Metaspace");
    const char *scheme = "never";
    int split = 0, rc;
    if (ms && (rc = tj_metaspace(ms, "pre_tokenizer", &scheme, &split, src, err)) < 0)
        return rc;
    const kvp_json *dec = kvp_json_get(root, "decoder");
    const kvp_json *dms = tj_find_type(dec, "Metaspace"), *strip = tj_find_type(dec, "Strip");
    const char *dec_scheme = "never";
    int dec_split;
    if (dms && (rc = tj_metaspace(dms, "decoder", &dec_scheme, &dec_split, src, err)) < 0)
        return rc;
    uint64_t n_strip = 0;
    const char *content = kvp_json_get_str(strip, "content");
    if (content && !strcmp(content, " ") && kvp_json_get_u64(strip, "start", &n_strip) == 0 && n_strip > 64)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: decoder: Strip start %llu is over 64", src,
                           (unsigned long long)n_strip);
    if (!content || strcmp(content, " "))
        n_strip = 0;
    /* A Prepend normalizer has put U+2581 in front of every text before the
     * Metaspace looks (so it adds none): llama.cpp's rule. */
    if (kvp_meta_set_bool(m, "tokenizer.ggml.add_space_prefix", prepend || (ms && strcmp(scheme, "never"))) < 0 ||
        (ms && !prepend && kvp_meta_set_str(m, "tokenizer.kvpipe.prepend_scheme", scheme, strlen(scheme)) < 0) ||
        (ms && kvp_meta_set_bool(m, "tokenizer.kvpipe.metaspace_split", split) < 0) ||
        kvp_meta_set_u64(m, "tokenizer.kvpipe.decode_strip", n_strip) < 0 ||
        kvp_meta_set_bool(m, "tokenizer.kvpipe.decode_metaspace", dms && strcmp(dec_scheme, "never")) < 0)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", src);
    return 0;
}

/* SentencePiece priority from the merge list: a token made by merge r
 * scores -r, so the scores replay HF's ranks; tokens no merge makes never
 * win a pair.  A provisional tokenizer gives the text -> id lookups. */
static int tj_spm_scores(tj_vocab *v, kvp_meta *m, const char *src, kvp_err *err)
{
    kvp_tokenizer *t;
    int rc = kvp_tokenizer_load_meta(&t, m, src, err);
    if (rc < 0)
        return rc;
    for (uint64_t i = 0; i < v->n; i++)
        v->score[i] = v->len[i] > 1 && v->type[i] == KVP_TOKEN_NORMAL ? -1e30f : 0.0f;
    const kvp_meta_entry *e = kvp_meta_find(m, "tokenizer.ggml.merges");
    char *both = malloc(2 * KVP_TOK_MAX_TOKEN_BYTES + 2);
    if (!both) {
        kvp_tokenizer_free(t);
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", src);
    }
    for (uint64_t r = 0; e && r < e->n; r++) {
        size_t len;
        const char *s = kvp_meta_str_at(e, r, &len);
        const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
        if (!sp || len > 2 * KVP_TOK_MAX_TOKEN_BYTES)
            continue;
        size_t la = (size_t)(sp - s), lb = len - la - 1;
        memcpy(both, s, la);
        memcpy(both + la, sp + 1, lb);
        int32_t id = kvp_tokenizer_find(t, both, la + lb);
        if (id >= 0 && v->score[id] == -1e30f)
            v->score[id] = -(float)r;
    }
    free(both);
    kvp_tokenizer_free(t);
    if (kvp_meta_set_arr(m, "tokenizer.ggml.scores", KVP_META_ARR_F32, v->score, v->n) < 0)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", src);
    return 0;
}

/* BOS from the post-processor's template ("<s> $A"): that token, added. */
static int32_t tj_template_bos(const kvp_json *root, const tj_vocab *v)
{
    const kvp_json *tp = tj_find_type(kvp_json_get(root, "post_processor"), "TemplateProcessing");
    const kvp_json *first = kvp_json_at(kvp_json_get(tp, "single"), 0);
    const char *name = kvp_json_get_str(kvp_json_get(first, "SpecialToken"), "id");
    return name ? tj_lookup(v, name) : -1;
}

static int32_t tj_first_of(const tj_vocab *v, const char *const *names)
{
    for (; *names; names++) {
        int32_t id = tj_lookup(v, *names);
        if (id >= 0)
            return id;
    }
    return -1;
}

static int tj_set_id(kvp_meta *m, const char *key, int32_t id)
{
    return id < 0 ? 0 : kvp_meta_set_u64(m, key, (uint64_t)id);
}

static int tj_fill(kvp_meta *m, const kvp_json *root, const char *src, tj_vocab *v, kvp_err *err)
{
    const kvp_json *model = kvp_json_get(root, "model");
    const char *mtype = kvp_json_get_str(model, "type");
    if (!mtype)
        return kvp_err_set(err, KVP_EFORMAT, "%s: model.type: missing", src);
    if (strcmp(mtype, "BPE"))
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: model.type: \"%s\" is not supported (BPE)", src, mtype);
    int byte_level = tj_find_type(kvp_json_get(root, "pre_tokenizer"), "ByteLevel") ||
                     tj_find_type(kvp_json_get(root, "decoder"), "ByteLevel");
    int byte_fallback = 0;
    kvp_json_get_bool(model, "byte_fallback", &byte_fallback);
    int metaspace = tj_find_type(kvp_json_get(root, "pre_tokenizer"), "Metaspace") != NULL;
    tj_norm norm = {0, 0};
    int rc = tj_normalizer(kvp_json_get(root, "normalizer"), byte_level, &norm, src, err);
    if (rc < 0)
        return rc;
    if (!byte_level && !byte_fallback && !metaspace && !norm.prepend)
        return kvp_err_set(err, KVP_EUNSUPPORTED,
                           "%s: a BPE that is neither byte-level nor SentencePiece-style (no ByteLevel, "
                           "byte_fallback, Metaspace or Prepend)", src);
    rc = tj_read_vocab(v, root, model, src, err);
    if (rc < 0)
        return rc;
    if ((rc = tj_merges(m, model, src, err)) < 0)
        return rc;
    /* Ids no entry names (gaps) become unused placeholders. */
    char **pad = calloc(v->n, sizeof *pad);
    if (!pad)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", src);
    for (uint64_t i = 0; i < v->n; i++) {
        if (v->text[i])
            continue;
        pad[i] = malloc(32);
        if (!pad[i]) {
            rc = kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", src);
            break;
        }
        v->len[i] = (size_t)snprintf(pad[i], 32, "[PAD%llu]", (unsigned long long)i);
        v->text[i] = pad[i];
        v->type[i] = KVP_TOKEN_UNUSED;
    }
    if (!byte_level) {
        for (uint64_t i = 0; i < v->n; i++)
            if (v->type[i] == KVP_TOKEN_NORMAL && v->len[i] == 6 && !memcmp(v->text[i], "<0x", 3) &&
                v->text[i][5] == '>')
                v->type[i] = KVP_TOKEN_BYTE;
    }
    if (rc == 0 && (kvp_meta_set_str(m, "tokenizer.ggml.model", byte_level ? "gpt2" : "llama",
                                     byte_level ? 4 : 5) < 0 ||
                    kvp_meta_set_strarr(m, "tokenizer.ggml.tokens", v->text, v->len, v->n) < 0 ||
                    kvp_meta_set_arr(m, "tokenizer.ggml.token_type", KVP_META_ARR_I32, v->type, v->n) < 0))
        rc = kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", src);
    for (uint64_t i = 0; i < v->n; i++)
        if (pad[i]) { /* the copy in m is kept; v must not point at freed text */
            free(pad[i]);
            v->text[i] = NULL;
        }
    free(pad);
    if (rc < 0)
        return rc;
    if (byte_level) {
        const char *pre;
        if ((rc = tj_pre(root, &pre, src, err)) < 0)
            return rc;
        if (kvp_meta_set_str(m, "tokenizer.ggml.pre", pre, strlen(pre)) < 0)
            return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", src);
    } else if ((rc = tj_spm_rules(m, root, norm.prepend, src, err)) < 0) {
        return rc;
    }
    /* HF normalizes the text between the added tokens it matches first */
    if (norm.nfc) {
        if (kvp_meta_set_str(m, "tokenizer.kvpipe.normalizer", "nfc", 3) < 0)
            return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", src);
        if ((rc = tj_normalized_tokens(m, v, byte_level, src, err)) < 0)
            return rc;
    }
    static const char *const bos_names[] = {"<s>", "<|begin_of_text|>", NULL};
    static const char *const eos_names[] = {"</s>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>", NULL};
    int32_t bos = tj_template_bos(root, v);
    int add_bos = bos >= 0;
    if (bos < 0)
        bos = tj_first_of(v, bos_names);
    const char *unk = kvp_json_get_str(model, "unk_token");
    if (tj_set_id(m, "tokenizer.ggml.bos_token_id", bos) < 0 ||
        tj_set_id(m, "tokenizer.ggml.eos_token_id", tj_first_of(v, eos_names)) < 0 ||
        tj_set_id(m, "tokenizer.ggml.unknown_token_id", unk ? tj_lookup(v, unk) : -1) < 0 ||
        kvp_meta_set_bool(m, "tokenizer.ggml.add_bos_token", add_bos) < 0)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", src);
    if (!byte_level)
        return tj_spm_scores(v, m, src, err);
    return 0;
}

int kvp_tokenizer_meta_from_json(kvp_meta *m, const kvp_json *root, const char *source, kvp_err *err)
{
    tj_vocab v = {0};
    if (!source)
        source = "tokenizer.json";
    int rc = tj_fill(m, root, source, &v, err);
    tj_vocab_free(&v);
    return rc;
}

int kvp_tokenizer_load_json(kvp_tokenizer **t, const char *path, kvp_err *err)
{
    kvp_json *root;
    kvp_meta m;
    *t = NULL;
    int rc = kvp_json_parse_file(&root, path, KVP_JSON_MAX_SIZE, err);
    if (rc < 0)
        return rc;
    kvp_meta_init(&m);
    rc = kvp_tokenizer_meta_from_json(&m, root, path, err);
    if (rc == 0)
        rc = kvp_tokenizer_load_meta(t, &m, path, err);
    kvp_meta_free(&m);
    kvp_json_free(root);
    return rc;
}

static int tj_copy_entry(kvp_meta *dst, const kvp_meta_entry *e)
{
    switch (e->type) {
    case KVP_META_U64: return kvp_meta_set_u64(dst, e->key, e->v.u);
    case KVP_META_I64: return kvp_meta_set_i64(dst, e->key, e->v.i);
    case KVP_META_F64: return kvp_meta_set_f64(dst, e->key, e->v.f);
    case KVP_META_BOOL: return kvp_meta_set_bool(dst, e->key, e->v.u != 0);
    case KVP_META_STR: return kvp_meta_set_str(dst, e->key, e->str, (size_t)e->n);
    case KVP_META_ARR_STR: {
        const char **s = malloc((e->n ? e->n : 1) * sizeof *s);
        size_t *lens = malloc((e->n ? e->n : 1) * sizeof *lens);
        int rc = KVP_ENOMEM;
        if (s && lens) {
            for (uint64_t i = 0; i < e->n; i++)
                s[i] = kvp_meta_str_at(e, i, &lens[i]);
            rc = kvp_meta_set_strarr(dst, e->key, s, lens, e->n);
        }
        free(s);
        free(lens);
        return rc;
    }
    default: return kvp_meta_set_arr(dst, e->key, e->type, e->arr, e->n);
    }
}

int kvp_tokenizer_copy_meta(kvp_meta *dst, const kvp_meta *src, kvp_err *err)
{
    int n = 0;
    for (size_t i = 0; i < src->n; i++) {
        const kvp_meta_entry *e = &src->e[i];
        if (strncmp(e->key, "tokenizer.", 10) != 0)
            continue;
        if (tj_copy_entry(dst, e) < 0)
            return kvp_err_set(err, KVP_ENOMEM, "tokenizer: out of memory copying %s", e->key);
        n++;
    }
    return n;
}
