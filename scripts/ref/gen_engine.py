#!/usr/bin/env python3
"""Golden logits and greedy continuations for the CPU engine, from llama.cpp
(llama-cpp-python) running the same GGUF (SmolLM2-135M-Instruct Q4_1).

Usage: gen_engine.py OUTDIR [MODEL.gguf]
Writes OUTDIR/engine_smollm2.txt, a text file tests/unit/test_engine.c reads:
  model NAME SIZE          the file the numbers belong to
  prompt N id...           the prompt's token ids (llama.cpp's tokenizer)
  pos P id:logit x5        top-5 of the logits after prompt token P
  greedy_prompt N id...    a chat prompt
  greedy N id...           llama.cpp's greedy continuation of it
  spread X                 llama.cpp's own disagreement: max |logit| difference
                           over those top-5 entries between its f16 KV cache
                           (the default, used above) and an f32 one; our
                           error is judged against it
  spread_rms X             the root mean square of those differences: a
                           steadier figure than the max, which one position
                           decides
The model path defaults to what scripts/fetch-model prints, else
~/.cache/kvpipe/SmolLM2-135M-Instruct.Q4_1.gguf.  Exits 0 with a note when
the model is absent (nothing to compare).  llama.cpp runs through
llamaref.run: with its extra buffer types off where its default run dies.
"""
import os
import subprocess
import sys

import numpy as np

import llamaref

NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = (
    "The history of computing is longer than the history of computing hardware and modern computing "
    "technology and includes the history of methods intended for pen and paper or for chalk and slate, "
    "with or without the aid of tables. Digital computing is intimately tied to the representation of "
    "numbers. But long before abstractions like the number arose, there were mathematical concepts to "
    "serve the purposes of civilization. These concepts are implicit in concrete practices such as "
    "one-to-one correspondence, the basis of counting, comparison to a standard, used for measurement, "
    "and the 3-4-5 right triangle, a device for assuring a right angle, using ropes with 12 evenly "
    "spaced knots. def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
)
CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France? Answer in two sentences.<|im_end|>\n<|im_start|>assistant\n")
N_GREEDY = 64


def model_path(argv):
    if len(argv) > 2:
        return argv[2]
    here = os.path.dirname(os.path.abspath(__file__))
    fetch = os.path.join(here, "..", "fetch-model")
    if os.path.exists(fetch):
        try:
            p = subprocess.run([fetch], capture_output=True, text=True, timeout=600).stdout.strip()
            if p and os.path.exists(p):
                return p
        except (OSError, subprocess.SubprocessError):
            pass
    cache = os.environ.get("KVPIPE_CACHE", os.path.expanduser("~/.cache/kvpipe"))
    return os.path.join(cache, NAME)


def reference(open_llama, path):
    """The golden's lines from llama.cpp, the prompt and greedy lengths."""
    llm = open_llama(model_path=path, n_ctx=1024, n_batch=512, logits_all=True, n_threads=2, verbose=False, seed=0)
    lines = [f"model {NAME} {os.path.getsize(path)}"]

    prompt = llm.tokenize(TEXT.encode(), add_bos=False, special=False)
    lines.append(f"prompt {len(prompt)} " + " ".join(map(str, prompt)))
    llm.reset()
    llm.eval(prompt)
    scores = np.array(llm.scores[: len(prompt)], dtype=np.float32)
    for p in range(len(prompt)):
        top = np.argsort(-scores[p], kind="stable")[:5]
        lines.append(f"pos {p} " + " ".join(f"{i}:{scores[p][i]:.5f}" for i in top))

    llm32 = open_llama(model_path=path, n_ctx=1024, n_batch=512, logits_all=True, n_threads=2, verbose=False, seed=0,
                       type_k=0, type_v=0, flash_attn=False)
    llm32.eval(prompt)
    s32 = np.array(llm32.scores[: len(prompt)], dtype=np.float32)
    spread, sq = 0.0, []
    for p in range(len(prompt)):
        top = np.argsort(-scores[p], kind="stable")[:5]
        spread = max(spread, float(np.abs(s32[p][top] - scores[p][top]).max()))
        sq.extend(float(d) ** 2 for d in s32[p][top] - scores[p][top])
    spread_rms = float(np.sqrt(np.mean(sq)))
    del llm32

    chat = llm.tokenize(CHAT.encode(), add_bos=False, special=True)
    llm.reset()
    llm.eval(chat)
    gen = []
    for _ in range(N_GREEDY):
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        gen.append(nxt)
        llm.eval([nxt])
    lines.append(f"greedy_prompt {len(chat)} " + " ".join(map(str, chat)))
    lines.append(f"greedy {len(gen)} " + " ".join(map(str, gen)))
    lines.append(f"spread {spread:.4f}")
    lines.append(f"spread_rms {spread_rms:.4f}")
    return lines, len(prompt), len(gen)


def main(argv):
    out = argv[1]
    path = model_path(argv)
    if not os.path.exists(path):
        print(f"gen_engine: {path} absent, nothing written (run scripts/fetch-model)")
        return 0
    try:
        import llama_cpp  # noqa: F401 - the reference: llama.cpp, built by pip
    except ImportError:
        print("gen_engine: llama-cpp-python is not installed: run `nice scripts/ref/venv llama-cpp-python` "
              "(builds llama.cpp from source, about 10 minutes on 2 cores)")
        return 1

    lines, n_prompt, n_gen = llamaref.run(lambda open_llama: reference(open_llama, path), "gen_engine")[0]
    with open(os.path.join(out, "engine_smollm2.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"gen_engine: {n_prompt} prompt positions, {n_gen} greedy tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
