#!/usr/bin/env python3
"""Golden token ids from HF `tokenizers` for a tokenizer.json whose
normalizer is NFC (Qwen2's, GPT-NeoX's), for tests/unit/test_tokenizer.c
and tests/cli/tokenize.sh.

Usage: gen_tokenizer_nfc.py [OUT_DIR]   (default tests/golden; run via scripts/ref/run)

HF normalizes the text between the added tokens it matches first (those
with normalized: false: every special token of Qwen2 and Llama-3), then
matches the added tokens with normalized: true in the normalized text, and
only then pre-tokenizes.  Three vocabularies:

  tok_nfc_tokenizer.json  a small byte-level tokenizer.json made here (no
                          one else's): the 256 byte tokens, a merge for each
                          pair of ASCII lowercase letters, for space + each
                          of them, and for the two bytes of each character
                          U+00C0..U+00FF and U+0300..U+036F (precomposed
                          letters and combining marks come out as one token
                          each); Qwen2's Split regex + ByteLevel; normalizer
                          a Sequence holding NFC; added tokens of each kind:
                          special and not, normalized: true and false (one,
                          "caf\\u00e9", a word NFC can make out of "cafe\\u0301")
  llama-bpe               Llama-3's vocabulary as gen_tokenizer.py builds it
                          (the cache's llama-bpe.tokenizer.json, not
                          committed) with Qwen2's Split regex and an NFC
                          normalizer: the reported case
  spm-*                   the Llama-2 SentencePiece vocabulary
                          (tok_llama_spm_vocab.bin) as gen_tokenizer.py
                          builds it, NFC in its Prepend + Replace normalizer,
                          or NFC alone before a Metaspace "first"

Strings: precomposed and decomposed Latin, Vietnamese (two marks, in either
order), marks out of canonical order, Hangul jamo and syllables, singletons
(U+212B, U+2126, U+212A), composition exclusions, added tokens next to
decomposed text, and the NFD form of each (unicodedata2 15.1.0, the version
of lib/base/unicode_tables.c), then gen_tokenizer.py's fixed strings.

Golden format: '#' comment lines; "# variant NAME ARG" starts a variant (ARG:
the tokenizer.json's file name, "-", or for spm-* the JSON of its
{"normalizer", "pre_tokenizer", "decoder"}); then one case a line:
    <hex of the UTF-8 text> TAB <ids of encode(text)>
(HF's defaults: added tokens recognised, BOS where the post-processor adds it).
"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gen_tokenizer as gt  # noqa: E402  (vocabularies, HF rebuilds, fixed strings)
import gen_tokenizer_metaspace as gtm  # noqa: E402  (the SentencePiece decoders)
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers  # noqa: E402

UNICODE_VERSION = "15.1.0"
try:
    import unicodedata2 as ucd  # noqa: E402
except ImportError:
    gt.die("no unicodedata2 module; run through scripts/ref/run, or $(scripts/ref/venv unicodedata2==%s)"
           % UNICODE_VERSION)

ROOT = HERE.parents[1]
MS = "\u2581"
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# (content, special, normalized) of the small vocabulary's added tokens
ADDED = [("<|endoftext|>", True, False), ("<|im_start|>", True, False), ("<n>", True, True),
         ("<t>", False, True), ("<u>", False, False), ("caf\u00e9", False, True)]

# What the review reported, on Llama-3's vocabulary with Qwen2's regex and NFC
# (ids after BOS).
REPORTED = [("cafe\u0301", [936, 59958]), ("e\u0301e\u0301", [978, 978]), ("\u1100\u1161", [20565])]

CASES = [
    "caf\u00e9", "cafe\u0301", "e\u0301e\u0301", "\u00e9\u00e9", "\u1100\u1161", "\u1100\u1161\u11a8",
    "\uac00\u11a8", "\ud55c\uad6d\uc5b4", "\u1112\u1161\u11ab\u1100\u116e\u11a8", "x\u1100\u1161y", "\u1161\u1100",
    "Vi\u1ec7t Nam", "Vie\u0323\u0302t Nam", "Vie\u0302\u0323t Nam", "Ti\u1ebfng Vi\u1ec7t", "ph\u1edf",
    "a\u0301\u0323", "a\u0323\u0301", "\u1ea1\u0301", "o\u0308\u0304", "\u022b", "A\u030a", "\u212b", "\u2126",
    "\u212a", "K\u212a", "\u0958", "\u0915\u093c", "\u2adc", "\u0301", " \u0301", "\u0301x", "e\u0301 e\u0301",
    "na\u0131\u0308ve", "nai\u0308ve", "\u1f00\u0345", "\u03b1\u0313\u0345", "\u00c5ngstr\u00f6m",
    "Zo\u00eb Sald\u00e3na", "fi\ufb01", "1\u0301", "'s\u0301", "e\u0301's", "x \u0301\u0301\u0301",
    "\u0301" * 40, "e" + "\u0316\u0301" * 10,
    # added tokens next to decomposed text
    "<|endoftext|>\u0301", "e<|endoftext|>\u0301", "cafe\u0301<|im_start|>user", "<|im_start|>e\u0301",
    "e\u0301<|endoftext|>e\u0301", "cafe\u0301 au lait", "un cafe\u0301!", "x<t>\u0338y", "x<u>\u0338y",
    "<t>e\u0301", "e\u0301<u>", "<n>\u0338", "a<n>b", "\u226e<t>", "<\u0338t>", "<|endoftext|>\u0338",
]


def byte_chars():
    """GPT-2's printable stand-in of each byte."""
    keep = lambda k: 33 <= k <= 126 or 161 <= k <= 172 or k >= 174
    out, n = [], 0
    for b in range(256):
        if keep(b):
            out.append(chr(b))
        else:
            out.append(chr(256 + n))
            n += 1
    return out


