#!/usr/bin/env python3
"""Golden token ids from llama.cpp's tokenizer (llama-cpp-python, vocab_only)
for a byte-level BPE vocabulary that names no pre-tokenizer, for
tests/unit/test_tokenizer.c and tests/cli/tokenize.sh.

Usage: gen_tokenizer_default.py [OUT_DIR]   (default tests/golden; run via scripts/ref/run)

Without tokenizer.ggml.pre llama.cpp warns ("missing pre-tokenizer type,
using: 'default'") and cuts the text with its LLAMA_VOCAB_PRE_TYPE_DEFAULT
regexes, not GPT-2's:

  tok_default_vocab.bin  a small byte-level vocabulary made here (no one
                         else's): the 256 byte tokens, <|endoftext|>, and a
                         merge for every pair of ASCII digits, lowercase
                         letters, symbols, space and newline, and for space
                         + every byte >= 0x80, so that nearly every word
                         boundary shows in the ids; a GGUF (renamed so that
                         *.gguf ignores keep it) with no tokenizer.ggml.pre
  tok_default.txt        llama.cpp's ids on it
  tok_default_llama3.txt llama.cpp's ids on Llama-3's vocabulary
                         (ggml-vocab-llama-bpe.gguf, cached by gen_tokenizer.py,
                         not committed) with tokenizer.ggml.pre dropped: the
                         reported case

The strings: digits (runs of three), punctuation runs (every Unicode 15.1
punctuation character above U+007F after a space, and the characters around
each punctuation range), contractions, the special token, then
gen_tokenizer.py's fixed and random strings.  The characters come from the
PyPI package unicodedata2 pinned to Unicode 15.1.0, the version of
lib/base/unicode_tables.c (scripts/gen-unicode-tables) and of llama.cpp's
tables; the standard library's unicodedata is the running Python's (3.11:
14.0), so any other version is refused.  Golden format as
gen_tokenizer_special.py's:
    <hex of the UTF-8 text> TAB <ids, special=True> TAB <ids, special=False> (add_bos=True)
"""
import random
import string
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gen_tokenizer as gt  # noqa: E402  (vocabularies and test strings)
import gen_tokenizer_special as gts  # noqa: E402  (llama.cpp, quietly)

import gguf  # noqa: E402

UNICODE_VERSION = "15.1.0"
try:
    import unicodedata2 as ucd  # noqa: E402
except ImportError:
    gt.die("no unicodedata2 module (need Unicode %s, as scripts/gen-unicode-tables); run it through "
           "scripts/ref/run, or $(scripts/ref/venv unicodedata2==%s)" % (UNICODE_VERSION, UNICODE_VERSION))

ROOT = HERE.parents[1]
N_RANDOM = 120

# What the review reported for Llama-3's vocabulary without the key.
REPORTED = [("1234", [4513, 19]), ("it's 2024... ok?", [275, 6, 82, 220, 2366, 19, 1131, 5509, 30])]

CASES = ["1234", "it's 2024... ok?", "12345678", "a1234b", " 2024", "1,234,567.89", "x=12345;", "\u0661\u0662\u06634567",
         "\u00b2\u00b3 12\u00b3", "Hello, world!", "a...b", "$100 + 5 < 6", "x^2 ~ y|z", "`code`", "a`b", "'s 're",
         "don't", "I'm HERE'S", "\u00abquoted\u00bb", "\u00bfQu\u00e9?", "a\u2014b", "\u201cx\u201d", "\u3002",
         "a\u3001b", "!!!", " !", "  !!", "@user #tag", "(a)[b]{c}", "_under_score", "a/b\\c", "e.g.", "\t!", "\n!\n",
         "x\n\ny", "  12  345 ", "3.14159", "0x1F", "v1.2.3-rc4", "<|endoftext|>12<|endoftext|>", "a<|endoftext|>!",
         "100%", "#1 $2 %3", "--opt=7", "\u00a9 2024", "\u20ac5", " \u00a7 1", "\u0e51\u0e52\u0e53", "9" * 40]


