/* hfquant.h - quantized HF safetensors checkpoints as people have them:
 * compressed-tensors (what llm-compressor writes and vLLM loads), GPTQ
 * (AutoGPTQ / GPTQModel layout) and AWQ (GEMM layout), as config.json's
 * "quantization_config" describes them.
 *
 * Two steps.  kvp_hfq_parse reads quantization_config into a kvp_hfq
 * (method, per-group weight schemes, the ignore list, activation settings,
 * which are reported and not used: the engine computes on f32 activations).
 * kvp_hfq_import then turns each quantized linear layer's parts (GPTQ's
 * qweight, qzeros, scales, g_idx; compressed-tensors' weight_packed,
 * weight_scale, weight_zero_point, weight_shape; ...) into one tensor
 * "<module>.weight" described as a KVP tensor record: a kvp dtype (i4, i8,
 * fp8_e4m3) with TENSOR, CHANNEL or GROUP f32 scales and optional f32 zero
 * points, y = (q - z) * s (lib/num/quant.h's layouts), which is exactly what
 * each of these formats computes, so the engine's kernels run them:
 *
 *   compressed-tensors naive-quantized int8, float-quantized fp8: the codes
 *     are used in place; scales (and zero points) widened to f32;
 *   compressed-tensors nvfp4-pack-quantized: the E2M1 codes are kvp's scaled
 *     fp4_e2m1 in place, group 16, each f32 scale e4m3(s) / global as the
 *     package computes it;
 *   compressed-tensors pack-quantized int4/int8: codes stored offset by
 *     2^(bits-1) in int32 words, rewritten as two's complement (exact);
 *     packed zero points unpacked;
 *   GPTQ and AWQ: stored [in, out] (transposed, AWQ's nibbles interleaved
 *     0 2 4 6 1 3 5 7): rewritten as rows of n_in codes (exact);
 *   a g_idx (GPTQ desc_act, compressed-tensors actorder "group") that is not
 *     the plain i / group order cannot be a contiguous group scheme: that
 *     weight is dequantized to f32 (exact: (q - z) * s in f32, as the
 *     reference computes it with f32 scales).
 * What none of these can hold (block strategies, MXFP4, other bit widths, GPTQ/AWQ kernel layouts other than the above) is
 * refused naming the tensor or the config field.
 */
#ifndef KVP_HFQUANT_H
#define KVP_HFQUANT_H

#include "error.h"
#include "owned.h"
#include "json.h"
#include "safetensors.h"
#include "tensor.h"

#include <stddef.h>
#include <stdint.h>

enum kvp_hfq_method {
    KVP_HFQ_NONE = 0,     /* no quantization_config: plain floats */
    KVP_HFQ_CT = 1,       /* compressed-tensors */
    KVP_HFQ_GPTQ = 2,
    KVP_HFQ_AWQ = 3,
};

enum kvp_hfq_format {     /* compressed-tensors' "format" */
    KVP_HFQ_FMT_DENSE = 0,   /* floats as they are (scales unused) */
    KVP_HFQ_FMT_PACK = 1,    /* pack-quantized: int codes in int32 words */
    KVP_HFQ_FMT_NAIVE = 2,   /* naive-quantized / int-quantized: int8 storage */
    KVP_HFQ_FMT_FLOAT = 3,   /* float-quantized: fp8 E4M3 storage */
    KVP_HFQ_FMT_NVFP4 = 4,   /* nvfp4-pack-quantized: E2M1 pairs in bytes, E4M3 scales, f32 global scale */
};

/* One weight scheme: a compressed-tensors config group, or the single
 * scheme of a GPTQ/AWQ config. */
