/* tpcost.c - TP's cost in a decode step: roofline compute plus modeled links. */
#include "tpcost.h"
#include "capacity.h"

#include <string.h>

/* Seconds of one decode step of `batch` sequences at tp on the roofline:
 * weights in bf16, KV in f16, read once a step at the GPU's bandwidth. */
static int roofline_step(const kvp_tpcost_in *in, uint32_t tp, double *seconds, kvp_err *err)
{
    kvp_cap_params p;
    kvp_cap_params_init(&p);
    p.cfg = in->model->cfg;
    p.q_lora_rank = in->model->q_lora_rank;
    int rc = kvp_cap_weight_fmt("bf16", &p.weight_fmt, err);
    if (rc < 0)
        return rc;
    p.embed_fmt = p.weight_fmt;
    p.gpu_mem_bytes = in->gpu->mem_bytes;
    p.gpu_bw = in->gpu->bw_bytes_per_s;
    p.gpus = p.tp = tp;
    p.batch = in->batch;
    p.seq_len = in->seq_len;
    kvp_cap_result r;
    if ((rc = kvp_cap_compute(&p, &r, err)) < 0)
        return rc;
    if (!(r.decode_tokens_per_s > 0))
        return kvp_err_set(err, KVP_EINVAL, "%s: no decode roofline (GPU bandwidth unknown)", in->gpu->name);
    *seconds = (double)in->batch / r.decode_tokens_per_s;
    return 0;
}

int kvp_tpcost_compute(const kvp_tpcost_in *in, kvp_tpcost *out, kvp_err *err)
{
    memset(out, 0, sizeof *out);
    const kvp_config *c = &in->model->cfg;
    kvp_tp_step_traffic(c->n_layer, c->n_embd, c->n_vocab, in->batch, &out->traffic);
    int rc;
    if ((rc = roofline_step(in, in->tp, &out->compute_s, err)) < 0 ||
        (rc = roofline_step(in, 1, &out->compute1_s, err)) < 0)
        return rc;
    out->comm_s = kvp_tp_comm_s(&in->link, (int)in->tp, &out->traffic, in->act_bytes);
    out->step_s = out->compute_s + out->comm_s;
    out->overhead = out->step_s > 0 ? out->comm_s / out->step_s : 0;
    out->speedup = out->step_s > 0 ? out->compute1_s / out->step_s : 0;
    return 0;
}
