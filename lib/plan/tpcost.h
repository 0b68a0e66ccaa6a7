/* tpcost.h - what tensor parallelism costs one decode step of a model on a
 * GPU: kvcalc's roofline for the compute (every GPU reads its shard of the
 * weights and its share of the KV cache at the GPU's bandwidth), the
 * alpha-beta link model (tpmodel.h) for the collectives, and the share of
 * the step the collectives take.  Both halves are models; tpbench measures
 * the traffic on a real transport beside them.
 */
#ifndef KVP_TPCOST_H
#define KVP_TPCOST_H

#include "error.h"
#include "presets.h"
#include "tpmodel.h"

#include <stdint.h>

typedef struct kvp_tpcost_in {
    const kvp_model_preset *model;
    const kvp_gpu_preset *gpu;
    kvp_link link;          /* possibly overridden bandwidth or latency */
    uint32_t tp;
    uint64_t batch;         /* sequences decoded together */
    uint64_t seq_len;       /* tokens of context each holds (KV read per step) */
    size_t act_bytes;       /* bytes per element of the activations sent (2: bf16) */
} kvp_tpcost_in;

typedef struct kvp_tpcost {
    kvp_tp_traffic traffic;
    double compute_s;       /* roofline: one step on tp GPUs, no communication */
    double compute1_s;      /* the same on one GPU (whether or not it fits) */
    double comm_s;          /* modeled collectives of one step */
    double step_s;          /* compute + comm: no overlap (decode's all-reduces sit between
                             * dependent matmuls) */
    double overhead;        /* comm / step */
    double speedup;         /* compute1 / step */
} kvp_tpcost;

/* 0 or a code (a model the roofline cannot take). */
int kvp_tpcost_compute(const kvp_tpcost_in *in, kvp_tpcost *out, kvp_err *err);

#endif
