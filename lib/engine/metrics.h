/* metrics.h - serving metrics of a batch run, as vLLM defines them.
 *
 * Per request (seconds on the monotonic clock):
 *   TTFT  first token - arrival (queueing and prompt processing included),
 *   E2E   last token - arrival,
 *   TPOT  (E2E - TTFT) / (output tokens - 1), for requests of 2 or more,
 *   ITL   every gap between two consecutive tokens of one request.
 * The summary gives mean and p50/p90/p99 of each (interpolated between
 * the nearest ranks, as numpy's percentile does), request and token
 * throughput, and goodput: the requests that completed and met both SLOs
 * (TTFT and TPOT bounds; a bound of 0 is no bound).  A request that failed
 * (the KV cache could not hold it) is never good.  A value a request does
 * not have meets its bound, as vLLM counts TPOT as 0 for a 1-token output:
 * TPOT with under 2 output tokens, TTFT with none (max_tokens 0).
 *
 * Per-request values are kept exactly (3 doubles a request); ITLs, one per
 * token, go into a histogram of 1%-wide logarithmic buckets from 1 us to
 * 1000 s, so a job of any length takes bounded memory and its ITL
 * percentiles are within 1% of the exact ones.
 */
#ifndef KVP_METRICS_H
#define KVP_METRICS_H

#include "error.h"

#include <stdint.h>
#include <stdio.h>

#define KVP_METRICS_ITL_BUCKETS 2084 /* ceil(log(1e9) / log(1.01)) + 1 */

typedef struct kvp_metrics {
    double slo_ttft, slo_tpot;     /* seconds; 0: no bound */
    double *ttft, *tpot, *e2e;     /* [n] per finished request (tpot NaN for 1-token outputs) */
    uint64_t n, cap;
    uint64_t good;                 /* requests completed within both SLOs */
    uint64_t itl_count[KVP_METRICS_ITL_BUCKETS];
    uint64_t n_itl;
    double itl_sum;
} kvp_metrics;

typedef struct kvp_dist {
    uint64_t n;
    double mean, p50, p90, p99, max;   /* seconds */
} kvp_dist;

void kvp_metrics_init(kvp_metrics *m, double slo_ttft, double slo_tpot);
void kvp_metrics_free(kvp_metrics *m);
/* One gap between two tokens of a request. */
void kvp_metrics_add_itl(kvp_metrics *m, double seconds);
/* A finished request: arrival, first and last token times (0: none),
 * tokens out, and whether it failed (ended without completing).  0 or
 * KVP_ENOMEM. */
int kvp_metrics_add_request(kvp_metrics *m, double t_arrival, double t_first, double t_last, uint32_t n_out,
                            int failed, kvp_err *err);
/* Distributions of the requests so far (undefined values left out). */
void kvp_metrics_ttft(kvp_metrics *m, kvp_dist *d);
void kvp_metrics_tpot(kvp_metrics *m, kvp_dist *d);
void kvp_metrics_e2e(kvp_metrics *m, kvp_dist *d);
void kvp_metrics_itl(const kvp_metrics *m, kvp_dist *d);
/* Share of requests completed within both SLOs into *out: 1, or 0 with
 * *out left alone when there were none (a share of nothing is undefined:
 * reported as null or "-", never as a perfect 1). */
int kvp_metrics_goodput(const kvp_metrics *m, double *out);
/* Percentile q (0..100) of sorted v[n], between the two nearest ranks by
 * linear interpolation, as numpy's percentile (and so vLLM's benchmark)
 * computes it; NaN when n is 0. */
double kvp_percentile(const double *v, uint64_t n, double q);
/* `"name":{"n":..,"mean":..,"p50":..,"p90":..,"p99":..,"max":..}` in ms;
 * a value the requests did not give (no request, no output of 2 tokens)
 * is null. */
void kvp_dist_json(FILE *f, const char *name, const kvp_dist *d);
/* The text summary's row for d: name in 4 columns, then mean (9), p50,
 * p90 and p99 (8 each) in ms with 2 decimals, and a newline; a value the
 * requests did not give is "-", as the JSON's null. */
void kvp_dist_text(FILE *f, const char *name, const kvp_dist *d);

#endif
