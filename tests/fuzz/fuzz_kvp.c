/* fuzz_kvp.c - libFuzzer harness: the KVP stream reader, every typed
 * record decoder and the sequences' check (kvdump --check) on arbitrary bytes.  Any crash, leak, hang or unbounded
 * allocation is a bug; errors are the expected outcome. */
#include "capacity.h"
#include "io.h"
#include "meta.h"
#include "scratch.h"
#include "seqcheck.h"
#include "stream.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* kvcalc's way through a model file: TENSOR payloads skimmed, to the end. */
static void skim(const uint8_t *data, size_t size)
{
    kvp_in in;
    kvp_in_from_memory(&in, data, size, "<fuzz>");
    kvp_err err = {0};
    kvp_reader *r;
    if (kvp_reader_open(&r, &in, &err))
        return;
    kvp_reader_skim(r, 1u << KVP_KIND_TENSOR);
    kvp_record rec;
    while (kvp_reader_next(r, &rec, &err) == 1)
        if (rec.kind == KVP_KIND_TENSOR && (rec.meta || rec.data))
            __builtin_trap(); /* a skimmed record hands out no payload */
    kvp_reader_free(r);
}

/* kvcalc -m FILE: the shape, tying and weight bytes from a model file (its
 * tensor headers read in place from the mapping, payloads skipped; a
 * compressed file read through).  (The bytes may exceed the file's: zstd.) */
static void capacity(const uint8_t *data, size_t size)
{
    kvp_cap_model_file mf;
    kvp_err err = {0};
    (void)kvp_cap_load_model(fuzz_scratch_write(data, size, "kvp"), &mf, &err);
}

/* Whether a label is a JSON integer: '-'? then "0" or a non-zero digit
 * followed by digits (the reader checks more: int64 range). */
static int int_label(const char *l)
{
    if (*l == '-')
        l++;
    if (*l < '0' || *l > '9' || (l[0] == '0' && l[1]))
        return 0;
    while (*l >= '0' && *l <= '9')
        l++;
    return *l == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    skim(data, size);
    capacity(data, size);
    kvp_in in;
    kvp_in_from_memory(&in, data, size, "<fuzz>");
    kvp_err err = {0};
    kvp_reader *r;
    if (kvp_reader_open(&r, &in, &err))
        return 0;
    kvp_reader_set_limit(r, 64u << 20);
    kvp_seqcheck *sc = NULL;
    int checking = kvp_seqcheck_new(&sc, &err) == 0;
    kvp_record rec;
    while (kvp_reader_next(r, &rec, &err) == 1) {
        kvp_err why = {0};
        if (checking && kvp_seqcheck_record(sc, &rec, &why) < 0)
            checking = 0; /* as kvdump stops at its first error */
        kvp_tensor_rec t;
        kvp_seq_rec s;
        kvp_kvblock_rec b;
        kvp_blockref_rec br;
        kvp_stop_rec st;
        kvp_end_rec e;
        kvp_meta m;
        const uint8_t *p1, *p2, *p3;
        const uint32_t *tok;
        char **stop;
        size_t n_stop;
        switch (rec.kind) {
        case KVP_KIND_CONFIG:
        case KVP_KIND_TOKENIZER:
            kvp_meta_init(&m);
            kvp_meta_record_decode(&rec, &m, &err);
            kvp_meta_free(&m);
            break;
        case KVP_KIND_TENSOR:
            if (kvp_tensor_decode(&rec, &t, &p1, &p2, &p3, &err) == 0 && t.data_bytes)
                (void)*(volatile const uint8_t *)(p1 + t.data_bytes - 1); /* in bounds */
            break;
        case KVP_KIND_SEQUENCE:
            if (kvp_seq_decode(&rec, &s, &tok, &err) == 0) {
                if (s.n_tokens)
                    (void)*(volatile const uint32_t *)(tok + s.n_tokens - 1);
                /* decode prints an integer id's label bare: it must be JSON's digits */
                if ((s.flags & KVP_SEQ_LABEL_INT) && !int_label(s.label))
                    __builtin_trap();
            }
            if (kvp_seq_stops(&rec, &stop, &n_stop, &err) == 0) {
                for (size_t k = 0; k < n_stop; k++)
                    (void)*(volatile const char *)(stop[k] + strlen(stop[k])); /* NUL-terminated */
                kvp_seq_stops_free(stop, n_stop);
            }
            break;
        case KVP_KIND_KV_BLOCK:
            if (kvp_kvblock_decode(&rec, &b, &p1, &p2, &p3, &err) == 0) {
                /* kvp(5): fp8_e4m3 and i8 come with their f32 scales, the others with none */
                int scaled = b.dtype == KVP_DTYPE_FP8_E4M3 || b.dtype == KVP_DTYPE_I8;
                if (scaled != (p3 != NULL) || (scaled && (b.scale_dtype != KVP_DTYPE_F32 || b.scales_bytes < 4)))
                    __builtin_trap();
                if (p3)
                    (void)*(volatile const uint8_t *)(p3 + b.scales_bytes - 1); /* in bounds */
            }
            break;
        case KVP_KIND_BLOCK_REF: kvp_blockref_decode(&rec, &br, &err); break;
        case KVP_KIND_STOP: kvp_stop_decode(&rec, &st, &err); break;
        case KVP_KIND_END:
            /* kvp(5): 16 counters at least, all of them in the record */
            if (kvp_end_decode(&rec, &e, &err) == 0) {
                if (e.n_counts < KVP_KIND_COUNT)
                    __builtin_trap();
                (void)*(volatile const uint8_t *)(e.counts_le + 8 * (size_t)e.n_counts - 1);
            }
            break;
        default: break;
        }
    }
    if (checking)
        (void)kvp_seqcheck_end(sc, &err);
    kvp_seqcheck_free(sc);
    kvp_reader_free(r);
    return 0;
}
