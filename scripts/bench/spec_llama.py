#!/usr/bin/env python3
"""llama.cpp's prompt-lookup decoding (llama-cpp-python's
LlamaPromptLookupDecoding) against its plain greedy decoding, on one GGUF and
one prompts file, in the same run: the reference line beside kvpipe's specdec
in scripts/bench-spec.

Both modes run greedy (temperature 0, no penalties), with the same thread
count for single tokens and batches, N tokens a request at most (fewer when
the model ends its turn), one request at a time, the two modes alternating
request by request so that a change of machine load falls on both; with
-r R each request runs R times in each mode and its fastest run counts (the
outputs of the runs are the same: greedy).  Each
Llama object is made once; its KV cache is cleared before every request, so
no prompt reuses another's cache.

Prompts: JSON Lines as decode(1) reads them: "messages" are rendered in
ChatML (<|im_start|>ROLE\\nCONTENT<|im_end|>\\n for each, then the assistant
header <|im_start|>assistant\\n), the markers as special tokens and the
contents literal, with the template's own system message first where a
conversation has none (SmolLM2's), which is what kvpipe renders; a plain
"prompt" is tokenized as it is (special tokens parsed, as
decode does), or rendered as a user turn with --chat.  With --kvp-ids FILE
(the output of `prefill --tokenize --json` on the same prompts) the ids
rendered here are checked against kvpipe's, and kvpipe's are used.

Timing: generation only.  A request's clock starts when its first token has
been sampled (the prompt's evaluation is before that and is not counted) and
stops when its last token, or the end-of-turn token, has been sampled:
gen tok/s = sum(tokens - 1) / sum(time from first to last token), the
reciprocal of the mean time per output token after the first (TPOT), as
decode's tpot_ms counts it.  `wall tok/s` also counts the prompts:
sum(tokens) / sum(time from the request's start to its last token).

Drafts: num_pred_tokens (-k) tokens at most, from the longest n-gram of size
max_ngram_size (-g) down to 1 that ends the text so far and occurs earlier in
the prompt or output (its first occurrence).  llama-cpp-python makes a Llama
with a draft model keep logits for every position (logits_all), copying
(K + 1) x n_vocab floats after each verification; that cost is part of what
it measures.  drafted = draft tokens proposed, accepted = draft tokens kept
(a step yields accepted + 1 tokens), mean accepted = accepted / verification
steps (the steps that carried a draft, as specdec counts them).

Identical: whether the greedy token ids with and without lookup are the same
for every request (a verification batch is computed with other kernels than
one token, so near-ties can go the other way).

llama.cpp runs through scripts/ref/llamaref.py: when its default run dies
(SIGSEGV on an Intel Xeon with AMX), both modes run again with its extra
buffer types off, and the header line says so.

Usage: spec_llama.py [-k K] [-g N] [-r R] [--chat] [--kvp-ids FILE] [--json FILE]
                     [--summary FILE] MODEL PROMPTS.jsonl THREADS TOKENS
The last line: `llama.cpp prompt lookup speedup: X.XXx` (gen tok/s with
lookup over without)."""
import argparse
import json
import os
import sys
import time

from llama_cpp import llama_cpp
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import llamaref  # noqa: E402


def chatml(messages):
    """ChatML segments: (text, special) pairs, ending with the assistant header."""
    segs = []
    for m in messages:
        segs += [("<|im_start|>", True), (m["role"] + "\n", False), (m["content"], False), ("<|im_end|>", True),
                 ("\n", False)]
    return segs + [("<|im_start|>", True), ("assistant\n", False)]


def default_system(llm):
    """The system message the GGUF's chat template gives a conversation that has
    none, where it is literal text (SmolLM2's "You are a helpful AI assistant
    named SmolLM, ..."): what kvpipe adds (lib/model/chat.c), else None."""
    tpl = llm.metadata.get("tokenizer.chat_template", "")
    head = "<|im_start|>system\n"
    at = tpl.find(head)
    if at < 0:
        return None
    rest = tpl[at + len(head):]
    end = rest.find("<|im_end|>")
    if end <= 0 or "{" in rest[:end] or "'" in rest[:end]:
        return None
    return rest[:end]


def tokenize(llm, req, chat):
    """A request's prompt ids, as kvpipe renders and tokenizes them."""
    if "messages" in req or chat:
        msgs = req["messages"] if "messages" in req else [{"role": "user", "content": req["prompt"]}]
        system = default_system(llm)
        if system is not None and not any(m.get("role") == "system" for m in msgs):
            msgs = [{"role": "system", "content": system}] + msgs
        segs = chatml(msgs)
    else:
        return llm.tokenize(req["prompt"].encode(), add_bos=False, special=True)
    # each literal piece alone, so a marker-like text in a content stays text;
    # ChatML's pieces begin and end at pre-tokenizer boundaries (newlines,
    # markers), so this equals tokenizing the whole rendering at once
    ids = []
    for text, special in segs:
        if text:
            ids += llm.tokenize(text.encode(), add_bos=False, special=special)
    return ids


