# decode's greedy output does not depend on the batch: twelve chat prompts
# (several the same) give the same text, token count and finish reason per
# sequence alone (--max-num-seqs 1), in the default continuous batch, with a
# 7-token step budget (prompts cut into chunks beside running decodes), in
# static batches, and with a KV cache so small that sequences are preempted
# and computed again; on an f16 cache and on fp8 and int8 ones.  Needs the real model (scripts/fetch-model).
. "$KVP_TESTS/cli/lib.sh"

M="$KVP_MODEL"
if [ ! -f "$M" ]; then
    echo "note: $M absent (scripts/fetch-model); skipping the batch invariance tests"
    done_testing
    exit $?
fi

q() { printf '{"id":"%s","messages":[{"role":"user","content":"%s"}]}\n' "$1" "$2"; }
{
    q p01 "What is the capital of France?"
    q p02 "How many people live in the United States?"
    q p03 "What is the capital of France?"
    q p04 "Name three fruits."
    q p05 "How many people live in the United States?"
    q p06 "Write a haiku about the sea."
    q p07 "What is the capital of France?"
    q p08 "Explain what a prime number is."
    q p09 "Name three fruits."
    q p10 "Why is the sky blue?"
    q p11 "How many people live in the United States?"
    q p12 "Give me a recipe for pancakes."
} >"$T/p.jsonl"

# The lines of $OUT without their timings, in id order.
greedy_lines() { sed 's/,"ttft_ms".*//' "$OUT" | sort; }

run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 24 --max-num-seqs 1
expect_status 0 "one sequence at a time"
greedy_lines >"$T/alone.txt"
n=$(grep -c '"finish_reason"' "$T/alone.txt")
if [ "$n" = 12 ]; then pass "twelve sequences"; else fail "twelve sequences (got $n)"; fi
# identical prompts give identical lines, whatever their id
a=$(grep -c '^{"id":"p0[137]"' "$T/alone.txt")
same=$(grep '^{"id":"p0[137]"' "$T/alone.txt" | sed 's/^{"id":"p[0-9]*"//' | sort -u | wc -l)
if [ "$a" = 3 ] && [ "$same" = 1 ]; then pass "equal prompts alone, equal text"; else fail "equal prompts differ alone"; fi

check_mode() { # WHAT OPTIONS...
    what=$1
    shift
    run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 24 "$@"
    expect_status 0 "$what"
    greedy_lines >"$T/got.txt"
    if cmp -s "$T/alone.txt" "$T/got.txt"; then
        pass "$what: every sequence as alone"
    else
        fail "$what: lines differ from --max-num-seqs 1"
        diff "$T/alone.txt" "$T/got.txt" | head -n 8
    fi
}
check_mode "continuous batch"
check_mode "7-token steps" --max-batched-tokens 7
check_mode "static batches" --static
check_mode "3 threads" -t 3 --max-batched-tokens 19
# 4 MiB holds 11 blocks of 16 tokens (360 KiB each): the batch outgrows it
check_mode "preempted and recomputed" --kv-mem 4MiB --stats --json
p=$(sed -n 's/.*"preemptions":\([0-9]*\).*/\1/p' "$ERR")
if [ -n "$p" ] && [ "$p" -gt 0 ]; then pass "the small cache preempts ($p)"; else fail "no preemptions (${p:-none})"; fi

# A scaled (fp8, int8) cache: each token's row has its own scale, so what
# a token's attention reads never depends on the tokens after it in the
# same chunk: the same holds there, prompts cut into 7-token chunks too.
for kd in fp8 int8; do
    run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 24 --max-num-seqs 1 --kv-dtype $kd
    expect_status 0 "$kd: one sequence at a time"
    greedy_lines >"$T/alone.txt"
    check_mode "$kd: continuous batch" --kv-dtype $kd
    check_mode "$kd: 7-token steps" --kv-dtype $kd --max-batched-tokens 7
    # 2 MiB holds 10 fp8 blocks of 16 tokens (191 KiB each)
    check_mode "$kd: preempted and recomputed" --kv-dtype $kd --kv-mem 2MiB --stats --json
    p=$(sed -n 's/.*"preemptions":\([0-9]*\).*/\1/p' "$ERR")
    if [ -n "$p" ] && [ "$p" -gt 0 ]; then pass "$kd: the small cache preempts ($p)"; else fail "$kd: no preemptions"; fi
done
done_testing
