#!/usr/bin/env python3
"""Golden token ids from HF `tokenizers` for tests/unit/test_tokenizer.c.

Usage: gen_tokenizer.py [OUT_DIR]     (default tests/golden; run via scripts/ref/run)

Three vocabularies, each turned into an HF `tokenizers` Tokenizer the way HF
builds the real one, then checked against vectors we did not make before any
golden is written:

  tok_smollm2.txt   SmolLM2-135M-Instruct's GGUF (scripts/fetch-model, or
                    $KVP_SMOLLM2_GGUF): byte-level BPE, Digits(individual) +
                    ByteLevel pre-tokenizer.  Checked against the two vectors
                    in shared/FACTS.md.
  tok_llama_spm.txt Llama-2's SentencePiece vocabulary (llama.cpp's
                    models/ggml-vocab-llama-spm.gguf, carried in the
                    llama-cpp-python source package): BPE with merges derived
                    from the scores as transformers' LlamaConverter does,
                    byte fallback, Prepend/Replace U+2581 normalizer, <s>.
                    The vocabulary itself is copied to
                    tok_llama_spm_vocab.bin (a GGUF) so `make check` has it.
  tok_llama3.txt    Llama-3's vocabulary (ggml-vocab-llama-bpe.gguf, 7.8 MB,
                    not copied: the unit test reads it from the cache when
                    present): Split(Llama-3 regex) + ByteLevel, ignore_merges.
  Each rebuilt Tokenizer is also saved as a tokenizer.json in the cache
  ($KVPIPE_CACHE/vocab/), for the unit test's tokenizer.json path.
  Both llama.cpp vocabularies come with .inp/.out files that HF's own
  tokenizers for the real models produced; the Tokenizers built here must
  reproduce them exactly.

Golden format: '#' comment lines, then one case per line:
    <hex of the UTF-8 text> TAB <ids separated by spaces>
ids are tok.encode(text).ids with HF's defaults: special tokens in the text
are recognised, and BOS is added where the model's post-processor adds it.
"""
import os
import random
import shutil
import subprocess
import sys
import tarfile
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

try:
    import gguf
    import tokenizers
except ImportError:  # scripts/ref/run's venv may predate this script: add what it lacks
    subprocess.check_call([str(ROOT / "scripts" / "ref" / "venv"), "tokenizers", "gguf", "numpy"],
                          stdout=subprocess.DEVNULL)
    import gguf
    import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

CACHE = Path(os.environ.get("KVPIPE_CACHE", Path.home() / ".cache" / "kvpipe"))
LCP_VERSION = "0.3.36"  # llama-cpp-python source package carrying llama.cpp's vocab files
VOCABS = ["ggml-vocab-llama-spm.gguf", "ggml-vocab-llama-bpe.gguf"]
N_RANDOM = 1100

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def die(msg):
    sys.exit("gen_tokenizer: " + msg)


# ---------------------------------------------------------------- inputs

def smollm2_path():
    p = os.environ.get("KVP_SMOLLM2_GGUF")
    if p:
        return p
    fetch = ROOT / "scripts" / "fetch-model"
    if fetch.exists():
        out = subprocess.check_output([str(fetch)], text=True).strip().splitlines()
        if out:
            return out[-1]
    die("no SmolLM2 GGUF: set KVP_SMOLLM2_GGUF or run make fetch-model")


def vocab_dir():
    d = CACHE / "vocab"
    wanted = [v + ext for v in VOCABS for ext in ("", ".inp", ".out")]
    if all((d / w).exists() for w in wanted):
        return d
    dl = CACHE / "dl"
    dl.mkdir(parents=True, exist_ok=True)
    sdist = dl / ("llama_cpp_python-%s.tar.gz" % LCP_VERSION)
    if not sdist.exists():
        subprocess.check_call([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                               "llama-cpp-python==" + LCP_VERSION, "-d", str(dl)], stdout=sys.stderr)
    d.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as tf:
        for m in tf.getmembers():
            name = m.name.rsplit("/", 1)[-1]
            if name in wanted and "/models/" in m.name:
                with tf.extractfile(m) as src, open(d / name, "wb") as dst:
                    shutil.copyfileobj(src, dst)
    for w in wanted:
        if not (d / w).exists():
            die("%s is not in llama-cpp-python %s" % (w, LCP_VERSION))
    return d


