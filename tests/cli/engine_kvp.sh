# prefill and decode on KVP model files (what quantize writes) and on
# extended conversations (prefill --resume), with the real model when it is
# cached (scripts/fetch-model).
. "$KVP_TESTS/cli/lib.sh"

run prefill -m x.gguf --resume "$T/none.kvp" -f "$T/p.jsonl"
expect_status 2 "--resume with -f is a usage error"

need_model

# the same tensors as a KVP model file: the same text, the same fingerprint
run quantize "$M" -o "$T/keep.kvp"
expect_status 0 "quantize --to keep"
run decode -m "$M" -t $THREADS -p "The capital of France is" -n 12
expect_status 0 "decode on the GGUF"
cp "$OUT" "$T/gguf.txt"
run decode -m "$T/keep.kvp" -t $THREADS -p "The capital of France is" -n 12
expect_status 0 "decode on the KVP model file"
expect_out_file "$T/gguf.txt" "the same greedy text as the GGUF"

# re-quantized: still a sane answer; KV it makes is refused by the GGUF.
# (With SmolLM2's own default system message, which --chat now renders as
# its template does, the 8-bit re-quantizations answer in French, as
# llama.cpp's chat completion on the q8_0 GGUF does: a plain one here.)
for to in q8_0 int8 fp8 int4; do
    run quantize --to "$to" "$M" -o "$T/m-$to.kvp"
    expect_status 0 "quantize --to $to"
    run decode -m "$T/m-$to.kvp" -t $THREADS --chat --system "You are a helpful assistant." \
        -p "What is the capital of France?" -n 16
    expect_status 0 "decode on the $to KVP model"
    expect_out_has "Paris" "the $to model answers"
done
run_sh "'$KVP_BIN/prefill' -m '$T/m-q8_0.kvp' -t $THREADS -p hello -o '$T/q8.kv'"
expect_status 0 "prefill with the q8_0 KVP model"
run decode -m "$M" -t $THREADS "$T/q8.kv"
expect_status 1 "the GGUF refuses KV made by the q8_0 model"
expect_err_has "fingerprint" "says the fingerprints differ"
run decode -m "$T/m-q8_0.kvp" -t $THREADS -n 4 "$T/q8.kv"
expect_status 0 "the q8_0 model takes its own KV"
run decode -m "$T/q8.kv" -t $THREADS -p hi
expect_status 1 "a KV stream is not a model"
expect_err_has "not a model file" "says so"

# prefill --resume: one more turn equals the whole conversation at once
run decode -m "$M" -t $THREADS --chat -p "What is the capital of France?" -n 32 --kv-out "$T/turn1.kvp"
expect_status 0 "first turn with --kv-out"
answer=$(cat "$OUT")
run prefill -m "$M" -t $THREADS --resume "$T/turn1.kvp" --chat -p "And what is the capital of Germany?" -o "$T/turn2.kvp"
expect_status 0 "prefill --resume with the next turn"
run decode -m "$M" -t $THREADS -n 32 "$T/turn2.kvp"
expect_status 0 "decode the extended conversation"
cp "$OUT" "$T/resumed.txt"
printf '{"messages":[{"role":"user","content":"What is the capital of France?"},{"role":"assistant","content":"%s"},{"role":"user","content":"And what is the capital of Germany?"}]}\n' \
    "$answer" >"$T/conv.jsonl"
run decode -m "$M" -t $THREADS -n 32 -f "$T/conv.jsonl"
expect_status 0 "the whole conversation at once"
expect_out_file "$T/resumed.txt" "the resumed conversation answers as the whole one"
run_sh "'$KVP_BIN/kvdump' '$T/turn2.kvp' | sed -n 's/.* seq 0 tokens \([0-9]*\).*/\1/p'"
n_resumed=$(cat "$OUT")
run_sh "'$KVP_BIN/prefill' -m '$M' -t $THREADS -f '$T/conv.jsonl' | '$KVP_BIN/kvdump' - | sed -n 's/.* seq 0 tokens \([0-9]*\).*/\1/p'"
if [ -n "$n_resumed" ] && [ "$n_resumed" = "$(cat "$OUT")" ]; then
    pass "as many tokens in the cache ($n_resumed)"
else
    fail "resumed cache holds $n_resumed tokens, the whole conversation $(cat "$OUT")"
fi
# a run cut by its budget inside a character (SmolLM2's first token here
# is the first two bytes of a katakana): the character is held back, and
# the continuation of the saved stream writes it whole, so the two runs'
# texts are the uninterrupted run's (the bytes were lost, and the
# continuation began with a lone continuation byte)
jp="日本の首都は東京です。中国の首都は"
run decode -m "$M" -t $THREADS -p "$jp" -n 4
expect_status 0 "four tokens of a Japanese answer"
whole=$(tr -d '\n' <"$OUT")
for k in 1 2 3; do
    run decode -m "$M" -t $THREADS -p "$jp" -n $k --kv-out "$T/jp.kvp"
    first=$(tr -d '\n' <"$OUT")
    run decode -m "$M" -t $THREADS -n $((4 - k)) "$T/jp.kvp"
    expect_status 0 "continued after $k tokens"
    if [ "$first$(tr -d '\n' <"$OUT")" = "$whole" ]; then pass "cut after $k tokens: the two texts are the whole one"; else
        fail "cut after $k tokens: '$first' + '$(cat "$OUT")' is not '$whole'"; fi
done
run prefill -m "$M" -t $THREADS --resume "$T/turn1.kvp" --tokens 28,29 -o "$T/turn2b.kvp"
expect_status 0 "--resume with --tokens"
run prefill -m "$T/m-q8_0.kvp" -t $THREADS --resume "$T/turn1.kvp" -p more
expect_status 1 "--resume with another model's stream"
expect_err_one_line "one line of error"
done_testing
