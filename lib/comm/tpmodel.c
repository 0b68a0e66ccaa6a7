/* tpmodel.c - the alpha-beta link model and a TP decode step's traffic. */
#include "tpmodel.h"

#include <string.h>

/* One-way bandwidth per GPU from the datasheets; alpha per ring step is an
 * assumption: NCCL's small-message all_reduce over 8 GPUs of an NVLink
 * system is on the order of 10 us (14 ring steps), slower over PCIe and
 * across nodes.  Override with tpbench --bandwidth and --alpha. */
static const kvp_link links[] = {
    {"nvlink4", "NVLink 4 (H100/H200 SXM): 900 GB/s both ways, 450 GB/s each", 450e9, 0.7e-6},
    {"nvlink3", "NVLink 3 (A100 SXM): 600 GB/s both ways, 300 GB/s each", 300e9, 0.8e-6},
    {"pcie5", "PCIe 5 x16: 64 GB/s each way", 64e9, 1.5e-6},
    {"pcie4", "PCIe 4 x16: 32 GB/s each way", 32e9, 1.5e-6},
    {"ib-ndr", "InfiniBand NDR, one 400 Gb/s NIC a GPU: 50 GB/s each way", 50e9, 3e-6},
    {"ib-hdr", "InfiniBand HDR, one 200 Gb/s NIC a GPU: 25 GB/s each way", 25e9, 3e-6},
};

size_t kvp_link_count(void) { return sizeof links / sizeof links[0]; }

const kvp_link *kvp_link_at(size_t i) { return i < kvp_link_count() ? &links[i] : NULL; }

const kvp_link *kvp_link_find(const char *name)
{
    for (size_t i = 0; i < kvp_link_count(); i++)
        if (strcmp(links[i].name, name) == 0)
            return &links[i];
    return NULL;
}

double kvp_link_allreduce_s(const kvp_link *l, int n, double bytes)
{
    if (n <= 1)
        return 0;
    return 2.0 * (n - 1) * l->alpha + 2.0 * (n - 1) / n * bytes / l->bw;
}

double kvp_link_allgather_s(const kvp_link *l, int n, double out_bytes)
{
    if (n <= 1)
        return 0;
    return (double)(n - 1) * l->alpha + (double)(n - 1) / n * out_bytes / l->bw;
}

void kvp_tp_step_traffic(uint32_t n_layer, uint64_t hidden, uint64_t vocab, uint64_t batch, kvp_tp_traffic *t)
{
    t->n_allreduce = 2 * n_layer;
    t->allreduce_elems = batch * hidden;
    t->n_allgather = 1;
    t->allgather_elems = batch * vocab;
}

double kvp_tp_comm_s(const kvp_link *l, int tp, const kvp_tp_traffic *t, size_t elem_bytes)
{
    return t->n_allreduce * kvp_link_allreduce_s(l, tp, (double)(t->allreduce_elems * elem_bytes)) +
           t->n_allgather * kvp_link_allgather_s(l, tp, (double)(t->allgather_elems * elem_bytes));
}
