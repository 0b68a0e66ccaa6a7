# perplexity.sh - prefill --perplexity: usage errors always; on the real
# model, PPL against llama.cpp's and HF transformers' (the goldens of
# scripts/ref/gen_ppl*.py, on the GPL-3 text Debian carries), a saved base
# and KL divergence (0 for a model against itself; top-k against full rows),
# and the runtime errors: short and empty texts, a base from another text.
. "$KVP_TESTS/cli/lib.sh"

run prefill --perplexity x.txt
expect_status 2 "no model: a usage error"
run prefill -m x.gguf --kld base.kvp
expect_status 2 "--kld without --perplexity"
expect_err_has "go with --perplexity TEXT" "says what they go with"
run prefill -m x.gguf --perplexity x.txt --full
expect_status 2 "--full without --save-logits"
run prefill -m x.gguf --perplexity x.txt --stop x
expect_status 2 "--stop with --perplexity (nothing generated, it would be ignored)"
expect_err_has "--stop goes with a prefill job (its stream carries it), not --perplexity" "said so"
run prefill -m x.gguf --perplexity x.txt --save-logits b.kvp --kld b.kvp
expect_status 2 "--save-logits with --kld"
run prefill -m x.gguf --perplexity x.txt -p hello
expect_status 2 "a prompt with --perplexity"
run prefill -m x.gguf --perplexity x.txt --ctx 2
expect_status 2 "--ctx below 4"
run prefill -m x.gguf --perplexity x.txt --save-logits b.kvp --save-top 8 --full
expect_status 2 "--save-top with --full"

# ---- a model whose context is shorter than the default window of 512 ----
# (the unit tests' tiny GGUF, its vocabulary a-d, with a context of 16):
# the window is that context; 512 was taken, beyond it, as if given
"$KVP_UNIT_DIR/test_convert" --write-gguf "$T/ctx16.gguf" ctx || { status=1; fail "could not write the tiny GGUF"; }
printf 'abcdabcdbadcabcdacbdabcdddabcabdcabdcbadbcadbcabcda' >"$T/abcd.txt"
run prefill -m "$T/ctx16.gguf" -t $THREADS --perplexity "$T/abcd.txt" --json
expect_status 0 "a model with a context of 16 tokens, no --ctx"
expect_out_has '"ctx":16,"windows":3,"scored":21' "scores windows of 16 (7 positions each)"
run prefill -m "$T/ctx16.gguf" -t $THREADS --perplexity "$T/abcd.txt" --ctx 17
expect_status 1 "an explicit --ctx beyond that context"
expect_err_has "--ctx 17 is beyond $T/ctx16.gguf's context length of 16 tokens" "stays an error"
# a base of its 4-token vocabulary: the default top 32 (and any --save-top
# of 4 or more) is every token, saved as full rows; compared with itself,
# a KL divergence of 0
run prefill -m "$T/ctx16.gguf" -t $THREADS --perplexity "$T/abcd.txt" --save-logits "$T/b4.kvp"
expect_status 0 "--save-logits on a vocabulary of 4 (top 32 by default)"
expect_err_lacks "full rows" "no error asking for full rows"
run kvdump "$T/b4.kvp"
expect_out_has "ctx 16 first 8 windows 3 vocab 4 k full" "saved as full rows"
run prefill -m "$T/ctx16.gguf" -t $THREADS --perplexity "$T/abcd.txt" --save-logits "$T/b4k.kvp" --save-top 4
expect_status 0 "--save-top 4 on a vocabulary of 4"
run kvdump "$T/b4k.kvp"
expect_out_has "vocab 4 k full" "full rows too"
run prefill -m "$T/ctx16.gguf" -t $THREADS --perplexity "$T/abcd.txt" --save-logits "$T/b3.kvp" --save-top 3
expect_status 0 "--save-top 3 on a vocabulary of 4"
run kvdump "$T/b3.kvp"
expect_out_has "vocab 4 k 3" "the top 3 of 4"
run prefill -m "$T/ctx16.gguf" -t $THREADS --perplexity "$T/abcd.txt" --kld "$T/b4.kvp" --json
expect_status 0 "--kld against the full-row base"
expect_out_has '"kld":0,"kld_err":0,' "the model against itself: KLD 0"