def build_vocab(path):
    """The synthetic vocabulary (see above), written as a GGUF to path."""
    cp = [chr(byte_cp(b)) for b in range(256)]
    chars = string.digits + string.ascii_lowercase + "".join(c for c in map(chr, range(33, 127)) if not c.isalnum())
    chars += " \n"
    pairs = [(cp[ord(a)], cp[ord(b)]) for a in chars for b in chars] + [(cp[32], cp[b]) for b in range(0x80, 0x100)]
    random.Random(5).shuffle(pairs)
    tokens = cp + ["<|endoftext|>"] + [a + b for a, b in pairs]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("kvpipe default pre-tokenizer test vocabulary")
    for k, v in [("block_count", 1), ("context_length", 2048), ("embedding_length", 64), ("feed_forward_length", 128),
                 ("attention.head_count", 2), ("attention.head_count_kv", 2), ("rope.dimension_count", 32)]:
        w.add_uint32("llama." + k, v)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([1] * 256 + [3] + [1] * len(pairs))
    w.add_token_merges([a + " " + b for a, b in pairs])
    w.add_bos_token_id(256)
    w.add_eos_token_id(256)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def byte_cp(b):
    """GPT-2's printable stand-in of byte b."""
    keep = lambda k: 33 <= k <= 126 or 161 <= k <= 172 or k >= 174
    return b if keep(b) else 0x100 + sum(1 for k in range(b) if not keep(k))


def write(path, lm, cases, note):
    """gen_tokenizer_special.py's format, under this script's name."""
    with open(path, "w", encoding="ascii", newline="\n") as f:
        f.write("# generated by scripts/ref/gen_tokenizer_default.py with llama-cpp-python %s: %s\n"
                % (gts.llama_cpp.__version__, note))
        f.write("# <hex of the UTF-8 text> TAB <ids, special=True> TAB <ids, special=False> (add_bos=True)\n")
        with gts.quiet_stderr():
            for t in cases:
                b = t.encode("utf-8")
                on = lm.tokenize(b, add_bos=True, special=True)
                off = lm.tokenize(b, add_bos=True, special=False)
                f.write("%s\t%s\t%s\n" % (b.hex(), " ".join(map(str, on)), " ".join(map(str, off))))
    print("gen_tokenizer_default: wrote %s (%d cases)" % (path, len(cases)), file=sys.stderr)


def drop_pre(src, dst):
    """Copy the GGUF src to dst without tokenizer.ggml.pre."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), arch=r.fields["general.architecture"].contents())
    for key, fld in r.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "tokenizer.ggml.pre"):
            continue
        sub = fld.types[1] if fld.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, fld.contents(), fld.types[0], sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def groups(chars, size):
    """Strings of size characters each after a space: a punctuation
    character is a word of its own there, any other shares the space's."""
    return [" " + " ".join(chars[i:i + size]) for i in range(0, len(chars), size)]


def punct_strings():
    assigned = lambda c: ucd.category(chr(c)) not in ("Cn", "Cs")
    p = [c for c in range(0x80, 0x110000) if ucd.category(chr(c)).startswith("P")]
    edges = set()
    for c in p:
        for e in (c - 1, c + 1):
            if e >= 0x80 and e not in p and assigned(e):
                edges.add(e)
    others = [c for c in range(0x80, 0x30000, 29) if assigned(c) and ucd.category(chr(c))[0] in "SMC"]
    return groups([chr(c) for c in p], 24) + groups([chr(c) for c in sorted(edges)], 24) + \
        groups([chr(c) for c in others], 24)


def texts(special, seed):
    out = CASES + punct_strings() + gt.FIXED + gt.test_strings(special, seed)[-N_RANDOM:]
    return list(dict.fromkeys(t for t in out if "\x00" not in t))


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "golden"
    out.mkdir(parents=True, exist_ok=True)
    if ucd.unidata_version != UNICODE_VERSION:
        gt.die("unicodedata2 is Unicode %s: the punctuation strings and lib/base/unicode_tables.c are Unicode %s; "
               "run: $(scripts/ref/venv unicodedata2==%s) %s" % (ucd.unidata_version, UNICODE_VERSION,
                                                               UNICODE_VERSION, sys.argv[0]))

    vocab = out / "tok_default_vocab.bin"
    build_vocab(vocab)
    write(out / "tok_default.txt", gts.llama(vocab), texts(["<|endoftext|>"], 31),
              "tok_default_vocab.bin (no tokenizer.ggml.pre: llama.cpp's 'default' pre-tokenizer)")

    l3_path = gt.vocab_dir() / "ggml-vocab-llama-bpe.gguf"
    l3 = gt.read_vocab(l3_path)
    with tempfile.TemporaryDirectory() as d:
        nopre = Path(d) / "nopre.gguf"
        drop_pre(l3_path, nopre)
        lm = gts.llama(nopre)
        for text, want in REPORTED:
            got = lm.tokenize(text.encode(), add_bos=True, special=True)
            if got != want:
                gt.die("Llama-3 without tokenizer.ggml.pre: llama.cpp gives %s for %r, the report %s" % (got, text, want))
        write(out / "tok_default_llama3.txt", lm, texts(gt.specials(l3)[:8], 32),
                  "Llama-3 vocabulary (ggml-vocab-llama-bpe.gguf) without tokenizer.ggml.pre")


if __name__ == "__main__":
    main()
