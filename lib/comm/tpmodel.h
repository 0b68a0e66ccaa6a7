/* tpmodel.h - an analytic alpha-beta model of the link between GPUs, and
 * the collectives one tensor-parallel decode step issues.
 *
 * A ring collective over n ranks takes steps of one message each; a step
 * costs alpha (latency: launch, synchronization, the wire's first byte)
 * plus its bytes over the link's one-way bandwidth beta:
 *
 *     all_reduce of S bytes:  2(n-1) alpha + 2(n-1)/n S / beta
 *     all_gather to S bytes:   (n-1) alpha +  (n-1)/n S / beta
 *
 * (the bandwidth terms are nccl-tests' busbw factors: collbench.h).  The
 * bandwidths are datasheet figures, the latencies assumptions (tpbench(1)
 * says which); both are overridable, and tpbench prints them beside every
 * modeled figure.
 */
#ifndef KVP_TPMODEL_H
#define KVP_TPMODEL_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvp_link {
    const char *name;   /* "nvlink4" */
    const char *desc;
    double bw;          /* bytes/s one way, per GPU */
    double alpha;       /* seconds per ring step */
} kvp_link;

size_t kvp_link_count(void);
const kvp_link *kvp_link_at(size_t i);        /* NULL past the end */
const kvp_link *kvp_link_find(const char *name);

/* Seconds for one ring collective over n ranks (0 for n <= 1). */
double kvp_link_allreduce_s(const kvp_link *l, int n, double bytes);
double kvp_link_allgather_s(const kvp_link *l, int n, double out_bytes);

/* The collectives of one decode step under TP: every layer's attention
 * output (row-parallel wo) and FFN output (row-parallel w_down) are
 * all-reduced, batch x hidden elements each; the vocabulary-parallel
 * logits are all-gathered, batch x vocab elements in all. */
typedef struct kvp_tp_traffic {
    uint32_t n_allreduce;
    uint64_t allreduce_elems;  /* each */
    uint32_t n_allgather;
    uint64_t allgather_elems;  /* the gathered output */
} kvp_tp_traffic;

void kvp_tp_step_traffic(uint32_t n_layer, uint64_t hidden, uint64_t vocab, uint64_t batch, kvp_tp_traffic *t);

/* Modeled seconds of a step's traffic on link l over tp ranks. */
double kvp_tp_comm_s(const kvp_link *l, int tp, const kvp_tp_traffic *t, size_t elem_bytes);

#endif