need_model
P="prefill -m $M -t $THREADS"

# ---- runtime errors ----
: >"$T/empty.txt"
run $P --perplexity "$T/empty.txt"
expect_status 1 "an empty text"
expect_err_has "empty.txt: empty text" "names the file"
expect_err_one_line "one line"
printf 'Just a few words of text.\n' >"$T/short.txt"
run $P --perplexity "$T/short.txt"
expect_status 1 "a text shorter than one window"
expect_err_has "fewer than one window of 512 tokens" "says so"
run $P --perplexity "$T/missing.txt"
expect_status 1 "a missing text"
expect_err_has "missing.txt" "names it"
run $P --perplexity "$T/short.txt" --ctx 100000
expect_status 1 "--ctx beyond the model's context"
expect_err_has "context length" "says so"
run $P --perplexity "$M" --ctx 64 --chunks 1
expect_status 1 "a binary file as the text (the arguments swapped)"
expect_err_has "is NUL: a binary file, not a text to score" "says so"
# ... as soon as its first NUL is read: /dev/zero has no end (it read a
# gigabyte, 2 GB of memory, then said 'input exceeds 1073741824 bytes')
run $P --perplexity /dev/zero
expect_status 1 "/dev/zero as the text"
expect_err_has "/dev/zero: byte 0 is NUL: a binary file, not a text to score" "refused at its first byte"
run_sh "printf 'ab\\000cd' | $P --perplexity -"
expect_status 1 "a NUL through a pipe"
expect_err_has "-: byte 2 is NUL" "named at its offset"
# one window of 4 tokens scores one position: no spread, no uncertainty, no
# base a --kld could use (it printed +/- 0 and saved such a base)
printf 'The capital of France is Paris, and the capital of Spain is Madrid.' >"$T/one.txt"
run $P --perplexity "$T/one.txt" --ctx 4 --chunks 1 --save-logits "$T/one.base"
expect_status 1 "a run that would score one position: refused"
expect_err_has "scores 1 position: the uncertainty (and --kld) need at least 2" "says why"
expect_true "no base saved" test ! -e "$T/one.base"
run $P --perplexity "$T/one.txt" --ctx 4 --chunks 2
expect_status 0 "two windows of 4: two positions"
# a model that states no context length (the key renamed in a copy): decode
# takes it as unknown, and so does the window (0 refused every --ctx)
cp "$M" "$T/noctx.gguf"
at=$(grep -obUa 'llama.context_length' "$T/noctx.gguf" | head -n 1 | cut -d: -f1)
printf X | dd of="$T/noctx.gguf" bs=1 seek=$((at + 19)) conv=notrunc 2>/dev/null
run prefill -m "$T/noctx.gguf" -t $THREADS --perplexity "$T/one.txt" --ctx 8 --chunks 2
expect_status 0 "a model without a context length scores windows of --ctx"
expect_out_has "PPL" "prints the perplexity"
rm -f "$T/noctx.gguf"
printf 'hello \377 world and more words here' >"$T/latin1.txt"
run $P --perplexity "$T/latin1.txt" --ctx 4
expect_status 1 "a text that is not UTF-8 (its byte was dropped, the rest scored)"
expect_err_has "latin1.txt: invalid UTF-8 at byte offset 6 (0xff)" "names the file, the offset and the byte"

