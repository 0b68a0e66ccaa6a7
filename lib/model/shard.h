/* shard.h - one rank's part of a model for tensor parallelism.
 *
 * Megatron-LM's split of a Llama layer over n ranks; rank r holds
 *   wq (bq)          the rows of its query heads [r*nh/n, (r+1)*nh/n)
 *   wk, wv (bk, bv)  the rows of the KV heads those query heads use: n_head_kv/n
 *                    heads, or, when n is a multiple of n_head_kv, the one KV
 *                    head its query heads share (replicated on n/n_head_kv
 *                    ranks, as vLLM does)
 *   w_gate, w_up     rows [r*n_ff/n, (r+1)*n_ff/n)
 *   wo, w_down       the matching columns (each rank's product is a partial
 *                    sum: the engine all-reduces it before the residual add)
 *   output           vocabulary rows [r*vs, min(n_vocab, (r+1)*vs)),
 *                    vs = kvp_shard_vocab_rows (the engine gathers them)
 *   tok_embd, norms  whole (every rank embeds and normalizes the full hidden state)
 * Row slices are views into the model (no copy; only those pages are read);
 * column slices are copied, one slice of each row, since a row's elements
 * are contiguous.  The shard's config has the rank's n_head, n_head_kv and
 * n_ff, so the engine and the KV cache size themselves for the rank; n_embd
 * and n_vocab stay whole.
 *
 * A split that does not divide evenly (9 query heads over 2 ranks, or a
 * column cut inside a quantization block or scale group) is refused with a
 * message naming the counts: every rank does the same work.
 */
#ifndef KVP_SHARD_H
#define KVP_SHARD_H

#include "error.h"
#include "model.h"

#include <stdint.h>

/* Vocabulary rows a rank projects: ceil(n_vocab / n). */
uint32_t kvp_shard_vocab_rows(uint32_t n_vocab, uint32_t n);

/* Whether c's shape splits over n tensor ranks as above: query heads, the
 * FFN widths (dense and experts') and the vocabulary divide, KV heads
 * divide or replicate evenly (MLA's latent replicates).  A dimension of 0 is
 * one not known (kvcalc's shapes from options) and is not checked.  The rule
 * every planner applies (kvcalc, tpbench --model) so that it plans only
 * splits decode runs: 0, or KVP_EUNSUPPORTED with a message naming the
 * counts and the splits that would work ("tensor parallelism over 2 ranks:
 * 9 query heads do not split evenly (rank counts that split this model: 1, 3)"). */
int kvp_shard_check_split(const kvp_config *c, uint32_t n, kvp_err *err);
/* The same where the column-cut weights' blocks are u (kvcalc of a file:
 * kvp_cap_model_file.col_units): each rank's slice of the attention output
 * and FFN down projections must be whole ones, as kvp_shard_check_model
 * asks.  One rank cuts nothing. */
int kvp_shard_check_split_cols(const kvp_config *c, kvp_col_units u, uint32_t n, kvp_err *err);

/* kvp_shard_check_split, and what the engine does not split: experts and
 * MLA are refused.  0 or KVP_EUNSUPPORTED. */
int kvp_shard_check(const kvp_config *c, uint32_t n, kvp_err *err);

/* kvp_shard_check for m, and its weights: the attention output and FFN
 * down projections are cut by columns, so each rank's slice must be whole
 * quantization blocks (256 columns for the K-quants) and scale groups;
 * the message names the rank counts that pass both ("... tensor
 * blk.0.ffn_down.weight (q6_k) cannot be cut into slices of 1408 of its
 * 5632 columns (whole blocks) (rank counts that split this model: 1, 2)"). */
struct kvp_model;
int kvp_shard_check_model(const struct kvp_model *m, uint32_t n, kvp_err *err);

/* Pipeline parallelism splits the layers first: stage s of pp holds layers
 * [kvp_shard_first_layer(L, s, pp), kvp_shard_first_layer(L, s + 1, pp)),
 * the earlier stages one more when pp does not divide L; the first stage
 * embeds, the last normalizes and projects the vocabulary (each needs its
 * tensors; the others map none of them). */
uint32_t kvp_shard_first_layer(uint32_t n_layer, uint32_t stage, uint32_t pp);

/* Tensor rank r of n's shard of pipeline stage `stage` of pp (n, pp >= 1;
 * 1 and 1 is a view of the whole): its layers, each split as above, its
 * config's n_layer theirs.  m must outlive it.  Free with kvp_model_free.
 * 0 or a code (a stage of no layer is refused). */
int kvp_model_shard(kvp_model **out, const kvp_model *m, uint32_t r, uint32_t n, uint32_t stage, uint32_t pp,
                    kvp_err *err);

/* Self-speculation (specdec --method layerskip): a view of m's first
 * n_layer layers with m's final norm and output head, so the hidden state
 * after layer n_layer - 1 exits early to the vocabulary.  Shares every
 * tensor with m (m must outlive it); free with kvp_model_free.  0, or
 * KVP_EINVAL when n_layer is 0 or more than m has. */
int kvp_model_first_layers(kvp_model **out, const kvp_model *m, uint32_t n_layer, kvp_err *err);

#endif
