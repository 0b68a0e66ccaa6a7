# prefill and decode on the real model (SmolLM2-135M-Instruct Q4_1): usage
# errors always; generation, pipes, batches, shared prefixes, KV round trips
# and the runtime errors when the model is cached (scripts/fetch-model).
. "$KVP_TESTS/cli/lib.sh"

run decode
expect_status 2 "decode without a model is a usage error"
expect_err_has "no model" "names what is missing"
run prefill -m x.gguf
expect_status 2 "prefill without prompts is a usage error"
run decode --temperature -1 -m x.gguf -p hi
expect_status 2 "a bad sampling value is a usage error"
run decode --help
expect_status 0 "--help"
expect_out_has "Usage: decode" "--help prints the usage"
run prefill --version
expect_status 0 "--version"
run decode -m "$T/missing.gguf" -p hi
expect_status 1 "a missing model is a runtime error"
expect_err_one_line "one line of error"
run decode --backend tpu -m x.gguf -p hi
expect_status 2 "an unknown --backend is a usage error"
expect_err_has "use cpu or cuda" "the usage error names the backends"

need_model

run decode -m "$M" -t $THREADS -p "The capital of France is" -n 8
expect_status 0 "greedy decode of a plain prompt"
expect_out_has " Paris." "the right answer"
expect_err_empty "no stderr"
cp "$OUT" "$T/direct.txt"

# a file whose block_count says fewer layers than its tensors hold (30 ->
# 29 in a copy): refused, naming the first stray tensor, not run as the
# first 29 layers of another model
cp "$M" "$T/bc.gguf"
at=$(grep -obUa 'llama.block_count' "$T/bc.gguf" | head -n 1 | cut -d: -f1)
printf '\035' | dd of="$T/bc.gguf" bs=1 seek=$((at + 17 + 4)) conv=notrunc 2>/dev/null
run decode -m "$T/bc.gguf" -t $THREADS -p hi -n 2
expect_status 1 "a model with tensors past its block_count is refused"
expect_err_has "tensor blk.29.attn_norm.weight belongs to layer 29, but the model has 29 layers" "names the tensor"
rm -f "$T/bc.gguf"

run decode -m "$M" -t $THREADS --backend cpu -p "The capital of France is" -n 8
expect_status 0 "--backend cpu"
expect_out_file "$T/direct.txt" "--backend cpu is the default backend"
if ! nvidia-smi -L >/dev/null 2>&1; then
    # no GPU here: -g fails at start, saying why (no CUDA in this build, or no device)
    run decode -m "$M" -t $THREADS -g -p "The capital of France is" -n 8
    expect_status 1 "-g without a GPU is a runtime error"
    expect_err_has "cuda" "the error names the CUDA backend"
    expect_err_one_line "one line of error"
    expect_out_empty "nothing generated"
fi
# KVP_CUDA_PIPELINE, _MMA, _SPLITK, _MMA_K64, _ARGMAX and _PROFILE are checked before any device is looked for
run_sh "KVP_CUDA_PIPELINE=yes decode -m '$M' -t $THREADS -g -p 'The capital of France is' -n 8"
expect_status 1 "KVP_CUDA_PIPELINE=yes is refused"
expect_out_empty "nothing generated"
if grep -qF "no CUDA backend" "$ERR"; then
    echo "# this build has no CUDA backend: the message of KVP_CUDA_PIPELINE=yes not checked"