# ---- outputs that would replace an input, or share standard output ----
cp "$T/short.txt" "$T/keep.txt"
run $P --perplexity "$T/keep.txt" --ctx 4 --save-logits "$T/keep.txt"
expect_status 2 "--save-logits naming the text"
expect_err_has "is the text scored" "says so"
expect_true "the text is intact" cmp -s "$T/short.txt" "$T/keep.txt"
run $P --perplexity "$T/keep.txt" --ctx 4 --save-logits "$M"
expect_status 2 "--save-logits naming the model"
expect_err_has "is the model" "says so"
run $P --perplexity "$T/keep.txt" --ctx 4 --save-logits -
expect_status 2 "--save-logits - (the report is on standard output)"
run $P --perplexity "$T/keep.txt" --ctx 4 -o "$T/ppl.kvp"
expect_status 2 "-o with --perplexity (it would be ignored)"
run $P -p hi -o "$M"
expect_status 2 "prefill -o naming the model"
expect_err_has "-o $M is the model" "says so"
run decode -m "$M" -t 1 -p hi -n 1 --kv-out "$M"
expect_status 2 "decode --kv-out naming the model"
run decode -m "$M" -t 1 -p hi -n 1 --stats="$M"
expect_status 2 "decode --stats naming the model"
expect_true "the model is intact" test -s "$M"
# prefill --stats=FILE: the job's summary as JSON into FILE, not stderr
run $P -p hi -o "$T/hi.kvp" --stats="$T/pf.json"
expect_status 0 "prefill --stats=FILE"
expect_true "the summary in FILE" grep -q '^{"sequences":1,"prompt_tokens":[0-9]*,"computed_tokens":' "$T/pf.json"
expect_err_lacks "prefill: sequence" "no per-sequence line on stderr"

# ---- a text of our own: saved bases and KL divergence ----
# Windows of 64 tokens keep this quick; the man page is a text the tree has.
TXT="$KVP_TESTS/../man/prefill.1"
run $P --perplexity "$TXT" --ctx 64 --chunks 3 --json
expect_status 0 "perplexity of a man page"
expect_out_has '"ctx":64,"windows":3,"scored":93' "3 windows of 64 score 31 positions each"
ppl=$(sed 's/.*"ppl":\([0-9.]*\).*/\1/' "$OUT")
expect_true "a PPL above 1 and finite ($ppl)" awk -v p="$ppl" 'BEGIN { exit !(p > 1 && p < 1000) }'

run $P --perplexity "$TXT" --ctx 64 --chunks 3 --save-logits "$T/base.kvp"
expect_status 0 "--save-logits (top 32)"
expect_out_has "PPL      " "prints the PPL too"
expect_true "the base file exists" test -s "$T/base.kvp"
run kvdump "$T/base.kvp"
expect_status 0 "kvdump reads the base"
expect_out_has "scores" "it has the scores record"

run $P --perplexity "$TXT" --ctx 64 --chunks 3 --kld "$T/base.kvp" --json
expect_status 0 "--kld: the model against itself"
expect_out_has '"kld":0,"kld_err":0,"kld_max":0' "KL divergence exactly 0"
expect_out_has '"ppl_ratio":1.000000,"ppl_ratio_err":0.000000' "PPL ratio exactly 1"
expect_out_has '"same_top":1.000000' "the same top token everywhere"
expect_out_has '"dp_rms":0,' "no change in any probability"
run $P --perplexity "$TXT" --ctx 64 --chunks 3 --kld "$T/base.kvp"
expect_status 0 "--kld text report"
expect_out_has "====== KL divergence statistics ======" "llama.cpp's KLD block"
expect_out_has "Mean    KLD:   0.000000" "its mean line"
expect_out_has "Same top p: 100.000" "its top-token line"
# a base damaged past the windows compared is refused too (read to its end)
head -c "$(($(wc -c <"$T/base.kvp") - 100))" "$T/base.kvp" >"$T/cut-base.kvp"
run $P --perplexity "$TXT" --ctx 64 --chunks 1 --kld "$T/cut-base.kvp"
expect_status 1 "--kld on a base cut in a window past those compared"
expect_err_has "cut-base.kvp" "names it"

