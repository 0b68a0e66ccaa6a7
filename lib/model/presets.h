/* presets.h - built-in model and GPU tables for capacity planning (kvcalc).
 *
 * Read-only tables; the numbers come from the models' published configs and
 * the GPUs' datasheets (../shared/FACTS.md).  Names are matched loosely:
 * case, '-', '_', '.' and spaces are ignored, so "Llama-3-70B", "llama3_70b"
 * and "llama-3-70b" are one preset.
 */
#ifndef KVP_PRESETS_H
#define KVP_PRESETS_H

#include "config.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kvp_model_preset {
    const char *name;       /* canonical, e.g. "llama-3-70b" */
    const char *desc;       /* one line for --list-models */
    kvp_config cfg;
    uint32_t q_lora_rank;   /* MLA query low-rank size (DeepSeek: 1536); kvp_config lacks it */
} kvp_model_preset;

typedef struct kvp_gpu_preset {
    const char *name;       /* canonical, e.g. "h200" */
    const char *aliases;    /* space-separated other names ("h200-sxm") */
    const char *desc;
    uint64_t mem_bytes;     /* total device memory as the driver reports it */
    double bw_bytes_per_s;  /* HBM/GDDR bandwidth, datasheet */
    double tflops_bf16;     /* dense */
    double tflops_fp8;      /* dense, 0 when unsupported */
    double link_bytes_per_s; /* GPU-GPU link per GPU (NVLink, else PCIe) */
} kvp_gpu_preset;

size_t kvp_preset_model_count(void);
/* The i-th model preset, NULL when i is out of range. */
const kvp_model_preset *kvp_preset_model_at(size_t i);
/* Look a model up by (loose) name; NULL when there is none. */
const kvp_model_preset *kvp_preset_model_find(const char *name);

size_t kvp_preset_gpu_count(void);
const kvp_gpu_preset *kvp_preset_gpu_at(size_t i);
/* Look a GPU up by (loose) name or alias; NULL when there is none. */
const kvp_gpu_preset *kvp_preset_gpu_find(const char *name);

/* 1 when a and b are the same name ignoring case and the characters "-_. ". */
int kvp_preset_name_eq(const char *a, const char *b);

#endif