else
    expect_err_has "KVP_CUDA_PIPELINE=yes: 1 (the default) or 0" "naming the variable and its values"
    run_sh "KVP_CUDA_MMA=2 decode -m '$M' -t $THREADS -g -p 'The capital of France is' -n 8"
    expect_status 1 "KVP_CUDA_MMA=2 is refused"
    expect_err_has "KVP_CUDA_MMA=2: 1 (the default) or 0" "naming the variable and its values"
    run_sh "KVP_CUDA_SPLITK=off decode -m '$M' -t $THREADS -g -p 'The capital of France is' -n 8"
    expect_status 1 "KVP_CUDA_SPLITK=off is refused"
    expect_err_has "KVP_CUDA_SPLITK=off: 1 (the default) or 0" "naming the variable and its default"
    run_sh "KVP_CUDA_MMA_K64=32 decode -m '$M' -t $THREADS -g -p 'The capital of France is' -n 8"
    expect_status 1 "KVP_CUDA_MMA_K64=32 is refused"
    expect_err_has "KVP_CUDA_MMA_K64=32: 1 (the default) or 0" "naming the variable and its default"
    run_sh "KVP_CUDA_ARGMAX=on decode -m '$M' -t $THREADS -g -p 'The capital of France is' -n 8"
    expect_status 1 "KVP_CUDA_ARGMAX=on is refused"
    expect_err_has "KVP_CUDA_ARGMAX=on: 1 (the default) or 0" "naming the variable and its default"
    run_sh "KVP_CUDA_PROFILE=yes decode -m '$M' -t $THREADS -g -p 'The capital of France is' -n 8"
    expect_status 1 "KVP_CUDA_PROFILE=yes is refused"
    expect_err_has "KVP_CUDA_PROFILE=yes: 0 (the default) or 1" "naming the variable and its default"
fi

run_sh "cat '$M' | decode -m /dev/stdin -t $THREADS -p 'The capital of France is' -n 8"
expect_status 0 "a model through a pipe (opened by name, as <(cat m) is)"
expect_out_file "$T/direct.txt" "gives what the file gives: the format check keeps the magic for the reader"
run_sh "cat '$M' | decode -m - -t $THREADS -p 'The capital of France is' -n 8"
expect_status 0 "-m -: the model from standard input"
expect_out_file "$T/direct.txt" "gives what the file gives"
# the model takes standard input to its end: nothing else can come from it
run_sh "cat '$M' | decode -m - -t $THREADS -f - -n 8"
expect_status 2 "-m - with -f -: a usage error"
expect_err_has "the prompts cannot be" "says why"
run_sh "cat '$M' | decode -m - -t $THREADS -n 8"
expect_status 2 "-m - with a KV stream from standard input: a usage error"
expect_err_has "the KV stream cannot be" "says why"

run decode -m "$M" -t $THREADS --chat -p "What is the capital of France?" -n 40
expect_status 0 "--chat"
expect_out_has "Paris" "a chat answer"

run_sh "prefill -m '$M' -t $THREADS -p 'The capital of France is' -n 8 | decode -m '$M' -t $THREADS"
expect_status 0 "prefill | decode"
expect_out_file "$T/direct.txt" "prefill | decode gives what one decode gives"

cat >"$T/p.jsonl" <<'J'
{"id":"a","prompt":"The capital of France is"}
{"id":"b","messages":[{"role":"user","content":"Name a fruit."}]}

{"id":"c","prompt":"The capital of France is"}
J
run decode -m "$M" -t $THREADS -f "$T/p.jsonl" -n 32
expect_status 0 "a batch from JSON Lines"
for id in a b c; do
    if [ "$(grep -c "\"id\":\"$id\"" "$OUT")" = 1 ]; then pass "one line for $id"; else fail "one line for $id"; fi
done
# Sequences that run alone compute the same way: equal prompts, equal text.
run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 32 --max-num-seqs 1
a=$(grep '"id":"a"' "$OUT" | sed 's/"ttft_ms.*//')
c=$(grep '"id":"c"' "$OUT" | sed 's/"ttft_ms.*//; s/"id":"c"/"id":"a"/')
if [ -n "$a" ] && [ "$a" = "$c" ]; then pass "equal prompts give equal text"; else fail "a/c differ"; fi
expect_out_has '"text":" Paris.' "batched sequence matches the one alone"
expect_out_has '"finish_reason":"stop"' "chat message stops at its end token"