# a quantized KV cache moves the distribution a little, not a lot
run $P --perplexity "$TXT" --ctx 64 --chunks 3 --kld "$T/base.kvp" --kv-dtype fp8 --json
expect_status 0 "--kld with an fp8 KV cache"
kld=$(sed 's/.*"kld":\([-0-9.e]*\),.*/\1/' "$OUT")
expect_true "fp8 KV: 0 < mean KLD ($kld) < 0.05" awk -v k="$kld" 'BEGIN { exit !(k > 0 && k < 0.05) }'

# top-k against full rows: lumping the tokens outside the top k into one
# outcome gives a lower bound of the full KLD (the log-sum inequality); the
# gap is the tail's own divergence times its mass, so it shrinks as k grows.
# On this high-entropy text (PPL ~60, 64-token windows) k=32 gave 72% of the
# full value and k=1024 95%: the bounds below are the man page's.
run $P --perplexity "$TXT" --ctx 64 --chunks 3 --save-logits "$T/full.kvp" --full
expect_status 0 "--save-logits --full"
run $P --perplexity "$TXT" --ctx 64 --chunks 3 --kld "$T/full.kvp" --kv-dtype fp8 --json
expect_status 0 "--kld against full rows"
kfull=$(sed 's/.*"kld":\([-0-9.e]*\),.*/\1/' "$OUT")
run $P --perplexity "$TXT" --ctx 64 --chunks 3 --save-logits "$T/k1024.kvp" --save-top 1024
expect_status 0 "--save-top 1024"
run $P --perplexity "$TXT" --ctx 64 --chunks 3 --kld "$T/k1024.kvp" --kv-dtype fp8 --json
k1024=$(sed 's/.*"kld":\([-0-9.e]*\),.*/\1/' "$OUT")
expect_true "top-32 KLD ($kld) <= top-1024 ($k1024) <= full ($kfull)" \
    awk -v a="$kld" -v b="$k1024" -v c="$kfull" 'BEGIN { exit !(a <= b && b <= c + 1e-9) }'
expect_true "top-32 KLD at least 60% of the full one" awk -v a="$kld" -v b="$kfull" 'BEGIN { exit !(a >= 0.6 * b) }'
expect_true "top-1024 KLD at least 90% of the full one" awk -v a="$k1024" -v b="$kfull" 'BEGIN { exit !(a >= 0.9 * b) }'

# ---- bad bases ----
run $P --perplexity "$TXT" --ctx 64 --chunks 4 --kld "$T/base.kvp"
expect_status 1 "more windows than the base holds"
expect_err_has "holds 3 windows; this run scores 4" "says how many"
run $P --perplexity "$TXT" --ctx 32 --chunks 3 --kld "$T/base.kvp"
expect_status 1 "other windows than the base's"
expect_err_has "windows of 64 tokens" "names the base's"
head -c 3000 "$TXT" >"$T/other.txt"
printf 'and then something else entirely, to make the text differ.\n' >>"$T/other.txt"
run $P --perplexity "$T/other.txt" --ctx 64 --chunks 3 --kld "$T/base.kvp"
expect_status 1 "a base from another text"
expect_err_has "made from other tokens" "says so"
expect_err_has "hash " "names the hashes"
expect_err_one_line "one line"
head -c 5000 "$T/base.kvp" >"$T/cut.kvp"
run $P --perplexity "$TXT" --ctx 64 --chunks 3 --kld "$T/cut.kvp"
expect_status 1 "a cut base"
expect_err_has "cut.kvp" "names the file"
run $P --perplexity "$TXT" --ctx 64 --kld "$T/missing.kvp"
expect_status 1 "a missing base"
run prefill -m "$M" -p hi -o "$T/kv.kvp"
run $P --perplexity "$TXT" --ctx 64 --kld "$T/kv.kvp"
expect_status 1 "a KV stream is not a base"
expect_err_has "kv.kvp" "names it"

