#!/usr/bin/env python3
"""Golden NFC forms from unicodedata2 (Unicode 15.1.0) for
tests/unit/test_unicode_nfc.c, the check of kvp_unicode_nfc.

Usage: gen_nfc.py [OUT_DIR]    (default tests/golden; run via scripts/ref/run)

nfc.txt: '#' comment lines, then one case per line,
    <hex of the UTF-8 text> TAB <hex of unicodedata2.normalize("NFC", text)>
in three parts:
  - every code point that NFC changes (singletons such as U+212B ANGSTROM
    SIGN, the composition exclusions such as U+0958, non-starter
    decompositions such as U+0344), alone: the test takes every code point
    not listed here to be its own NFC, so this list must be whole;
  - the NFD of every code point that has a canonical decomposition, and of
    every 97th Hangul syllable: what composition must rebuild (or not);
  - 2,000 random strings of combining marks of many classes, Hangul jamo
    (modern and archaic) and syllables, precomposed letters, singletons,
    exclusions, the starters that compose with starters (Kannada, Sinhala,
    Tamil, Myanmar, Chakma two-part vowels) and plain letters.
The NFC test data of the Unicode Consortium (NormalizationTest.txt) is not
at hand offline; this is the stand-in.
"""
import os
import random
import sys

try:
    import unicodedata2 as ucd
except ImportError:
    sys.exit("gen_nfc: no unicodedata2 module: run through scripts/ref/run (it installs unicodedata2==15.1.0)")

UNICODE_VERSION = "15.1.0"  # as scripts/gen-unicode-tables
S_BASE, S_COUNT = 0xAC00, 11172


def hexs(s):
    return s.encode("utf-8").hex()


def code_points():
    return (cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF)


def random_strings(n):
    rng = random.Random(1510)
    decomposable = [cp for cp in code_points() if ucd.decomposition(chr(cp)) and
                    not ucd.decomposition(chr(cp)).startswith("<")]
    marks = [cp for cp in code_points() if ucd.combining(chr(cp))]
    # a few marks of each of the busy classes, so that reordering is common
    common_marks = [0x300, 0x301, 0x302, 0x303, 0x308, 0x30A, 0x323, 0x327, 0x328, 0x31B, 0x334,
                    0x345, 0x5B0, 0x5B4, 0x5BC, 0x5C1, 0x64B, 0x650, 0x651, 0x93C, 0x94D, 0xE38,
                    0xF71, 0xF72, 0xF74, 0xF80, 0x1DCE, 0x20D0, 0x302A, 0x302E, 0x3099, 0x309A,
                    0x1D165, 0x1D16D]
    singletons = [cp for cp in decomposable if len(ucd.decomposition(chr(cp)).split()) == 1]
    excluded = [cp for cp in decomposable if ucd.normalize("NFC", chr(cp)) != chr(cp)]
    # second parts of pairs that are starters: composition without a mark
    starter_seconds = [0x0CC2, 0x0CD5, 0x0CD6, 0x0DCA, 0x0DCF, 0x0DDF, 0x0BBE, 0x0BD7, 0x0B3E,
                       0x0B56, 0x0B57, 0x102E, 0x11127, 0x1133E, 0x11357, 0x114B0, 0x114BA,
                       0x114BD, 0x115AF, 0x0D3E, 0x0D57, 0x09BE, 0x09D7, 0x1B35]
    starter_firsts = [0x0CC6, 0x0CCA, 0x0DD9, 0x0DDC, 0x0BC6, 0x0BC7, 0x0BD2, 0x0B47, 0x1025,
                      0x11131, 0x11132, 0x11347, 0x114B9, 0x115B8, 0x115B9, 0x0D46, 0x0D47,
                      0x09C7, 0x1B05, 0x1B07]
    jamo_l = list(range(0x1100, 0x1113)) + [0x1113, 0x115F]       # modern, then archaic
    jamo_v = list(range(0x1161, 0x1176)) + [0x1176, 0x11A3]
    jamo_t = list(range(0x11A8, 0x11C3)) + [0x11C3, 0x11FF]
    syllables = list(range(S_BASE, S_BASE + S_COUNT))
    letters = [ord(c) for c in "aeiouAEIOUcnsyzCNSYZ <=>"] + [0x3B1, 0x3C9, 0x415, 0x433, 0x3046, 0x30AB, 0x4E2D]
    pools = [(common_marks, 6), (marks, 3), (decomposable, 4), (singletons, 1), (excluded, 1),
             (starter_firsts, 1), (starter_seconds, 1), (jamo_l, 2), (jamo_v, 2), (jamo_t, 2),
             (syllables, 2), (letters, 5)]
    weights = [w for _, w in pools]
    out, seen = [], set()
    while len(out) < n:
        s = "".join(chr(rng.choice(rng.choices(pools, weights)[0][0])) for _ in range(rng.randint(1, 12)))
        if rng.random() < 0.3:  # a third decomposed first, so composition has work
            s = ucd.normalize("NFD", s)
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def main():
    if ucd.unidata_version != UNICODE_VERSION:
        sys.exit("gen_nfc: unicodedata2 is Unicode %s, need %s" % (ucd.unidata_version, UNICODE_VERSION))
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../../tests/golden")
    os.makedirs(out_dir, exist_ok=True)
    lines = []
    changed = [chr(cp) for cp in code_points() if ucd.normalize("NFC", chr(cp)) != chr(cp)]
    lines += ["%s\t%s" % (hexs(s), hexs(ucd.normalize("NFC", s))) for s in changed]
    nfds = [ucd.normalize("NFD", chr(cp)) for cp in code_points()
            if ucd.normalize("NFD", chr(cp)) != chr(cp) and not (0 <= cp - S_BASE < S_COUNT and (cp - S_BASE) % 97)]
    lines += ["%s\t%s" % (hexs(s), hexs(ucd.normalize("NFC", s))) for s in nfds]
    lines += ["%s\t%s" % (hexs(s), hexs(ucd.normalize("NFC", s))) for s in random_strings(2000)]
    path = os.path.join(out_dir, "nfc.txt")
    with open(path + ".tmp", "w") as f:
        f.write("# generated by scripts/ref/gen_nfc.py with unicodedata2 %s: %d code points that NFC changes, "
                "%d NFD forms, 2000 random strings\n" % (ucd.unidata_version, len(changed), len(nfds)))
        f.write("# <hex of the UTF-8 text> TAB <hex of its NFC>\n")
        f.write("\n".join(lines) + "\n")
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
