#!/usr/bin/env python3
"""Compare what the generators wrote (NEW) with the committed goldens (GOLDEN)
for `make check-ref`, one line a file.

Bit-exact goldens (casts, quantized blocks, token ids, checkpoints) must be
the same bytes.  Float goldens made by torch sum in another order on another
CPU (an Intel Xeon gave other bits than the AMD host that made them), so
they are compared within the tolerance of the C test that reads them, and
the largest difference is printed; what is not a float in them (ids, shapes,
header lines) must still be equal.

What only says which reference versions made a golden (the `# made by`
line of a text golden, `transformers_version` in a checkpoint's
config.json) is left out of the comparison, and a difference in it is
printed as a note: a newer transformers from the package index must not fail
check-ref when everything it computed is the same.

Usage: compare.py NEW GOLDEN    (exit 0 when every file passes)
"""
import fnmatch
import json
import math
import os
import sys

import numpy as np


def provenance(line):
    """Whether a text golden's line only names the versions that made it."""
    return line.startswith("# made by")


def config_json(new, old):
    """A checkpoint's config.json: equal but for transformers_version? Then
    (True, note), else (False, None)."""
    try:
        a, b = json.load(open(new)), json.load(open(old))
    except (OSError, ValueError):
        return False, None
    va, vb = a.pop("transformers_version", None), b.pop("transformers_version", None)
    if a != b:
        return False, None
    return True, f"same but transformers_version ({va}, golden {vb})"


def logits_bin(new, old, tol):
    """engine_hf*/NAME/logits.bin ("KVPL", n_tok, n_vocab, ids, f32 logits):
    max |new - old| over max |old|, the measure of test_model_hf.c."""
    a, b = open(new, "rb").read(), open(old, "rb").read()
    n_tok = int.from_bytes(b[4:8], "little")
    head = 12 + 4 * n_tok
    if len(a) != len(b) or a[:head] != b[:head]:
        return None, "header or token ids differ"
    x, y = np.frombuffer(a[head:], "<f4"), np.frombuffer(b[head:], "<f4")
    return float(np.abs(x.astype(np.float64) - y).max() / max(float(np.abs(y).max()), 1e-30)), "max rel err"


def top5_txt(new, old, tol):
    """engine_smollm2_hf.txt and engine_smollm2_ct_*.txt: `pos P id:logit x5`
    lines, the rest equal.  Relative error as test_engine.c's compare_top5
    (over max(|top-1 logit|, 1)); an id may change place only within a tie of
    1e-3 (the golden's five decimals), as that test allows."""
    la, lb = open(new).read().split("\n"), open(old).read().split("\n")
    if len(la) != len(lb):
        return None, "line counts differ"
    worst = 0.0
    for p, q in zip(la, lb):
        if not q.startswith("pos "):
            if p != q and not (provenance(p) and provenance(q)):
                return None, f"line differs: {q[:40]}..."
            continue
        ga = {int(i): float(v) for i, v in (e.split(":") for e in p.split()[2:])}
        gb = [(int(i), float(v)) for i, v in (e.split(":") for e in q.split()[2:])]
        if p.split()[:2] != q.split()[:2]:
            return None, f"position differs: {q[:20]}"
        rng = max(abs(gb[0][1]), 1.0)
        for i, v in gb:
            if i in ga:
                worst = max(worst, abs(ga[i] - v) / rng)
            elif v - min(ga.values()) > 1e-3:  # left the top 5 without a tie at its edge
                return None, f"{q.split()[1]}: id {i} ({v}) left the top 5"
        if next(iter(ga)) != gb[0][0] and abs(ga[next(iter(ga))] - gb[0][1]) > 1e-3:
            return None, f"{q.split()[1]}: another top-1, not a tie"
    return worst, "max rel err"