# ---- quantize --eval: the source and the output scored on one text ----
run quantize --to q8_0 "$M" -o "$T/q8.kvp" --eval "$TXT" --eval-chunks 2 -r "$T/r.tsv" --threads $THREADS
expect_status 0 "quantize --eval"
expect_err_has "PPL " "one line of PPL and KLD on stderr"
expect_err_has "same top token" "with the top-token agreement"
expect_true "the report has the eval header" grep -q "^eval	tokens	ctx	windows	scored	source_ppl" "$T/r.tsv"
expect_true "and its row, 2 windows of 512 (510 scored)" grep -q "^$TXT	[0-9]*	512	2	510	" "$T/r.tsv"
kld=$(awk -F'	' '$1 == "eval" { for (i = 1; i <= NF; i++) if ($i == "kld") c = i } c && $1 == "'"$TXT"'" { print $c }' "$T/r.tsv")
expect_true "q8_0 from Q4_1: a small mean KLD ($kld)" awk -v k="$kld" 'BEGIN { exit !(k > 0 && k < 0.01) }'
run quantize --to q8_0 "$M" -o "$T/q8.kvp" -f --eval "$TXT" --eval-chunks 1 -r - --json --threads $THREADS
expect_status 0 "quantize --eval --json"
expect_out_has '{"eval":true,"text":"' "an eval object after the summary"
run quantize --to q8_0 "$M" -o - --eval "$TXT"
expect_status 2 "--eval with the model on standard output"
run quantize --to q8_0 "$M" -o "$T/x.kvp" --eval-chunks 2
expect_status 2 "--eval-chunks without --eval"
run quantize --to q8_0 "$M" -o "$T/q8s.kvp" --eval "$T/short.txt" -r "$T/rs.tsv"
expect_status 1 "--eval on a text shorter than a window"
expect_err_has "--eval: " "says it was the evaluation"
expect_true "the report is not left half written" test ! -e "$T/rs.tsv"
expect_true "nor the model: the text is scored before the rename" test ! -e "$T/q8s.kvp"
cp "$TXT" "$T/evtext.txt"
run quantize --to q8_0 "$M" -o "$T/q8t.kvp" --eval "$T/evtext.txt" --eval-chunks 1 -r "$T/evtext.txt"
expect_status 2 "--report naming the text --eval scores"
expect_err_has "is the text scored" "says so"
run quantize --to q8_0 "$M" -o "$T/evtext.txt" -f --eval "$T/evtext.txt" --eval-chunks 1
expect_status 2 "-o naming it, --force or not"
expect_true "the text is intact (the report, then the model, replaced it)" cmp -s "$TXT" "$T/evtext.txt"
expect_true "and no model was written" test ! -e "$T/q8t.kvp"
echo "the earlier model" >"$T/q8old.kvp"
run quantize --to q8_0 "$M" -o "$T/q8old.kvp" -f --eval "$T/missing.txt"
expect_status 1 "--eval on a missing text"
expect_err_has "missing.txt" "names the text"
expect_true "an earlier output stays as it was" grep -qx "the earlier model" "$T/q8old.kvp"
expect_true "and no temporary file is left" sh -c "! ls '$T'/q8old.kvp.tmp.* 2>/dev/null | grep -q ."

# a model whose context (256, in a copy) is shorter than the window of 512:
# the KV pool was sized for 256 tokens and windows of 512 run in it
cp "$M" "$T/ctx256.gguf"
at=$(grep -obUa 'llama.context_length' "$T/ctx256.gguf" | head -n 1 | cut -d: -f1)
printf '\000\001\000\000' | dd of="$T/ctx256.gguf" bs=1 seek=$((at + 24)) conv=notrunc 2>/dev/null
run quantize --to q8_0 "$T/ctx256.gguf" -o "$T/q8c.kvp" --eval "$TXT" --eval-chunks 1 -r "$T/rc.tsv" --threads $THREADS
expect_status 0 "quantize --eval on a model with a context of 256 tokens"
expect_true "scores one window of 256 (127 positions)" grep -q "^$TXT	[0-9]*	256	1	127	" "$T/rc.tsv"
rm -f "$T/ctx256.gguf" "$T/q8c.kvp"