def read_vocab(path):
    r = gguf.GGUFReader(str(path))
    f = r.fields

    def strs(key):
        fld = f[key]
        return [bytes(fld.parts[i]).decode("utf-8") for i in fld.data]

    def nums(key):
        fld = f.get(key)
        return [fld.parts[i][0].item() for i in fld.data] if fld else None

    def scalar(key):
        fld = f.get(key)
        if not fld:
            return None
        v = fld.parts[fld.data[0]]
        return bytes(v).decode() if fld.types[0] == gguf.GGUFValueType.STRING else v[0].item()

    v = {"tokens": strs("tokenizer.ggml.tokens"), "types": nums("tokenizer.ggml.token_type"),
         "scores": nums("tokenizer.ggml.scores"), "model": scalar("tokenizer.ggml.model"),
         "pre": scalar("tokenizer.ggml.pre"), "bos": scalar("tokenizer.ggml.bos_token_id"),
         "add_bos": scalar("tokenizer.ggml.add_bos_token")}
    v["merges"] = strs("tokenizer.ggml.merges") if "tokenizer.ggml.merges" in f else None
    return v


# ---------------------------------------------------------------- HF tokenizers

def specials(v):
    return [t for t, ty in zip(v["tokens"], v["types"]) if ty in (2, 3, 4)]


def vocab_map(v):
    m = {}
    for i, t in enumerate(v["tokens"]):
        m.setdefault(t, i)
    return m


def hf_bytelevel(v, pre):
    merges = [tuple(m.split(" ", 1)) for m in v["merges"]]
    bpe = models.BPE(vocab=vocab_map(v), merges=merges, ignore_merges=(pre == "llama3"))
    tk = Tokenizer(bpe)
    if pre == "smollm":
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials(v)])
    # Without tokenizer.ggml.add_bos_token, llama.cpp adds BOS for the Llama-3
    # pre-tokenizer (as Llama-3's own tokenizer.json does); so does our loader.
    if v["add_bos"] or (v["add_bos"] is None and pre == "llama3"):
        bos = v["tokens"][v["bos"]]
        tk.post_processor = processors.TemplateProcessing(single=bos + " $A", special_tokens=[(bos, v["bos"])])
    return tk


def hf_spm(v):
    """transformers' LlamaConverter: merges are every split of a piece into two
    pieces of the vocabulary, ranked by the merged piece's score."""
    vocab = vocab_map(v)
    merges = []
    for i, (piece, ty) in enumerate(zip(v["tokens"], v["types"])):
        if ty != 1:
            continue
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                merges.append((-v["scores"][i], i, vocab[left], vocab[right], left, right))
    merges.sort()
    bpe = models.BPE(vocab=vocab, merges=[(m[4], m[5]) for m in merges], unk_token="<unk>",
                     byte_fallback=True, fuse_unk=True)
    tk = Tokenizer(bpe)
    tk.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials(v)])
    bos = v["tokens"][v["bos"]]
    tk.post_processor = processors.TemplateProcessing(single=bos + " $A", special_tokens=[(bos, v["bos"])])
    return tk


