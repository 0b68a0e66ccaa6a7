/* use_api.c - a program built from an installed kvpipe alone (`make install
 * DESTDIR=...`, then cc with `pkg-config --cflags --libs --static kvpipe`),
 * so the public API is proven complete and kvpipe.pc proven to list every
 * library it needs.  tests/cli/install.sh builds and runs it.
 *
 * Usage: use_api STREAM.kvp [MODEL TEXT]
 *   reads every record of a KVP stream and prints its counts by kind; with a
 *   model, tokenizes TEXT (special tokens parsed), runs it as one prompt step
 *   on the CPU backend and prints the ids and the greedy next token.
 */
#include <kvpipe/kvpipe.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The library's messages already name the file, record or tensor. */
static int fail(const kvp_err *err)
{
    fprintf(stderr, "use_api: %s\n", err->msg[0] ? err->msg : kvp_strerror(err->code));
    return 1;
}

/* Count the records of a KVP stream by kind. */
static int read_stream(const char *path)
{
    kvp_err err = {0};
    kvp_in in;
    kvp_reader *r = NULL;
    uint64_t count[KVP_KIND_COUNT] = {0}, n = 0;
    if (kvp_in_open(&in, path, &err) < 0)
        return fail(&err);
    int rc = kvp_reader_open(&r, &in, &err);
    kvp_record rec;
    while (rc >= 0 && (rc = kvp_reader_next(r, &rec, &err)) > 0) {
        n++;
        if (rec.kind < KVP_KIND_COUNT)
            count[rec.kind]++;
    }
    kvp_reader_free(r);
    kvp_in_close(&in);
    if (rc < 0)
        return fail(&err);
    printf("records %llu", (unsigned long long)n);
    for (uint32_t k = 0; k < KVP_KIND_COUNT; k++)
        if (count[k])
            printf(" %s %llu", kvp_kind_name(k), (unsigned long long)count[k]);
    printf("\n");
    return 0;
}

/* Tokenize text, run it through the model in one step, print the argmax. */
static int one_step(const char *path, const char *text)
{
    kvp_err err = {0};
    kvp_model *m = NULL;
    kvp_tokenizer *tok = NULL;
    kvp_backend *be = NULL;
    kvp_kvcache *kc = NULL;
    kvp_engine *e = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    int status = 1;

    if (kvp_model_load(&m, path, &err) < 0 || kvp_model_load_tokenizer(m, &tok, &err) < 0)
        goto out;
    size_t n = 0;
    if (kvp_tokenizer_encode(tok, text, strlen(text), 1, -1, &ids, &n, &err) < 0)
        goto out;
    printf("ids");
    for (size_t i = 0; i < n; i++)
        printf(" %d", ids[i]);
    printf("\n");

    kvp_kvcache_opts o;
    kvp_kvcache_opts_init(&o);
    o.n_blocks = 8;
    if (kvp_backend_cpu_create(&be, 1, 0, &err) < 0 || kvp_kvcache_create(&kc, &m->cfg, &o, be, &err) < 0 ||
        kvp_engine_create(&e, m, be, kc, &err) < 0)
        goto out;
    int seq = kvp_kvcache_seq_new(kc, &err);
    if (seq < 0)
        goto out;
    uint32_t n_vocab = kvp_engine_n_vocab(e);
    logits = malloc((size_t)n_vocab * sizeof *logits);
    if (!logits)
        goto out;
    kvp_step_seq s = {.seq = seq, .tokens = (const uint32_t *)ids, .n_tokens = (uint32_t)n, .want = KVP_LOGITS_LAST};
    if (kvp_engine_step(e, &s, 1, logits, &err) < 0)
        goto out;
    kvp_sampling greedy;
    kvp_sample_defaults(&greedy);
    int next = kvp_sample_next(&greedy, logits, n_vocab, NULL, 0, &err);
    if (next < 0)
        goto out;
    size_t len = 0;
    const char *piece = kvp_tokenizer_piece(tok, next, &len);
    printf("next %d %.*s\n", next, (int)len, piece ? piece : "");
    status = 0;
out:
    if (status)
        fail(&err);
    free(logits);
    free(ids);
    kvp_engine_free(e);
    kvp_kvcache_free(kc);
    kvp_backend_free(be);
    kvp_tokenizer_free(tok);
    kvp_model_free(m);
    return status;
}

int main(int argc, char **argv)
{
    if (argc != 2 && argc != 4) {
        fprintf(stderr, "usage: use_api STREAM.kvp [MODEL TEXT]\n");
        return 2;
    }
    printf("kvpipe %s\n", KVP_VERSION);
    if (read_stream(argv[1]))
        return 1;
    return argc == 4 ? one_step(argv[2], argv[3]) : 0;
}