# ---- the references, on the GPL-3 text ----
GPL=/usr/share/common-licenses/GPL-3
G="$KVP_TESTS/golden/ppl_smollm2.txt"
if [ ! -f "$GPL" ]; then
    echo "note: $GPL absent; skipping the comparison with the references"
    done_testing
    exit $?
fi
# The golden's PPL over its first N windows, from its per-window sums.
golden_ppl() { # FILE N
    awk -v n="$2" '$1 == "window" && $2 < n { s += $3; c += $4 } END { printf "%.6f\n", exp(s / c) }' "$1"
}
# The golden's NLL sum over its first N windows.
golden_nll() { # FILE N
    awk -v n="$2" '$1 == "window" && $2 < n { s += $3 } END { printf "%.6f\n", s }' "$1"
}
same_top() { sed 's/.*"same_top":\([0-9.]*\).*/\1/' "$OUT"; }
ours_ppl() { # from the JSON in $OUT: exp(nll sum / scored)
    awk -v s="$(sed 's/.*"nll":\([0-9.]*\).*/\1/' "$OUT")" -v n="$(sed 's/.*"scored":\([0-9]*\).*/\1/' "$OUT")" \
        'BEGIN { printf "%.6f\n", exp(s / n) }'
}
run $P --perplexity "$GPL" --chunks 3 --json
expect_status 0 "perplexity of GPL-3, 3 windows of 512"
tokens=$(awk '$1 == "tokens" { print $2 " " $3 }' "$G")
expect_out_has "\"tokens\":${tokens% *},\"tokens_hash\":\"${tokens#* }\"" \
    "the same tokens as llama.cpp's tokenizer ($tokens)"
want=$(golden_ppl "$G" 3)
got=$(ours_ppl)
expect_true "PPL $got within 1% of llama.cpp's $want (3 windows, Q4_1)" \
    awk -v a="$got" -v b="$want" 'BEGIN { d = a / b - 1; exit !(d < 0.01 && d > -0.01) }'

# f32 weights (the Q4_1 ones, dequantized by our quantize), f32 token
# embeddings (the file's are q8_0, widened by --to f32's default; SmolLM2's
# output head is the same tensor: kept as q8_0 with --embed keep, it took
# 8-bit activations and moved each window's NLL sum by up to 1.1 nats) and
# an f32 KV cache, against HF transformers in
# fp32 on the same weights: only summation order is left.  The two windows'
# NLL sums agree within 1e-4 nats on Zen 4 (all 14 within 2e-4 each);
# 2e-3 leaves room for another CPU's kernels.
G="$KVP_TESTS/golden/ppl_smollm2_hf.txt"
run quantize --to f32 "$M" -o "$T/f32.kvp"
expect_status 0 "quantize --to f32 (the embeddings too)"
run prefill -m "$T/f32.kvp" -t $THREADS --perplexity "$GPL" --chunks 2 --kv-dtype f32 --json \
    --save-logits "$T/f32kv.kvp"
expect_status 0 "perplexity with f32 weights, embeddings and KV, 2 windows"
tokens=$(awk '$1 == "tokens" { print $2 " " $3 }' "$G")
expect_out_has "\"tokens\":${tokens% *},\"tokens_hash\":\"${tokens#* }\"" "the same tokens as HF's tokenizer"
want=$(golden_nll "$G" 2)
got=$(sed 's/.*"nll":\([0-9.]*\).*/\1/' "$OUT")
expect_true "NLL sum $got within 2e-3 nats of HF transformers' $want (fp32, 2 windows)" \
    awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; exit !(d < 0.002 && d > -0.002) }'