def check_llamacpp_vectors(tk, path):
    """llama.cpp's .inp/.out: texts and the ids HF gave for the real model
    (no special tokens added)."""
    texts = Path(str(path) + ".inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    want = Path(str(path) + ".out").read_text(encoding="utf-8").split("\n")
    if texts and texts[-1].endswith("\n__ggml_vocab_test__"):
        texts[-1] = texts[-1][: -len("\n__ggml_vocab_test__")]
    for text, w in zip(texts, want):
        got = tk.encode(text, add_special_tokens=False).ids
        if got != [int(x) for x in w.split()]:
            die("%s: HF rebuild disagrees with the reference on %r: %s vs %s" % (path.name, text, got, w))
    print("gen_tokenizer: %s: %d reference vectors reproduced" % (path.name, len(texts)), file=sys.stderr)


# ---------------------------------------------------------------- test strings

WORDS = ("the of and to in is was that for it with as on be at by this had not are but from or have an they "
         "which one you were all we her she there would their will when who him been has more if no out so "
         "said what up its about than into them can only other time new some could these two may first then "
         "do any like my now over such our man me even most made after also did many before must through "
         "Hello World Paris France capital tokenizer llama SmolLM quantization KV-cache GPU naïve café "
         "résumé Zürich Ångström straße Москва Київ東京 日本語 中文 한국어 العربية हिन्दी ελληνικά").split()

CODE = [
    "def f(x):\n    return x * 2\n",
    "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "for (size_t i = 0; i < n; i++) a[i] += b[i];",
    "if __name__ == '__main__':\n    main()",
    "const x = {a: 1, b: [2, 3]};  // comment",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "<div class=\"row\"><span>hi</span></div>",
    "fn main() { println!(\"{}\", 1_000_000u64); }",
    "$ make -j2 && ./bin/decode --chat -n 128 < kv.kvp",
    "x = [i**2 for i in range(10) if i % 3 != 0]",
    "    \n\t\t  \r\n",
    "{\"id\": 7, \"prompt\": \"2+2=\", \"messages\": []}",
    "#include <stdio.h>\n#define N 1024\n",
    "a->b->c; x>>=3; y<<=1; z ^= ~0u;",
    "lambda: (yield from g())",
]

SPACES = [" ", "  ", "   ", "    ", "        ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", " \n", "\n ", " \n\n ",
          "\u00a0", "\u3000", "\u2009", "\u2028", "\x0b", "\x0c", " \t \n"]

NUMBERS = ["0", "7", "42", "123", "1234", "12345", "3.14159", "1,000,000", "2024-05-01", "10:30", "0x1F",
           "1e-5", "-17", "+8", "٣٤٥", "²", "½", "Ⅻ", "१२३", "９９", "007", "99.5%"]

PUNCT = list("!?.,;:'\"()[]{}<>-_=+*/\\|@#$%^&~`") + ["...", "—", "«", "»", "“", "”", "’", "!!", "?!", "…", "--"]

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'RE", "'Ll", "I'm", "don't", "they'RE",
                "it's", "we'd", "'x", "''"]

RANGES = [(0x00C0, 0x00FF), (0x0100, 0x017F), (0x0391, 0x03C9), (0x0410, 0x044F), (0x05D0, 0x05EA),
          (0x0627, 0x064A), (0x0905, 0x0939), (0x0E01, 0x0E30), (0x3041, 0x3096), (0x30A1, 0x30FA),
          (0x4E00, 0x4FFF), (0xAC00, 0xACFF), (0x1F600, 0x1F64F), (0x1F300, 0x1F5FF), (0x2600, 0x26FF),
          (0x0300, 0x036F), (0x2190, 0x21FF), (0x2070, 0x209C), (0x1D400, 0x1D4FF)]

FIXED = ["", " ", "a", "The capital of France is", "Hello world! 123", "  leading", "trailing  ", "\n\nx\n\n",
         "   \n   \n", "I'm here, you're there; they'll come", "HELLO'S", "👨‍👩‍👧 family", "🇫🇷🇩🇪",
         "e\u0301 vs é", "ﬁ ligature", "😀😀😀", "1+1=2", "a1b2c3", "     ", "\t\t\tx", "x\r\ny\rz",
         "Ⅷ Ⅸ ⅹ", "١٢٣ arabic digits", "x" * 300, "ab" * 200, " " * 64 + "z", "9" * 40,
         "\x1b[31mred\x1b[0m", "nul\x00byte", "\x04\x06\x13 ctrl\x1d", "del\x7f", "a\x04b", "\x0b\x0c\x1c\x1f",
         "\u0085next", "zero\u200bwidth", "\ufeffbom", "\U0010fffd"]


def random_unicode(rng):
    while True:
        lo, hi = rng.choice(RANGES)
        ch = chr(rng.randint(lo, hi))
        if unicodedata.category(ch) != "Cn":
            return ch


