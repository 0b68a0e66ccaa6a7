/* fingerprint.h - the model fingerprint that KVP streams carry (kvp(5)).
 *
 * Two XXH64 values (seeds 0 and 1, stored little-endian one after the other)
 * over a canonical serialization of what shapes a model's computation and its
 * KV cache: the architecture and hyperparameters, then every tensor's name,
 * dtype, shape and quantization layout, in file order.  Two files with the
 * same tensors quantized differently get different fingerprints, so KV made
 * by one is refused by the other; retrained weights with the same layout are
 * not told apart (the hash does not read tensor data).
 *
 * Serialization (little-endian, lib/wire.h kvp_buf):
 *   str32 arch; u32 n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim,
 *   n_vocab, rope_type, rope_dim, rope_scaling; f64 rope_theta, rms_eps,
 *   rope_factor;
 *   then per tensor: str32 name; u32 dtype (kvp_dtype); u32 n_dim;
 *   u64 shape[n_dim] (outermost first); u32 scheme, group, scale_dtype, flags.
 */
#ifndef KVP_FINGERPRINT_H
#define KVP_FINGERPRINT_H

#include "config.h"
#include "stream.h"

#include <stddef.h>
#include <stdint.h>

/* Fingerprint of config c and the n tensor records t (name, dtype, n_dim,
 * shape, scheme, group, scale_dtype and flags are read).  Deterministic; an
 * allocation failure gives a fingerprint of what was serialized so far. */
void kvp_fingerprint(const kvp_config *c, const kvp_tensor_rec *t, size_t n, uint8_t out[KVP_FINGERPRINT_SIZE]);

/* 32 lowercase hex digits and a NUL into buf. */
void kvp_fingerprint_hex(const uint8_t fp[KVP_FINGERPRINT_SIZE], char buf[2 * KVP_FINGERPRINT_SIZE + 1]);

#endif