class CountingLookup(LlamaPromptLookupDecoding):
    """Prompt lookup that records the length of each draft it proposes."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.drafts = []

    def __call__(self, input_ids, /, **kwargs):
        d = super().__call__(input_ids, **kwargs)
        self.drafts.append(len(d))
        return d


def run(llm, ids, n, lookup=None):
    """Greedy tokens for one prompt: (tokens, t_first, t_last, drafted, accepted, verify steps),
    the times in seconds from the start."""
    llm.reset()  # n_tokens = 0: the next eval drops the whole KV cache
    if lookup is not None:
        lookup.drafts = []
    out, marks = [], []  # marks: how many draft calls had happened at each token
    vocab = llm._model.vocab
    t0 = time.perf_counter()
    t_first = t_last = None
    for tok in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=False):
        t = time.perf_counter() - t0
        if t_first is None:
            t_first = t
        t_last = t
        if llama_cpp.llama_vocab_is_eog(vocab, tok):
            break
        out.append(tok)
        marks.append(len(lookup.drafts) if lookup is not None else 0)
        if len(out) >= n:
            break
    drafted = accepted = steps = 0
    if lookup is not None and out:
        # tokens after the first come in groups, one group a verification step
        # (its draft call happened just before): a group is accepted + 1
        n_steps = marks[-1]
        drafted = sum(lookup.drafts[:n_steps])
        accepted = (len(out) - 1) - n_steps
        steps = sum(1 for d in lookup.drafts[:n_steps] if d)  # as specdec counts: steps that carried guesses
    return out, t_first, t_last, drafted, accepted, steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", type=int, default=10, help="num_pred_tokens: draft length (10)")
    ap.add_argument("-g", type=int, default=2, help="max_ngram_size: longest n-gram looked up (2)")
    ap.add_argument("-r", type=int, default=1, help="runs of each request in each mode, the fastest counts (1)")
    ap.add_argument("--chat", action="store_true", help="render plain prompts as a user turn")
    ap.add_argument("--kvp-ids", help="prefill --tokenize --json output for the same prompts: check, then use")
    ap.add_argument("--json", help="write each request's texts and figures here (JSON Lines)")
    ap.add_argument("--summary", help="write the two rows here as one JSON object")
    ap.add_argument("model")
    ap.add_argument("prompts")
    ap.add_argument("threads", type=int)
    ap.add_argument("tokens", type=int)
    a = ap.parse_args()

    reqs = [json.loads(line) for line in open(a.prompts, encoding="utf-8") if line.strip()]
    for i, r in enumerate(reqs):
        r.setdefault("id", str(i))
    def measure(open_llama):
        """(tot, drafted, accepted, steps, same) of both modes over every request."""
        kw = dict(n_threads=a.threads, n_threads_batch=a.threads, n_batch=512, n_ubatch=512, verbose=False)
        plain = open_llama(model_path=a.model, n_ctx=512, **kw)  # only for tokenizing until n_ctx is known
        ids = {str(r["id"]): tokenize(plain, r, a.chat) for r in reqs}
        if a.kvp_ids:
            theirs = {}
            for line in open(a.kvp_ids, encoding="utf-8"):
                if line.strip():
                    o = json.loads(line)
                    theirs[str(o["id"])] = o["ids"]
            bad = [k for k in ids if theirs.get(k) != ids[k]]
            for k in bad[:3]:
                print(f"spec_llama: {k}: prompt ids differ from kvpipe's:\n  here   {ids[k][:24]}...\n"
                      f"  kvpipe {(theirs.get(k) or [])[:24]}...", file=sys.stderr)
            print(f"spec_llama: prompt ids: {len(ids) - len(bad)} of {len(ids)} as kvpipe's; using kvpipe's",
                  file=sys.stderr)
            ids = {k: theirs.get(k, v) for k, v in ids.items()}
        n_ctx = max(len(v) for v in ids.values()) + a.tokens + a.k + 64
        del plain
        plain = open_llama(model_path=a.model, n_ctx=n_ctx, **kw)
        lookup = CountingLookup(num_pred_tokens=a.k, max_ngram_size=a.g)
        # logits_all as the draft model makes it anyway: llama-cpp-python
        # 0.3.36 sizes its logits array by the argument (n_batch rows
        # without it) and then writes a row for every position up to n_ctx,
        # which fails past 512 tokens ("could not broadcast")
        spec = open_llama(model_path=a.model, n_ctx=n_ctx, draft_model=lookup, logits_all=True, **kw)
        first = next(iter(ids.values()))
        run(plain, first[:32], 8)  # warm both up: page the weights in, size the buffers
        run(spec, first[:32], 8, lookup)

        tot = {m: dict(tok=0, gen_tok=0, gen_s=0.0, wall_s=0.0) for m in ("plain", "lookup")}
        drafted = accepted = steps = 0
        same = 0
        dump = open(a.json, "w", encoding="utf-8") if a.json else None
        for r in reqs:
            k = str(r["id"])
            res = {}
            for m, llm, lk in (("plain", plain, None), ("lookup", spec, lookup)):
                out, t1, t2, d, acc, st = run(llm, ids[k], a.tokens, lk)
                for _ in range(a.r - 1):
                    again = run(llm, ids[k], a.tokens, lk)
                    if again[0] != out:
                        print(f"spec_llama: {k}: {m}: a second greedy run gave other tokens", file=sys.stderr)
                    t1, t2 = min((t1, t2), (again[1], again[2]), key=lambda t: t[1] - t[0])
                res[m] = out
                t = tot[m]
                t["tok"] += len(out)
                t["gen_tok"] += max(len(out) - 1, 0)
                t["gen_s"] += (t2 - t1) if out else 0.0
                t["wall_s"] += t2 if t2 is not None else 0.0
                if lk is not None:
                    drafted, accepted, steps = drafted + d, accepted + acc, steps + st
                if dump:
                    dump.write(json.dumps({"id": k, "mode": m, "text": plain.detokenize(out).decode("utf-8", "replace"),
                                           "tokens": len(out), "gen_s": round(t2 - t1, 4) if out else 0,
                                           "drafted": d, "accepted": acc, "steps": st}) + "\n")
            same += res["plain"] == res["lookup"]
        if dump:
            dump.close()
        return tot, drafted, accepted, steps, same

    (tot, drafted, accepted, steps, same), note = llamaref.run(measure, "spec_llama")

    def rate(n, s):
        return n / s if s > 0 else 0.0

    print(f"llama.cpp (llama-cpp-python), {len(reqs)} requests, greedy, {a.tokens} tokens at most, "
          f"{a.threads} threads, one request at a time (best of {a.r}); lookup: num_pred_tokens {a.k}, "
          f"max_ngram_size {a.g}" + (f"; {note}" if note else ""))
    print(f"| {'mode':<22} | {'tokens':>6} | {'gen tok/s':>9} | {'wall tok/s':>10} | {'acceptance':>10} "
          f"| {'mean accepted':>13} | {'identical':>9} |")
    print(f"|{'-' * 24}|{'-' * 8}|{'-' * 11}|{'-' * 12}|{'-' * 12}|{'-' * 15}|{'-' * 11}|")
    gp = rate(tot["plain"]["gen_tok"], tot["plain"]["gen_s"])
    gl = rate(tot["lookup"]["gen_tok"], tot["lookup"]["gen_s"])
    acc = f"{accepted / drafted:.3f}" if drafted else "-"
    mean = f"{accepted / steps:.2f}" if steps else "-"
    print(f"| {'greedy':<22} | {tot['plain']['tok']:>6} | {gp:>9.2f} | "
          f"{rate(tot['plain']['tok'], tot['plain']['wall_s']):>10.2f} | {'-':>10} | {'-':>13} | {'-':>9} |")
    print(f"| {'greedy + prompt lookup':<22} | {tot['lookup']['tok']:>6} | {gl:>9.2f} | "
          f"{rate(tot['lookup']['tok'], tot['lookup']['wall_s']):>10.2f} | {acc:>10} | {mean:>13} | "
          f"{same:>4} of {len(reqs):<2} |")
    print(f"drafted {drafted}, accepted {accepted}, verification steps {steps}")
    if a.summary:
        with open(a.summary, "w", encoding="utf-8") as f:
            json.dump({"requests": len(reqs), "k": a.k, "g": a.g, "identical": same,
                       "plain": {"tokens": tot["plain"]["tok"], "gen_tps": round(gp, 2),
                                 "wall_tps": round(rate(tot["plain"]["tok"], tot["plain"]["wall_s"]), 2)},
                       "lookup": {"tokens": tot["lookup"]["tok"], "gen_tps": round(gl, 2),
                                  "wall_tps": round(rate(tot["lookup"]["tok"], tot["lookup"]["wall_s"]), 2),
                                  "drafted": drafted, "accepted": accepted, "verify_steps": steps,
                                  "acceptance": round(accepted / drafted, 4) if drafted else 0,
                                  "mean_accepted": round(accepted / steps, 3) if steps else 0}},
                      f, separators=(",", ":"))
            f.write("\n")
    print(f"llama.cpp prompt lookup speedup: {rate(gl, gp):.2f}x")


if __name__ == "__main__":
    main()
