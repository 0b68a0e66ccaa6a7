/* perplexity.c - read, tokenize, score and report a text. */
#include "perplexity.h"

#include "cli.h"
#include "io.h"
#include "unicode.h"

#include <stdlib.h>
#include <string.h>

#define TEXT_MAX (1ull << 30) /* a text of more than 1 GiB is surely a mistake */
#define PPL_CTX_DEFAULT 512   /* tokens a window, as llama.cpp's perplexity */

/* A binary file (a model, a saved base: arguments swapped) would be
 * scored as bytes and give a perplexity that means nothing: refused at
 * byte at, its first NUL. */
static int binary_text(const char *path, size_t at, kvp_err *err)
{
    return kvp_err_set(err, KVP_EFORMAT, "%s: byte %zu is NUL: a binary file, not a text to score", path, at);
}

/* Read what is left of a stream (a pipe, /dev/zero) a piece at a time into
 * *text, refusing its first NUL as soon as it comes, not after up to
 * TEXT_MAX bytes of it. */
static int read_stream_text(kvp_in *in, const char *path, uint8_t **text, size_t *len, kvp_err *err)
{
    size_t cap = 65536, n = 0;
    uint8_t *buf = malloc(cap + 1);
    int64_t got = 1;
    while (buf && got > 0) {
        if (n == cap) {
            uint8_t *nb = cap < TEXT_MAX ? realloc(buf, cap * 2 + 1) : NULL;
            if (!nb) {
                free(buf);
                return cap < TEXT_MAX ? kvp_err_set(err, KVP_ENOMEM, "%s: out of memory reading the text", path)
                                      : kvp_err_set(err, KVP_ELIMIT, "%s: input exceeds %llu bytes", path,
                                                    (unsigned long long)TEXT_MAX);
            }
            buf = nb, cap *= 2;
        }
        if ((got = kvp_in_read_some(in, buf + n, cap - n, err)) < 0) {
            free(buf);
            return (int)got;
        }
        const uint8_t *nul = memchr(buf + n, 0, (size_t)got);
        if (nul) {
            size_t at = (size_t)(nul - buf);
            free(buf);
            return binary_text(path, at, err);
        }
        n += (size_t)got;
    }
    if (!buf)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory reading the text", path);
    buf[n] = 0;
    *text = buf, *len = n;
    return 0;
}

/* The whole text at path, NUL-free: a file is looked at in place (a
 * gigabyte model given as the text is refused at its first NUL, without a
 * copy), a stream as it comes. */
static int read_text(const char *path, uint8_t **text, size_t *len, kvp_err *err)
{
    kvp_in in;
    int rc = kvp_in_open(&in, path, err);
    if (rc < 0)
        return rc;
    const uint8_t *nul = in.map ? memchr(in.map, 0, (size_t)in.size) : NULL;
    if (nul)
        rc = binary_text(path, (size_t)(nul - in.map), err);
    else if (in.map || in.size_known)
        rc = kvp_in_read_all(&in, TEXT_MAX, text, len, err);
    else
        rc = read_stream_text(&in, path, text, len, err);
    kvp_in_close(&in);
    return rc;
}

int kvp_perplexity_tokens(const kvp_run *r, const char *path, uint32_t **ids, uint64_t *n, kvp_err *err)
{
    uint8_t *text = NULL;
    size_t len = 0;
    int rc = read_text(path, &text, &len, err);
    if (rc < 0)
        return rc;
    if (len == 0) {
        free(text);
        return kvp_err_set(err, KVP_EINVAL, "%s: empty text", path);
    }
    /* a regular file that is not mapped (kvp_in_read_all) was not looked at yet */
    const uint8_t *nul = memchr(text, 0, len);
    if (nul) {
        size_t at = (size_t)(nul - text);
        free(text);
        return binary_text(path, at, err);
    }
    /* the tokenizer drops bytes that are not UTF-8: a Latin-1 text would be
     * scored with them missing (and a --kld base of it taken for another
     * text of the same hash), so it is refused as the prompt readers do */
    size_t ok = kvp_unicode_valid_prefix((const char *)text, len);
    if (ok < len) {
        unsigned b = text[ok];
        free(text);
        return kvp_err_set(err, KVP_EFORMAT, "%s: invalid UTF-8 at byte offset %zu (0x%02x): a text to score is UTF-8",
                           path, ok, b);
    }
    int32_t *t;
    size_t nt;
    rc = kvp_tokenizer_encode(r->tok, (const char *)text, len, 0, -1, &t, &nt, err);
    free(text);
    if (rc < 0)
        return kvp_err_prefix(err, "%s", path), rc;
    *ids = (uint32_t *)t; /* ids are < n_vocab, so the same bits */
    *n = nt;
    return 0;
}

