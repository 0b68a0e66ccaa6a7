/* fuzz_tpmsg.c - libFuzzer harness: a tensor-parallel worker's reader of
 * rank 0's messages (kvp_tpmsg_decode, lib/engine/tpmsg.h).  The bytes are
 * the message's little-endian words against a pool of 64 blocks of 16
 * tokens and a vocabulary of 100 (a step, a block read or write) or no pool (a
 * setup, stop or end).  A refusal must carry a message; an accepted step must hold every
 * promise the worker relies on (each index in range, each slot its
 * position's) and encode back to the very words. */
#include "tpmsg.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_step(const kvp_tpmsg_step *s, const kvp_tpmsg_setup *lim)
{
    for (uint32_t t = 0; t < s->n_tok; t++) {
        uint32_t q = s->tok_seq[t];
        if (q >= s->n_seqs || s->tok[t] < 0 || (uint32_t)s->tok[t] >= lim->n_vocab || s->pos[t] < 0)
            abort();
        uint32_t b = (uint32_t)s->pos[t] / lim->block_size;
        if (b >= s->n_table[q] || s->tables[q][b] >= lim->n_blocks ||
            s->slot[t] != s->tables[q][b] * lim->block_size + (uint32_t)s->pos[t] % lim->block_size)
            abort();
    }
    for (uint32_t i = 0; i < s->n_rows; i++)
        if (s->rows[i] >= s->n_tok || (i && s->rows[i] <= s->rows[i - 1]))
            abort();
    for (uint32_t i = 0; i < 2 * s->n_copies; i++)
        if (s->copies[i] >= lim->n_blocks)
            abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t n = size / 4;
    uint32_t *w = malloc((n ? n : 1) * sizeof *w);
    if (!w)
        return 0;
    memcpy(w, data, n * 4);
    const kvp_tpmsg_setup lim = {.n_blocks = 64, .block_size = 16, .dtype = 1, .n_layer = 2, .n_vocab = 100};
    for (int with_pool = 0; with_pool < 2; with_pool++) {
        kvp_tpmsg m;
        kvp_err err = {0};
        int rc = kvp_tpmsg_decode(&m, w, n, with_pool ? &lim : NULL, &err);
        if (rc) {
            if (rc > 0 || !err.msg[0])
                abort();
            continue;
        }
        kvp_tpmsg_buf b = {0};
        int re = 0;
        if (m.kind == KVP_TPMSG_STEP) {
            if (!with_pool)
                abort(); /* a step needs a pool to be checked against */
            check_step(&m.step, &lim);
            re = kvp_tpmsg_put_step(&b, &m.step, &err);
        } else if (m.kind == KVP_TPMSG_SETUP) {
            if (!m.setup.n_blocks || !m.setup.block_size)
                abort();
            re = kvp_tpmsg_put_setup(&b, &m.setup, &err);
        } else if (m.kind == KVP_TPMSG_KV_READ || m.kind == KVP_TPMSG_KV_WRITE) {
            if (!with_pool || m.block >= lim.n_blocks)
                abort();
            re = kvp_tpmsg_put_kv(&b, m.kind, m.block, &err);
        } else if (m.kind == KVP_TPMSG_STOP || m.kind == KVP_TPMSG_END) {
            re = kvp_tpmsg_put_bare(&b, m.kind, &err);
        } else {
            abort();
        }
        if (re == 0 && (b.n != n || memcmp(b.w, w, n * 4) != 0))
            abort(); /* what was accepted is what the driver would write */
        kvp_tpmsg_buf_free(&b);
        kvp_tpmsg_free(&m);
    }
    free(w);
    return 0;
}