run prefill -m "$M" -t $THREADS -f "$T/p.jsonl" --stats -o "$T/kv.kvp"
expect_status 0 "prefill to a file with --stats"
expect_err_has "1 shared by reference" "the shared prompt block is written once"
run kvdump --check "$T/kv.kvp"
expect_status 0 "kvdump accepts prefill's stream"

# a long shared prefix is computed once
long="Once upon a time, in a land far away, there lived a king who had three daughters. The youngest was the kindest of them all, and every morning she walked to the river to"
printf '{"id":"x","prompt":"%s sing."}\n{"id":"y","prompt":"%s swim."}\n' "$long" "$long" >"$T/shared.jsonl"
run prefill -m "$M" -t $THREADS -f "$T/shared.jsonl" --stats -o "$T/shared.kvp"
expect_status 0 "prefill of two prompts with a common start"
n1=$(sed -n 's/.*sequence 0 x: \([0-9]*\) prompt tokens (\([0-9]*\) computed).*/\2/p' "$ERR")
n2=$(sed -n 's/.*sequence 1 y: \([0-9]*\) prompt tokens (\([0-9]*\) computed).*/\2/p' "$ERR")
t2=$(sed -n 's/.*sequence 1 y: \([0-9]*\) prompt tokens.*/\1/p' "$ERR")
if [ -n "$n2" ] && [ "$n2" -lt 16 ] && [ "$n1" = "$t2" ]; then
    pass "the second prompt computes only its tail ($n2 of $t2 tokens)"
else
    fail "shared prefix computed again ($n1, $n2 of $t2)"
fi

# KV round trip: --kv-out then resume continues where it stopped
run decode -m "$M" -t $THREADS -p "The capital of France is" -n 4 --kv-out "$T/state.kvp"
expect_status 0 "--kv-out"
head -c -1 "$OUT" >"$T/joined.txt" # the newline decode ends its text with
run decode -m "$M" -t $THREADS -n 4 "$T/state.kvp"
expect_status 0 "resume from --kv-out"
head -c -1 "$OUT" >>"$T/joined.txt"
run decode -m "$M" -t $THREADS -p "The capital of France is" -n 8
head -c -1 "$OUT" >"$T/once.txt"
if cmp -s "$T/joined.txt" "$T/once.txt"; then pass "4 + 4 resumed tokens equal 8 at once"; else fail "resume differs: '$(cat "$T/joined.txt")'"; fi