def random_piece(rng, special):
    k = rng.randrange(10)
    if k < 3:
        w = rng.choice(WORDS)
        return w.capitalize() if rng.random() < 0.2 else (w.upper() if rng.random() < 0.05 else w)
    if k == 3:
        return rng.choice(SPACES)
    if k == 4:
        return rng.choice(NUMBERS) if rng.random() < 0.5 else str(rng.randrange(10 ** rng.randint(1, 12)))
    if k == 5:
        return "".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 3)))
    if k == 6:
        return "".join(random_unicode(rng) for _ in range(rng.randint(1, 6)))
    if k == 7:
        return rng.choice(CONTRACTIONS)
    if k == 8:
        return rng.choice(CODE)
    return rng.choice(special) if special and rng.random() < 0.5 else rng.choice(WORDS)


def test_strings(special, seed):
    rng = random.Random(seed)
    out = list(FIXED)
    for s in special[:8]:
        out += [s, "x" + s + "y", " " + s + " ", s + s, "<|im_start|>user\nhi" + s + "\n"]
    for code in CODE:
        out.append(code)
    for _ in range(N_RANDOM):
        pieces = [random_piece(rng, special) for _ in range(rng.randint(1, 12))]
        sep = rng.choice(["", " ", "", " ", "\n", ""])
        out.append(sep.join(pieces))
    return out


# ---------------------------------------------------------------- output

def save_json(tk, name):
    """The HF tokenizer.json of a rebuilt tokenizer, into the cache (too big to
    commit): test_tokenizer.c runs the same goldens through
    kvp_tokenizer_load_json when it is there."""
    d = CACHE / "vocab"
    d.mkdir(parents=True, exist_ok=True)
    tk.save(str(d / name))


def write_golden(path, tk, texts, note):
    with open(path, "w", encoding="ascii", newline="\n") as f:
        f.write("# generated by scripts/ref/gen_tokenizer.py with tokenizers %s: %s\n" % (tokenizers.__version__, note))
        f.write("# <hex of the UTF-8 text> TAB <ids of tok.encode(text)>\n")
        for t in texts:
            ids = tk.encode(t).ids
            f.write("%s\t%s\n" % (t.encode("utf-8").hex(), " ".join(map(str, ids))))
    print("gen_tokenizer: wrote %s (%d cases)" % (path, len(texts)), file=sys.stderr)


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "golden"
    out.mkdir(parents=True, exist_ok=True)

    smol = read_vocab(smollm2_path())
    if smol["model"] != "gpt2" or smol["pre"] != "smollm":
        die("SmolLM2 GGUF: model %r pre %r, want gpt2 smollm" % (smol["model"], smol["pre"]))
    tk = hf_bytelevel(smol, "smollm")
    for text, want in [("The capital of France is", [504, 3575, 282, 4649, 314]),
                       ("Hello world! 123", [19556, 905, 17, 216, 33, 34, 35])]:
        if tk.encode(text).ids != want:
            die("SmolLM2: %r gives %s, FACTS.md says %s" % (text, tk.encode(text).ids, want))
    save_json(tk, "smollm2.tokenizer.json")
    write_golden(out / "tok_smollm2.txt", tk, test_strings(specials(smol), 1),
                 "SmolLM2-135M-Instruct GGUF vocabulary, Digits + ByteLevel")

    vd = vocab_dir()
    spm_path = vd / "ggml-vocab-llama-spm.gguf"
    spm = read_vocab(spm_path)
    tk = hf_spm(spm)
    check_llamacpp_vectors(tk, spm_path)
    save_json(tk, "llama-spm.tokenizer.json")
    write_golden(out / "tok_llama_spm.txt", tk, test_strings(specials(spm), 2),
                 "Llama-2 SentencePiece vocabulary (llama.cpp ggml-vocab-llama-spm.gguf), BOS added")
    shutil.copyfile(spm_path, out / "tok_llama_spm_vocab.bin")

    l3_path = vd / "ggml-vocab-llama-bpe.gguf"
    l3 = read_vocab(l3_path)
    tk = hf_bytelevel(l3, "llama3")
    check_llamacpp_vectors(tk, l3_path)
    save_json(tk, "llama-bpe.tokenizer.json")
    write_golden(out / "tok_llama3.txt", tk, test_strings(specials(l3), 3),
                 "Llama-3 vocabulary (llama.cpp ggml-vocab-llama-bpe.gguf), BOS added")


if __name__ == "__main__":
    main()