int kvp_perplexity_run(const kvp_runopts *o, const char *text_path, kvp_ppl_opts *po, kvp_ppl_result *res,
                       kvp_err *err)
{
    kvp_run r;
    uint32_t *ids = NULL;
    uint64_t n = 0;
    int rc = kvp_run_open(&r, o, err);
    if (rc < 0)
        return rc;
    /* The window is decided here alone, for the KV pool and the run both
     * (a pool sized for the model's short context ran windows of 512 out
     * of blocks): po->ctx, else 512, or the model's context where it is
     * shorter; a model that states no context (0: decode's 4096 by
     * default) takes any. */
    uint32_t n_ctx = kvp_config_ctx_limit(&r.model->cfg); /* a sliding window the engine does not apply holds it */
    uint32_t ctx = po->ctx ? po->ctx : n_ctx && n_ctx < PPL_CTX_DEFAULT ? n_ctx : PPL_CTX_DEFAULT;
    if (n_ctx && ctx > n_ctx) {
        rc = kvp_err_set(err, KVP_EINVAL, "--ctx %u is beyond %s's %s of %u tokens", ctx, o->model,
                         n_ctx < r.model->cfg.n_ctx ? "sliding window (not applied here)" : "context length", n_ctx);
        goto out;
    }
    kvp_runopts ro = *o;
    if (!ro.kv.n_blocks && !ro.kv.mem_bytes) { /* one window, not the model's whole context */
        uint32_t bs = ro.kv.block_size ? ro.kv.block_size : 16; /* the cache's default */
        ro.kv.n_blocks = (ctx + bs - 1) / bs;
    }
    if ((rc = kvp_perplexity_tokens(&r, text_path, &ids, &n, err)) < 0 || (rc = kvp_run_start(&r, &ro, NULL, err)) < 0)
        goto out;
    po->bos = kvp_tokenizer_add_bos(r.tok) == 1 ? kvp_tokenizer_bos(r.tok) : -1;
    po->fingerprint = r.model->fingerprint;
    if (!po->text_name)
        po->text_name = text_path;
    kvp_ppl_opts wo = *po; /* the caller's ctx left as given: 0 is decided again for the next model */
    wo.ctx = ctx;
    rc = kvp_ppl_run(r.engine, r.kc, ids, n, &wo, res, err);
out:
    free(ids);
    kvp_run_close(&r);
    return rc;
}

static void print_json(FILE *f, const kvp_ppl_result *r, const char *text_name)
{
    fputs("{\"text\":", f);
    kvp_cli_json_str(f, text_name, strlen(text_name));
    fprintf(f, ",\"tokens\":%llu,\"tokens_hash\":\"%016llx\",\"ctx\":%u,\"windows\":%u,\"scored\":%llu,"
            "\"nll\":%.9f,\"ppl\":%.6f,\"ppl_err\":%.6f,\"seconds\":%.3f,\"tokens_per_s\":%.1f",
            (unsigned long long)r->n_tokens, (unsigned long long)r->tokens_hash, r->ctx, r->n_windows,
            (unsigned long long)r->sum.n, r->sum.nll, r->ppl, r->ppl_err, r->seconds,
            r->seconds > 0 ? (double)r->n_eval / r->seconds : 0);
    if (r->has_kld) {
        const kvp_kld_summary *k = &r->kld;
        fprintf(f, ",\"base_ppl\":%.6f,\"base_ppl_err\":%.6f,\"cor\":%.6f,\"ln_ratio\":%.6f,\"ln_ratio_err\":%.6f,"
                "\"ppl_ratio\":%.6f,\"ppl_ratio_err\":%.6f,\"ppl_diff\":%.6f,\"ppl_diff_err\":%.6f,"
                "\"kld\":%.6g,\"kld_err\":%.6g,\"kld_max\":%.6g,\"kld_min\":%.6g,\"kld_pct\":{",
                k->ppl_b, k->ppl_b_err, k->cor, k->ln_ratio, k->ln_ratio_err, k->ratio, k->ratio_err, k->diff,
                k->diff_err, k->kld_mean, k->kld_err, k->kld_max, k->kld_min);
        for (int i = 0; i < KVP_KLD_NPCT; i++)
            fprintf(f, "%s\"%g\":%.6g", i ? "," : "", kvp_kld_pct[i], k->kld_pct[i]);
        fprintf(f, "},\"dp_mean\":%.6g,\"dp_err\":%.6g,\"dp_rms\":%.6g,\"dp_rms_err\":%.6g,\"dp_max\":%.6g,"
                "\"dp_min\":%.6g,\"dp_pct\":{", k->dp_mean, k->dp_err, k->dp_rms, k->dp_rms_err, k->dp_max,
                k->dp_min);
        for (int i = 0; i < KVP_DP_NPCT; i++)
            fprintf(f, "%s\"%g\":%.6g", i ? "," : "", kvp_dp_pct[i], k->dp_pct[i]);
        fprintf(f, "},\"same_top\":%.6f,\"same_top_err\":%.6f,\"top_dp_rms\":%.6g,\"top_dp_max\":%.6g,\"base\":",
                k->same_top, k->same_top_err, k->top_rms, k->top_max);
        kvp_cli_json_str(f, r->base.text, strlen(r->base.text));
    }
    fputs("}\n", f);
}