# The scaled KV caches against transformers with every key and value row
# rounded the way they store it (scripts/ref/hf_kvround.py): the layer-0
# codes of a prompt are the same bytes as transformers' (checked with
# torch), but a rounding that another summation order flips in an early
# layer moves every later one, so two right implementations differ by
# chance: moving transformers' embeddings by 1e-6 moved its fp8 NLL sum
# over these two windows within 1478.5..1480.8 (int8 1465.1..1467.1).  We
# read 1481.21 and 1464.02 on Zen 4 against its 1480.46 and 1465.45; the
# fp8 cache costs +15.3 nats over the f32 one, so 5 nats still catches a
# cache that rounds worse than the format.  The same top token as the f32
# cache's: fp8 93.5% here against transformers' 92.9%, int8 98.2 / 97.3%.
for kv in fp8 int8; do
    G="$KVP_TESTS/golden/ppl_smollm2_hf_kv$kv.txt"
    run prefill -m "$T/f32.kvp" -t $THREADS --perplexity "$GPL" --chunks 2 --kv-dtype $kv --kld "$T/f32kv.kvp" --json
    expect_status 0 "--kv-dtype $kv against the f32 cache"
    want=$(golden_nll "$G" 2)
    got=$(sed 's/.*"nll":\([0-9.]*\).*/\1/' "$OUT")
    expect_true "$kv KV: NLL sum $got within 5 nats of transformers' $want with the same rounding (2 windows)" \
        awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; exit !(d < 5 && d > -5) }'
    want=$(awk '$1 == "top1" && $2 < 2 { s += $3; c += $4 } END { printf "%.6f\n", s / c }' "$G")
    got=$(same_top)
    expect_true "$kv KV: the f32 cache's top token at $got of the positions, transformers' at $want (within 0.03)" \
        awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; exit !(d < 0.03 && d > -0.03) }'
done

# The scaled KV caches against an f16 one on those f32 weights, where
# nothing else rounds (the Q4_1 file in place quantizes each matmul's
# activations to 8 bits, and there even an f32 cache flips near ties:
# tests/unit/test_kvquant.c).  On all 14 windows (Zen 4): the same top token
# at 99.92% (f32), 99.61% (bf16), 98.32% (int8) and 93.78% (fp8: E4M3's three
# mantissa bits); here two windows: int8 98.2%, fp8 93.5%.
run prefill -m "$T/f32.kvp" -t $THREADS --perplexity "$GPL" --chunks 2 --save-logits "$T/f16kv.kvp"
expect_status 0 "an f16 cache's distributions as the base"
for c in int8:0.97 fp8:0.91 bf16:0.99; do
    run prefill -m "$T/f32.kvp" -t $THREADS --perplexity "$GPL" --chunks 2 --kv-dtype "${c%:*}" --kld "$T/f16kv.kvp" --json
    expect_status 0 "--kv-dtype ${c%:*} against the f16 cache"
    got=$(same_top)
    expect_true "${c%:*} KV: the f16 cache's top token at $got of the positions (at least ${c#*:})" \
        awk -v a="$got" -v b="${c#*:}" 'BEGIN { exit !(a >= b) }'
done
rm -f "$T/f32.kvp" "$T/f16kv.kvp" "$T/f32kv.kvp"

# f16 and bf16 weights (quantize --to f16|bf16: the Q4_1 values and the
# embeddings rounded) against transformers computing in fp32 on the same
# weights rounded by torch (ppl_smollm2_hf_f16.txt, _bf16.txt): the f16 and
# bf16 kernels against a reference.  Two windows on Zen 4: f16 1465.19725
# against 1465.19716, bf16 1465.29041 against 1465.29040.
for dt in f16 bf16; do
    G="$KVP_TESTS/golden/ppl_smollm2_hf_$dt.txt"
    run quantize --to $dt "$M" -o "$T/$dt.kvp"
    expect_status 0 "quantize --to $dt"
    run prefill -m "$T/$dt.kvp" -t $THREADS --perplexity "$GPL" --chunks 2 --kv-dtype f32 --json
    expect_status 0 "perplexity with $dt weights, an f32 KV cache, 2 windows"
    want=$(golden_nll "$G" 2)
    got=$(sed 's/.*"nll":\([0-9.]*\).*/\1/' "$OUT")
    expect_true "NLL sum $got within 2e-3 nats of transformers' $want on $dt weights (2 windows)" \
        awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; exit !(d < 0.002 && d > -0.002) }'
    rm -f "$T/$dt.kvp"
done

done_testing