typedef struct kvp_hfq_scheme {
    char name[48];        /* the config group's name ("group_0"), or the method */
    int format;           /* kvp_hfq_format (GPTQ/AWQ: PACK) */
    uint32_t bits;        /* 4 or 8 */
    int is_float;         /* weights "type": "float" (fp8, or fp4 for NVFP4) */
    uint32_t strategy;    /* kvp_scheme: TENSOR, CHANNEL or GROUP */
    uint32_t group;       /* GROUP: elements per scale */
    int symmetric;        /* no zero points */
    int act_order;        /* a g_idx may be present (desc_act, actorder "group") */
    char act[64];         /* input activations as configured ("fp8 dynamic token", "none") */
    const kvp_json *targets; /* compressed-tensors: the group's "targets" array (borrowed) */
} kvp_hfq_scheme;

#define KVP_HFQ_MAX_SCHEMES 16

typedef struct kvp_hfq {
    int method;           /* kvp_hfq_method */
    int gptq_v1;          /* GPTQ checkpoint_format "gptq": zero points stored minus 1 */
    uint32_t n_schemes;
    kvp_hfq_scheme schemes[KVP_HFQ_MAX_SCHEMES];
    const kvp_json *ignore; /* compressed-tensors "ignore" (borrowed), or NULL */
} kvp_hfq;

/* Read root's "quantization_config" (root: config.json's object; the kvp_hfq
 * borrows from it).  Absent or null: method NONE, 0.  Else 0 or KVP_EFORMAT
 * / KVP_EUNSUPPORTED with a message "path: quantization_config.FIELD: ..." */
int kvp_hfq_parse(kvp_hfq *q, const kvp_json *root, const char *path, kvp_err *err);
/* One line about q for notes and kvcalc: "compressed-tensors pack-quantized
 * int4 group 128 asymmetric (activations none)". */
void kvp_hfq_describe(const kvp_hfq *q, char *buf, size_t n);
/* The kvcalc weight format name of q's main scheme ("int4-g128", "int8",
 * "fp8"), or "" when none fits. */
void kvp_hfq_cap_format(const kvp_hfq *q, char *buf, size_t n);

/* One imported weight. */
typedef struct kvp_hfq_tensor {
    kvp_tensor_rec rec;   /* "<module>.weight", [n_out, n_in], dtype, scheme, f32 scales/zeros */
    const void *data, *scales, *zeros; /* in the mapping, or owned by the set */
    int converted;        /* data rewritten (0: codes used in place) */
    int dequantized;      /* data is f32 (a g_idx order no group scheme holds) */
} kvp_hfq_tensor;

/* Roles of the safetensors tensors in an import. */
#define KVP_HFQ_PLAIN (-1) /* not part of a quantized weight: load as it is */
#define KVP_HFQ_PART (-2)  /* a part of one (scales, zeros, g_idx, shape, input scale) */

typedef struct kvp_hfq_set {
    kvp_hfq_tensor *t;    /* [n] */
    size_t n;
    int32_t *role;        /* [st->n_tensors]: PLAIN, PART, or k: t[k] takes this tensor's place */
    kvp_owned owned;      /* converted data, f32 scales and zeros */
    uint64_t n_in_place, n_converted, n_dequantized;
} kvp_hfq_set;

/* Import every quantized weight of st per q (method not NONE).  path names
 * the checkpoint in messages: "path: tensor model.layers.0.mlp.up_proj.qzeros:
 * shape [2, 12], expected [2, 16]".  0 or a negative code; on failure s is
 * freed. */
int kvp_hfq_import(kvp_hfq_set *s, const kvp_hfq *q, const kvp_safetensors *st, const char *path, kvp_err *err);
void kvp_hfq_set_free(kvp_hfq_set *s);
/* What the import did, one line: "12 weights in place, 84 rewritten
 * (exact), 0 dequantized to f32". */
void kvp_hfq_set_describe(const kvp_hfq_set *s, char *buf, size_t n);

/* The whole step for an HF folder: parse config_path's quantization_config
 * and import st.  No quantization_config: s is left empty (n 0, role NULL).
 * note (may be NULL) gets one line saying what was found and done. */
int kvp_hfq_open(kvp_hfq_set *s, const kvp_safetensors *st, const char *config_path, char *note, size_t note_n,
                 kvp_err *err);

#endif