/* "99.9%   KLD:" style labels: a percentile, "Median" at 50. */
static void pct_label(char *buf, size_t n, double p)
{
    if (p == 50)
        snprintf(buf, n, "Median ");
    else
        snprintf(buf, n, "%4.1f%%  ", p);
}

static void print_kld(FILE *f, const kvp_kld_summary *k)
{
    char lb[16];
    fprintf(f, "\n====== Perplexity statistics ======\n");
    fprintf(f, "Mean PPL(Q)                   : %10.6f \xc2\xb1 %10.6f\n", k->ppl_q, k->ppl_q_err);
    fprintf(f, "Mean PPL(base)                : %10.6f \xc2\xb1 %10.6f\n", k->ppl_b, k->ppl_b_err);
    fprintf(f, "Cor(ln(PPL(Q)), ln(PPL(base))): %6.2f%%\n", 100 * k->cor);
    fprintf(f, "Mean ln(PPL(Q)/PPL(base))     : %10.6f \xc2\xb1 %10.6f\n", k->ln_ratio, k->ln_ratio_err);
    fprintf(f, "Mean PPL(Q)/PPL(base)         : %10.6f \xc2\xb1 %10.6f\n", k->ratio, k->ratio_err);
    fprintf(f, "Mean PPL(Q)-PPL(base)         : %10.6f \xc2\xb1 %10.6f\n", k->diff, k->diff_err);
    fprintf(f, "\n====== KL divergence statistics ======\n");
    fprintf(f, "Mean    KLD: %10.6f \xc2\xb1 %10.6f\n", k->kld_mean, k->kld_err);
    fprintf(f, "Maximum KLD: %10.6f\n", k->kld_max);
    for (int i = 0; i < KVP_KLD_NPCT; i++) {
        pct_label(lb, sizeof lb, kvp_kld_pct[i]);
        fprintf(f, "%s KLD: %10.6f\n", lb, k->kld_pct[i]);
    }
    fprintf(f, "Minimum KLD: %10.6f\n", k->kld_min);
    fprintf(f, "\n====== Token probability statistics ======\n");
    fprintf(f, "Mean    \xce\x94p: %6.3f \xc2\xb1 %5.3f %%\n", 100 * k->dp_mean, 100 * k->dp_err);
    fprintf(f, "Maximum \xce\x94p: %6.3f%%\n", 100 * k->dp_max);
    for (int i = 0; i < KVP_DP_NPCT; i++) {
        pct_label(lb, sizeof lb, kvp_dp_pct[i]);
        fprintf(f, "%s \xce\x94p: %6.3f%%\n", lb, 100 * k->dp_pct[i]);
    }
    fprintf(f, "Minimum \xce\x94p: %6.3f%%\n", 100 * k->dp_min);
    fprintf(f, "RMS \xce\x94p    : %6.3f \xc2\xb1 %5.3f %%\n", 100 * k->dp_rms, 100 * k->dp_rms_err);
    fprintf(f, "Same top p: %6.3f \xc2\xb1 %5.3f %%\n", 100 * k->same_top, 100 * k->same_top_err);
    fprintf(f, "Top-token \xce\x94p: RMS %6.3f %%, max |\xce\x94p| %6.3f %%\n", 100 * k->top_rms, 100 * k->top_max);
}

void kvp_perplexity_print(FILE *f, const kvp_ppl_result *r, const char *text_name, int json)
{
    if (json) {
        print_json(f, r, text_name);
        return;
    }
    fprintf(f, "text     %s: %llu tokens, hash %016llx\n", text_name, (unsigned long long)r->n_tokens,
            (unsigned long long)r->tokens_hash);
    fprintf(f, "windows  %u of %u tokens, predictions from position %u scored (%llu in all)\n", r->n_windows,
            r->ctx, r->first, (unsigned long long)r->sum.n);
    fprintf(f, "PPL      %.4f +/- %.5f\n", r->ppl, r->ppl_err);
    fprintf(f, "speed    %llu tokens in %.2f s: %.1f tokens/s\n", (unsigned long long)r->n_eval, r->seconds,
            r->seconds > 0 ? (double)r->n_eval / r->seconds : 0);
    if (r->has_kld)
        print_kld(f, &r->kld);
}