def ppl_txt(new, old, tol):
    """ppl_smollm2_hf.txt: `window W NLL_SUM COUNT` and `ppl PPL ERR`, the
    rest equal; tests/cli/perplexity.sh wants the PPL within 1e-3 relative,
    so each window's mean NLL (its log PPL) within 1e-3.  The KV-rounded
    goldens' `top1 W SAME COUNT` lines: SAME within TOP1_TOL of COUNT (their
    test's tolerance; another CPU's sums flip other roundings)."""
    la, lb = open(new).read().split("\n"), open(old).read().split("\n")
    if len(la) != len(lb):
        return None, "line counts differ"
    worst = 0.0
    for p, q in zip(la, lb):
        fa, fb = p.split(), q.split()
        if fb[:1] == ["window"] and fa[:2] == fb[:2] and fa[3:] == fb[3:]:
            worst = max(worst, abs(float(fa[2]) - float(fb[2])) / int(fb[3]))
        elif fb[:1] == ["ppl"] and fa[:1] == ["ppl"]:
            worst = max(worst, abs(math.log(float(fa[1]) / float(fb[1]))))
        elif fb[:1] == ["top1"] and fa[:2] == fb[:2] and fa[3:] == fb[3:]:
            if abs(int(fa[2]) - int(fb[2])) > TOP1_TOL * int(fb[3]):
                return None, f"window {fb[1]}'s same-top count {fa[2]} against {fb[2]}"
        elif p != q and not (provenance(p) and provenance(q)):
            return None, f"line differs: {q[:40]}..."
    return worst, "max |log PPL| difference"


# The KV-rounded goldens' same-top share, window by window (perplexity.sh
# allows 3 points on two windows).
TOP1_TOL = 0.03

# golden path pattern: (how, tolerance); the tolerances are the C tests' own
FLOAT = [
    ("engine_hf/*/logits.bin", logits_bin, 1e-4),            # test_model_hf.c test_one
    ("engine_hfquant/ct_nvfp4/logits.bin", logits_bin, 2e-2),  # test_quantized, weights as f32
    ("engine_hfquant/*/logits.bin", logits_bin, 1e-5),       # test_quantized, weights as f32
    ("engine_smollm2_hf.txt", top5_txt, 1e-4),               # test_engine.c test_smollm2_hf
    ("engine_smollm2_ct_*.txt", top5_txt, 1e-4),             # test_smollm2_ct, as f32 weights
    ("ppl_smollm2_hf.txt", ppl_txt, 1e-3),                   # tests/cli/perplexity.sh
    ("ppl_smollm2_hf_*16.txt", ppl_txt, 1e-3),               # tests/cli/perplexity.sh, f16 and bf16 weights
    # fp8 and int8 KV: a rounding flipped by another summation order in an
    # early layer moves every later one (2 windows: +-1.2 nats from a 1e-6
    # change of the embeddings); the test allows 5 nats on 2 windows of 255,
    # so a window may move by 5 nats (5 / 255 a token): torch on an Intel
    # Xeon (Emerald Rapids) moved the fp8 golden's windows by -2.8..+3.3
    # nats (0.0131 a token on one) with the whole text's PPL 18.6052
    # against 18.6066, and windows 0-1 by 2.9 nats together
    ("ppl_smollm2_hf_kv*.txt", ppl_txt, 5 / 255),
]


def check(new, old, rel):
    """(ok, line) for one file."""
    if not os.path.exists(old):
        return False, "not in tests/golden"
    a, b = open(new, "rb").read(), open(old, "rb").read()
    if a == b:
        return True, "same as the committed golden"
    for pat, how, tol in FLOAT:
        if fnmatch.fnmatch(rel, pat):
            d, what = how(new, old, tol)
            if d is None:
                return False, f"DIFFERS from tests/golden ({what})"
            ok = d <= tol
            return ok, (f"{what} {d:.3g} against the committed golden, "
                        f"{'within' if ok else 'OVER'} its test's tolerance {tol:g}")
    if os.path.basename(rel) == "config.json":
        ok, note = config_json(new, old)
        if ok:
            return True, note
    return False, "DIFFERS from tests/golden (a bit-exact golden)"


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    new_dir, old_dir = argv[1], argv[2]
    status = 0
    for top, _, files in sorted(os.walk(new_dir)):
        for f in sorted(files):
            new = os.path.join(top, f)
            rel = os.path.relpath(new, new_dir)
            ok, line = check(new, os.path.join(old_dir, rel), rel)
            if not ok:
                line += " (run with KVP_REF_UPDATE=1 to accept)"
                status = 1
            print(f"ref: {rel}: {line}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
