/* generate.c - batched prefill and generation loop (see generate.h). */
#include "generate.h"
#include "argmax.h"
#include "sample.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


double kvp_gen_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

uint64_t kvp_gen_wall_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

double kvp_gen_mono_of_wall(uint64_t ns)
{
    double ago = ((double)kvp_gen_wall_ns() - (double)ns) * 1e-9;
    return kvp_gen_now() - ago;
}

const char *kvp_gen_finish_name(uint32_t r)
{
    switch (r) {
    case KVP_FINISH_LENGTH: return "length";
    case KVP_FINISH_STOP: return "stop";
    case KVP_FINISH_STOP_STRING: return "stop_string";
    case KVP_FINISH_KV_MEMORY: return "kv_memory";
    default: return "none";
    }
}

void kvp_gen_seq_init(kvp_gen_seq *s, const kvp_tokenizer *tok)
{
    s->n_gen = 0;
    kvp_buf_init(&s->text);
    s->emitted = 0;
    kvp_detok_init(&s->dt, tok, 0);
    s->t_start = kvp_gen_now();
    s->t_first = s->t_last = 0;
    s->n_prefill = 0;
    s->n_hidden = 0;
}

void kvp_gen_seq_free(kvp_gen_seq *s) { kvp_buf_free(&s->text); }

static int sample(kvp_kvcache *kc, kvp_gen_seq *s, float *logits, uint32_t n_vocab, kvp_err *err)
{
    uint32_t len = kvp_kvcache_seq_len(kc, s->handle);
    const uint32_t *toks = kvp_kvcache_seq_tokens(kc, s->handle);
    uint32_t w = len < KVP_SAMPLE_WINDOW ? len : KVP_SAMPLE_WINDOW;
    if (kvp_first_nonfinite_f32(logits, n_vocab) < n_vocab) /* a NaN in the weights reaches every logit */
        return kvp_err_set(err, KVP_EFORMAT, "the logits after %u tokens hold NaN or infinity: the model's weights "
                           "or the KV blocks it read hold non-finite values", len);
    int t = kvp_sample_next(&s->rec.sampling, logits, n_vocab, toks + (len - w), w, err);
    if (t < 0)
        return t;
    s->rec.next_token = t;
    return 0;
}

int kvp_gen_prefill(kvp_engine *e, kvp_kvcache *kc, kvp_gen_seq *s, const uint32_t *prompt, uint32_t n,
                    const kvp_gen_opts *o, float *logits, kvp_err *err)
{
    uint32_t before = kvp_kvcache_seq_len(kc, s->handle);
    kvp_kvcache_stats st0, st1;
    kvp_kvcache_get_stats(kc, &st0);
    int rc = kvp_engine_prefill(e, s->handle, prompt, n, o ? o->chunk : 0, logits, err);
    if (rc < 0)
        return rc;
    kvp_kvcache_get_stats(kc, &st1);
    s->n_prefill = n - (uint32_t)(st1.prefix_tokens - st0.prefix_tokens);
    s->rec.n_prompt = before + n;
    s->rec.state = KVP_SEQ_PREFILLED;
    s->rec.finish_reason = KVP_FINISH_NONE;
    return sample(kc, s, logits, kvp_engine_n_vocab(e), err);
}

/* Longest stop string, for holding back text that may begin one. */
static size_t max_stop_len(const kvp_gen_opts *o)
{
    size_t m = 0;
    for (size_t i = 0; o && i < o->n_stop; i++)
        m = strlen(o->stop[i]) > m ? strlen(o->stop[i]) : m;
    return m;
}

uint32_t kvp_gen_budget(const kvp_gen_seq *s, const kvp_gen_opts *o)
{
    return o && o->max_tokens ? o->max_tokens : s->rec.sampling.max_tokens;
}

/* Cut s's text at the earliest stop string that ends inside what the last
 * token added (from old on); 1 when one did.  The earliest of them all,
 * not the first in the list that matches: with stops "ris" and "Pa",
 * " Paris" ends at " " either way (the text must hold none of them). */
static int cut_stop(kvp_gen_seq *s, const kvp_gen_opts *o, size_t old)
{
    size_t cut = SIZE_MAX;
    for (size_t i = 0; o && i < o->n_stop; i++) {
        size_t sl = strlen(o->stop[i]);
        if (!sl)
            continue;
        size_t from = old >= sl ? old - sl + 1 : 0;
        for (size_t p = from; p + sl <= s->text.len && p < cut; p++)
            if (memcmp(s->text.data + p, o->stop[i], sl) == 0) {
                cut = p;
                break;
            }
    }
    if (cut == SIZE_MAX)
        return 0;
    s->text.len = cut;
    return 1;
}

/* After a cut at text.len: the cached tokens (generated before the
 * pending one) whose text ends past it, counted back from the newest as far
 * as text_end reaches (a stop string spans a few tokens). */
static void hide_stop(kvp_gen_seq *s)
{
    size_t cut = s->text.len;
    uint32_t n = 0;
    for (uint32_t j = s->n_gen - 1; j >= 1 && s->n_gen - j < KVP_GEN_TRACK && s->text_end[j % KVP_GEN_TRACK] > cut;
         j--)
        n++;
    s->n_hidden = n;
}

int kvp_gen_accept(kvp_gen_seq *s, const kvp_tokenizer *tok, const kvp_gen_opts *o, kvp_gen_emit_fn emit, void *ctx,
                   kvp_err *err)
{
    int32_t t = s->rec.next_token;
    if (!(o && o->ignore_eos) && kvp_tokenizer_is_eog(tok, t)) {
        s->rec.finish_reason = KVP_FINISH_STOP;
        s->rec.next_token = -1; /* nothing left to feed */
        return 1;
    }
    /* An end token is not shown and sets no time: TTFT, TPOT and the
     * gaps between tokens count the tokens a reader sees (n_gen). */
    double now = kvp_gen_now();
    if (!s->t_first)
        s->t_first = now;
    s->t_last = now;
    s->n_gen++;
    size_t old = s->text.len;
    int rc = kvp_detok_push(&s->dt, t, &s->text, err);
    if (rc < 0)
        return rc;
    s->text_end[s->n_gen % KVP_GEN_TRACK] = (uint32_t)s->text.len;
    if (cut_stop(s, o, old)) {
        s->rec.finish_reason = KVP_FINISH_STOP_STRING;
        hide_stop(s);
    }
    else if (s->n_gen >= kvp_gen_budget(s, o))
        s->rec.finish_reason = KVP_FINISH_LENGTH;
    size_t hold = max_stop_len(o);
    hold = hold ? hold - 1 : 0;
    size_t ready = s->rec.finish_reason ? s->text.len : (s->text.len > hold ? s->text.len - hold : 0);
    /* the text holds whole characters (the detokenizer keeps a partial one
     * back), but the held-back bytes need not: a character is not split
     * between two writes (a reader decoding each chunk, the emit contract) */
    for (int k = 0; k < 3 && ready > s->emitted && ready < s->text.len && (s->text.data[ready] & 0xC0) == 0x80; k++)
        ready--;
    if (ready > s->emitted && emit) {
        emit(ctx, s, (const char *)s->text.data + s->emitted, ready - s->emitted);
        s->emitted = ready;
    }
    return s->rec.finish_reason != KVP_FINISH_NONE;
}
