"""A scaled KV cache inside HF transformers' Llama: every key (after RoPE)
and value row of each head rounded as kvpipe's running cache stores it
(lib/num/kvscale.c, kvp_kvscale_row), before any token attends to it, so
transformers computes what `prefill --kv-dtype fp8|int8` computes, from an
implementation that shares no code with it:

  fp8:  scale = the power of two at or above amax / 448 (amax over the row's
        head_dim elements; 1 for an all-zero row), code = e4m3(x * (1 /
        scale)) rounded to nearest even (torch's float8_e4m3fn cast; the
        scale keeps every |x / scale| <= 448, so nothing saturates), read
        back as code * scale;
  int8: scale = amax / 127, code = rint(x * (1 / scale)) clamped to
        [-128, 127], read back as code * scale.

With rotate=True each row is first multiplied by the orthonormal
Sylvester-Hadamard matrix of the head size and rotated back after reading
(what QuaRot-style rotations do to spread outlier channels over the row);
dot products and weighted sums are unchanged by the rotation in exact
arithmetic, so only the rounding differs.  kvpipe does not rotate: this is
for the study in study_kv_hf.py.

Used by gen_ppl_hf.py (the goldens) and study_kv_hf.py.
"""
import contextlib

import torch


def _row_scale_fp8(amax):
    s = amax / 448.0
    s = torch.where(s > 0, s, torch.ones_like(s))
    m, e = torch.frexp(s)  # s = m * 2^e, m in [0.5, 1)
    return torch.where(m == 0.5, s, torch.ldexp(torch.ones_like(s), e))


def round_fp8(x):
    """Rows of the last dimension, in float32, as the fp8 cache stores them."""
    x = x.float()
    scale = _row_scale_fp8(x.abs().amax(-1, keepdim=True))
    return (x * (1.0 / scale)).to(torch.float8_e4m3fn).float() * scale


def round_int8(x):
    """Rows of the last dimension, in float32, as the int8 cache stores them."""
    x = x.float()
    s = x.abs().amax(-1, keepdim=True) / 127.0
    s = torch.where(s > 0, s, torch.ones_like(s))
    return torch.clamp(torch.round(x * (1.0 / s)), -128, 127) * s


ROUND = {"fp8": round_fp8, "int8": round_int8}


def hadamard(n):
    """The n x n orthonormal Sylvester-Hadamard matrix (n a power of two)."""
    if n & (n - 1):
        raise ValueError(f"no Sylvester-Hadamard matrix of size {n}")
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n ** 0.5


@contextlib.contextmanager
def kv_rounded(model, k=None, v=None, rotate=False):
    """Within the block, model's keys are rounded by k and its values by v
    (functions of rows, as ROUND's; None leaves them as computed)."""
    import transformers.models.llama.modeling_llama as ml
    cfg = model.config
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    nkv = cfg.num_key_value_heads
    rot = hadamard(hd) if rotate else None

    def rounder(f):
        if f is None or rot is None:
            return f
        return lambda x: f(x.float() @ rot.T) @ rot

    kf, vf = rounder(k), rounder(v)
    rope = ml.apply_rotary_pos_emb

    def rope_rounded(q, key, *a, **kw):
        q, key = rope(q, key, *a, **kw)
        return q, (kf(key).to(key.dtype) if kf else key)

    def v_rounded(_mod, _inp, out):
        if vf is None:
            return out
        return vf(out.view(*out.shape[:-1], nkv, hd)).to(out.dtype).view(out.shape)

    hooks = [layer.self_attn.v_proj.register_forward_hook(v_rounded) for layer in model.model.layers]
    ml.apply_rotary_pos_emb = rope_rounded
    try:
        yield
    finally:
        ml.apply_rotary_pos_emb = rope
        for h in hooks:
            h.remove()