# runtime errors
printf '{"id":1,"prompt":"ok"}\n{"id":2,"prompt":}\n' >"$T/bad.jsonl"
run decode -m "$M" -t $THREADS -f "$T/bad.jsonl"
expect_status 1 "a malformed prompts file"
expect_err_has "bad.jsonl:2" "the error names the file and line"
long_id=$(printf 'i%.0s' $(seq 1 256))
printf '{"id":"a","prompt":"ok"}\n{"id":"%s","prompt":"ok"}\n' "$long_id" >"$T/longid.jsonl"
run prefill -m "$M" -t $THREADS -f "$T/longid.jsonl" -o "$T/longid.kvp"
expect_status 1 "a prompt id past 255 bytes is refused, not cut"
expect_err_has 'longid.jsonl:2: "id" is 256 bytes, longer than 255' "the error names the line and the limit"
expect_err_one_line "in one line"
run decode -m "$M" -t $THREADS --kv-blocks 1 --block-size 4 -p "The capital of France is a city"
expect_status 1 "exhausted KV memory"
expect_err_has "out of blocks" "says what ran out"
run decode -m "$M" -t $THREADS --kv-dtype bf16 "$T/kv.kvp"
expect_status 1 "a stream of another KV dtype"
expect_err_has "a KV block of dtype f16, where this run's cache is bf16" "names both dtypes"
# fp8 and int8 KV caches: prefill writes them, decode takes the dtype from the
# stream, `quantize --kv` output (a scale a head) decodes too, and the same
# --kv-mem holds 1.9 times the blocks of f16 (tests/unit/test_kvquant.c
# checks the numbers)
for kd in fp8 int8; do
    run prefill -m "$M" -t $THREADS --kv-dtype $kd -p "The capital of France is" -o "$T/kv_$kd.kvp"
    expect_status 0 "prefill --kv-dtype $kd"
    run kvdump "$T/kv_$kd.kvp"
    case $kd in fp8) want=fp8_e4m3 ;; *) want=i8 ;; esac
    expect_out_has "$want" "kvdump shows $want blocks"
    run decode -m "$M" -t $THREADS -n 8 --temperature 0 "$T/kv_$kd.kvp"
    expect_status 0 "decode on a $kd stream, dtype from the stream"
    expect_true "decode on a $kd stream writes text" test -s "$OUT"
    run decode -m "$M" -t $THREADS -n 8 --kv-dtype f16 "$T/kv_$kd.kvp"
    expect_status 1 "an f16 run refuses a $kd stream"
    expect_err_has "record 1: a KV block of dtype $want, where this run's cache is f16" "names the record and both dtypes"
    run decode -m "$M" -t $THREADS -n 1 --kv-dtype $kd --kv-mem 4MiB --stats="$T/st_$kd.json" -p hi
    expect_status 0 "decode --kv-dtype $kd --stats"
done
run decode -m "$M" -t $THREADS -n 1 --kv-mem 4MiB --stats="$T/st_f16.json" -p hi
blocks() { sed 's/.*"kv_blocks":\([0-9]*\).*/\1/' "$1"; }
# 64 one-byte elements and a 4-byte scale a head row against 128 bytes: 1.88x
expect_true "fp8 holds 1.9 times the blocks of f16 in the same --kv-mem" \
    test $(($(blocks "$T/st_fp8.json") * 100 / $(blocks "$T/st_f16.json"))) -ge 185
for kd in fp8 int8; do
    run kvcalc --check "$T/st_$kd.json"
    expect_status 0 "kvcalc counts the blocks of decode's $kd cache"
done
run quantize --kv fp8 "$T/kv.kvp" -o "$T/kv_q8.kvp"
expect_status 0 "quantize --kv fp8 a prefill stream"
run decode -m "$M" -t $THREADS -n 8 "$T/kv_q8.kvp"
expect_status 0 "prefill | quantize --kv fp8 | decode"
expect_true "and it writes text" test -s "$OUT"
# prefill frees each sequence once written: 24 prompts of ~230 tokens (a
# shared 120-token start) through a cache of 44 blocks (704 tokens, three
# prompts), the shared start computed and sent once
long=$(printf 'the same words open every prompt here %.0s' $(seq 1 15))
for i in $(seq 1 24); do
    printf '{"id":"L%d","prompt":"%s question %d %s"}\n' "$i" "$long" "$i" "$(printf 'more text %.0s' $(seq 1 50))"
done >"$T/many.jsonl"
run prefill -m "$M" -t $THREADS -f "$T/many.jsonl" --kv-mem 16MiB --stats -o "$T/many.kvp"
expect_status 0 "prefill: 24 long prompts through a cache of three"
expect_err_has "shared by reference" "reports the blocks it shared"
run decode -m "$M" -t $THREADS -n 2 --json "$T/many.kvp"
expect_status 0 "decode takes all of them"
expect_true "24 answers" test "$(grep -c '"finish_reason"' "$OUT")" -eq 24
# a cut-off stream (another model's stream is refused too: test_engine)
head -c 5000 "$T/kv.kvp" >"$T/cut.kvp"
run decode -m "$M" -t $THREADS "$T/cut.kvp"
expect_status 1 "a truncated stream"
expect_err_one_line "one line of error"
done_testing