def small_tokenizer():
    bc = byte_chars()
    pairs = [(bc[ord(a)], bc[ord(b)]) for a in "abcdefghijklmnopqrstuvwxyz" for b in "abcdefghijklmnopqrstuvwxyz"]
    pairs += [(bc[32], bc[ord(a)]) for a in "abcdefghijklmnopqrstuvwxyz"]
    for cp in list(range(0xC0, 0x100)) + list(range(0x300, 0x370)):
        u = chr(cp).encode("utf-8")
        pairs.append((bc[u[0]], bc[u[1]]))
    vocab = {c: i for i, c in enumerate(bc)}
    for a, b in pairs:
        vocab.setdefault(a + b, len(vocab))
    tk = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
    tk.normalizer = normalizers.Sequence([normalizers.NFC()])
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    for content, special, norm in ADDED:
        tk.add_tokens([AddedToken(content, special=special, normalized=norm)])
    return tk


def llama_bpe_qwen2():
    l3 = gt.read_vocab(gt.vocab_dir() / "ggml-vocab-llama-bpe.gguf")
    j = json.loads(gt.hf_bytelevel(l3, "llama3").to_str())
    j["normalizer"] = {"type": "NFC"}
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = QWEN2_PATTERN
    # Qwen2's regex takes digits one at a time, and Qwen2's BPE has no ignore_merges
    j["model"]["ignore_merges"] = False
    return Tokenizer.from_str(json.dumps(j))


SPM_VARIANTS = [
    ("spm-prepend", {"type": "Sequence", "normalizers": [{"type": "NFC"}] + gtm.PREPEND_NORMALIZER["normalizers"]},
     None, gtm.STRIP_DECODER),
    ("spm-first", {"type": "NFC"}, gtm.metaspace("first", False), gtm.STRIP_DECODER),
]


def texts():
    out = CASES + [ucd.normalize("NFD", t) for t in CASES] + gt.FIXED
    return list(dict.fromkeys(t for t in out if "\x00" not in t))


def write_variant(f, name, arg, tk, cases):
    f.write("# variant %s %s\n" % (name, arg))
    for t in cases:
        f.write("%s\t%s\n" % (t.encode("utf-8").hex(), " ".join(map(str, tk.encode(t).ids))))


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "golden"
    out.mkdir(parents=True, exist_ok=True)
    if ucd.unidata_version != UNICODE_VERSION:
        gt.die("unicodedata2 is Unicode %s, need %s" % (ucd.unidata_version, UNICODE_VERSION))
    cases = texts()
    small = small_tokenizer()
    small.save(str(out / "tok_nfc_tokenizer.json"), pretty=False)
    l3 = llama_bpe_qwen2()
    for text, want in REPORTED:
        got = l3.encode(text).ids
        if got[1:] != want:
            gt.die("Llama-3 vocabulary, Qwen2 regex, NFC: %r gives %s, the report says HF gives %s" % (text, got, want))
    spm = gt.hf_spm(gt.read_vocab(ROOT / "tests" / "golden" / "tok_llama_spm_vocab.bin")).to_str()
    path = out / "tok_nfc.txt"
    with open(path, "w", encoding="ascii", newline="\n") as f:
        f.write("# generated by scripts/ref/gen_tokenizer_nfc.py with tokenizers %s and unicodedata2 %s: HF's ids "
                "under an NFC normalizer\n" % (gt.tokenizers.__version__, ucd.unidata_version))
        f.write("# <hex of the UTF-8 text> TAB <ids of encode(text)>\n")
        write_variant(f, "json", "tok_nfc_tokenizer.json", small, cases)
        write_variant(f, "llama-bpe", "-", l3, cases)
        for name, norm, pre, dec in SPM_VARIANTS:
            comp = {"normalizer": norm, "pre_tokenizer": pre, "decoder": dec}
            write_variant(f, name, json.dumps(comp, ensure_ascii=True, separators=(",", ":")),
                          gtm.variant_tokenizer(spm, norm, pre, dec), cases)
    print("gen_tokenizer_nfc: wrote %s (%d variants of %d cases) and tok_nfc_tokenizer.json"
          % (path, 2 + len(SPM_VARIANTS), len(cases)), file=sys.stderr)


if __name__ == "__main__":
    main()
