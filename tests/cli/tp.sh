# tp.sh - tensor and pipeline parallelism (decode, prefill and specdec
# --tp N --pp M under mpirun): refusals always (ranks given another model,
# --tp or --pp than rank 0's among them); with MPI and the real model, greedy output equal
# to one process's on an f16 copy (the int8-activation kernels of Q4_1/Q8_0
# can round the last-bit differences of the all-reduce into a different
# near-tie: test_tp.c measures that), prompts from a pipe, perplexity and
# speculative decoding under --tp, and a rank that stops or dies ending the
# whole job with a message instead of a hang; KV streams written by a
# parallel job decode in one process as one process's do, and the reverse.
. "$KVP_TESTS/cli/lib.sh"

run decode -m x.gguf -p hi --tp 0
expect_status 2 "--tp 0 is a usage error"
run decode -m x.gguf -p hi --timeout 0
expect_status 2 "--timeout 0 is a usage error"
run decode --help
expect_out_has "--tp N" "--help lists --tp"

if ! command -v mpirun >/dev/null 2>&1; then
    echo "skip: no mpirun (scripts/deps installs OpenMPI): the multi-rank checks did not run"
    done_testing
    exit $?
fi
# CI runs as root on 2 cores: OpenMPI's consent to both.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# make asan: full allocation stacks in the ranks, so tests/lsan.supp's
# OpenMPI entries match behind the components it unloads before the report.
[ -z "${ASAN_OPTIONS:-}" ] || export ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0"
if [ ! -f "$KVP_MODEL" ]; then
    echo "skip: $KVP_MODEL not cached (scripts/fetch-model): the model checks did not run"
    done_testing
    exit $?
fi
M=$KVP_MODEL
# Under the sanitizers (make asan) every rank runs several times slower:
# fewer tokens, and the six-rank and specdec runs are left to make check.
N=24
case ${KVP_CFLAGS:-} in *sanitize*) N=6 ;; esac

run decode -m "$M" -p hi --tp 3
expect_status 2 "--tp 3 started alone: a usage error"
expect_err_has "Try 'decode --help'" "with the usage hint"
expect_err_has "--tp 3 --pp 1: 3 ranks, but the job has 1: start it with mpirun -np 3" "says how to start it"
run timeout 60 mpirun -np 2 decode -m "$M" -p hi --tp 3
expect_status 2 "--tp 3 over 2 ranks: a usage error"
expect_err_has "--tp 3 --pp 1: 3 ranks, but the job has 2" "names both counts"
run timeout 60 mpirun -np 2 decode -m "$M" -p hi --tp 2
expect_true "9 heads over 2 ranks fails, no hang" sh -c '[ "$1" -ne 0 ] && [ "$1" -ne 124 ]' _ "$status"
expect_err_has "9 query heads do not split evenly (rank counts that split this model: 1, 3)" "names the heads and the splits"
expect_true "the split error is said once, by rank 0" [ "$(grep -c "do not split evenly" "$ERR")" -eq 1 ]
expect_err_lacks "rank 1:" "no rank past 0 repeats it"
expect_err_lacks "MPI_ABORT" "the ranks end together: no abort"
expect_err_lacks "stopping every rank" "nor rank 0's abort message"
# a rank that cannot read the model (here its own -m, as on a node without
# the file) says so, rank 0 counts it, and the job ends at once with 1
run timeout 60 mpirun -np 1 decode -m "$M" -p hi --tp 3 : -np 2 decode -m "$T/none.gguf" -p hi --tp 3
expect_status 1 "ranks without the model: exit 1, no hang"
expect_err_has "2 of the job's 3 ranks could not take their part of the model" "rank 0 counts them"
expect_err_has "rank 1: $T/none.gguf" "rank 1 says why"
expect_err_has "rank 2: $T/none.gguf" "rank 2 says why"

# ---- greedy output: one process against 3 ranks, on f16 weights ----
run quantize --to f16 "$M" -o "$T/f16.kvp"
expect_status 0 "an f16 copy of the model"
run decode -m "$T/f16.kvp" -f "$KVP_TESTS/../scripts/demo-prompts.jsonl" -n "$N" --json -t "$THREADS"
cp "$OUT" "$T/alone.jsonl"
run timeout 300 mpirun -np 3 decode -m "$T/f16.kvp" -f "$KVP_TESTS/../scripts/demo-prompts.jsonl" -n "$N" --json \
    --tp 3 -t 1
expect_status 0 "decode --tp 3"
expect_err_empty "nothing on stderr"
# the texts by id (timings differ)
texts() { sed 's/,"ttft_ms".*//' "$1" | sort; }
texts "$T/alone.jsonl" >"$T/a.txt"
texts "$OUT" >"$T/b.txt"
expect_true "the same text for every request as one process" cmp -s "$T/a.txt" "$T/b.txt"
expect_true "four answers" [ "$(wc -l <"$T/b.txt")" -eq 4 ]

# ---- ranks that disagree: refused before the job starts, nothing written ----
# the same model in two formats (Q4_1, f16): every shape agrees, only the
# fingerprint tells them apart; before, the job printed garbage and exit 0
run timeout 60 mpirun -np 1 decode -m "$M" -p hi -n 4 --pp 2 -t 1 : -np 1 decode -m "$T/f16.kvp" -p hi -n 4 --pp 2 -t 1
expect_status 1 "rank 1 with another model: exit 1"
expect_out_empty "nothing written"
expect_err_has "rank 1: $T/f16.kvp is not rank 0's model $M (fingerprint " "rank 1 names both models"
expect_err_has "1 of the job's 2 ranks loaded another model than $M (fingerprint " "rank 0 counts it"
expect_err_lacks "MPI_ABORT" "the ranks end together: no abort"
# another split: before, garbage and a timeout blaming a hang (--tp 2 against
# --pp 2 on a model both split), or a hang (a job of the right size for one
# rank only)
run timeout 60 mpirun -np 1 decode -m "$M" -p hi -n 4 --pp 2 -t 1 : -np 1 decode -m "$M" -p hi -n 4 --pp 3 -t 1
expect_status 2 "rank 1 with another --pp: a usage error, no hang"
expect_out_empty "nothing written"
expect_err_has "decode: rank 1 was started with --tp 1 --pp 3, rank 0 with --tp 1 --pp 2 (1 of the job's 2 ranks differ)" \
    "names both splits"
expect_true "said once, by rank 0" [ "$(grep -c 'was started with' "$ERR")" -eq 1 ]
run timeout 60 mpirun -np 1 prefill -m "$M" -p hi --tp 2 -t 1 -o "$T/split.kvp" : -np 1 prefill -m "$M" -p hi --pp 2 -t 1
expect_status 2 "prefill: --tp 2 on rank 0, --pp 2 on rank 1: a usage error"
expect_err_has "prefill: rank 1 was started with --tp 1 --pp 2, rank 0 with --tp 2 --pp 1" "names both splits"
expect_true "no output file" [ -z "$(ls "$T"/split.kvp* 2>/dev/null)" ]
# a rank's own failure inside the job names it once (it said "rank 1: rank 1:")
case ${KVP_CFLAGS:-} in
*sanitize*) echo "skip: under the sanitizers, a rank under ulimit -v" ;;
*)
    run timeout 60 mpirun -np 1 decode -m "$M" -p hi -n 4 --pp 2 -t 1 --kv-mem 1GiB : \
        -np 1 sh -c "ulimit -v 600000; exec decode -m '$M' -p hi -n 4 --pp 2 -t 1"
    expect_true "rank 1 out of memory for its KV pool: a failure" sh -c '[ "$1" -ne 0 ] && [ "$1" -ne 124 ]' _ "$status"
    expect_err_has "decode: rank 1: KV cache: cannot allocate" "said by rank 1"
    expect_err_lacks "rank 1: rank 1:" "naming itself once"
    ;;
esac

# --stats under --tp holds rank 0's pool and says the split: kvcalc --check
# plans that rank and agrees (it read the pool as one process's)
run timeout 300 mpirun -np 3 decode -m "$T/f16.kvp" -f "$KVP_TESTS/../scripts/demo-prompts.jsonl" -n 8 --tp 3 -t 1 \
    --kv-dtype fp8 --kv-mem 2MiB --stats="$T/tpstats.json"
expect_status 0 "decode --tp 3 --stats"
expect_true "the stats say tp 3, pp 1" grep -qF '"tp":3,"pp":1' "$T/tpstats.json"
run kvcalc --check "$T/tpstats.json"
expect_status 0 "kvcalc --check agrees with a tp 3 run"
expect_out_has "30 x 2,176 B (scales included) = 65,280 B" "rank 0's block: one of 3 KV heads, fp8 with scales"
run timeout 300 mpirun -np 2 decode -m "$M" -f "$KVP_TESTS/../scripts/demo-prompts.jsonl" -n 8 --pp 2 -t 1 \
    --kv-mem 2MiB --stats="$T/ppstats.json"
run kvcalc --check "$T/ppstats.json"
expect_status 0 "kvcalc --check agrees with a pp 2 run (stage 0's 15 layers)"

# pipeline stages compute what one process does, bit for bit (no sum is split)
run decode -m "$M" -f "$KVP_TESTS/../scripts/demo-prompts.jsonl" -n "$N" --json -t "$THREADS"
texts "$OUT" >"$T/q.txt"
run timeout 300 mpirun -np 2 decode -m "$M" -f "$KVP_TESTS/../scripts/demo-prompts.jsonl" -n "$N" --json --pp 2 -t 1
expect_status 0 "decode --pp 2 on the Q4_1 model"
texts "$OUT" >"$T/p.txt"
expect_true "the same text for every request as one process" cmp -s "$T/q.txt" "$T/p.txt"
if [ "$N" = 24 ]; then
    run timeout 300 mpirun -np 6 decode -m "$T/f16.kvp" -f "$KVP_TESTS/../scripts/demo-prompts.jsonl" -n "$N" \
        --json --tp 3 --pp 2 -t 1
    expect_status 0 "decode --tp 3 --pp 2: six ranks"
    texts "$OUT" >"$T/b.txt"
    expect_true "the same text for every request as one process" cmp -s "$T/a.txt" "$T/b.txt"
else
    echo "skip: under the sanitizers, the six-rank run (make check runs it)"
fi
run timeout 60 mpirun -np 2 decode -m "$M" -p hi --pp 3
expect_status 2 "--pp 3 over 2 ranks: a usage error"
expect_err_has "decode: --tp 1 --pp 3: 3 ranks, but the job has 2" "names the counts"
expect_true "said once, not by every rank" [ "$(grep -c 'but the job has' "$ERR")" -eq 1 ]
# a usage error under mpirun is said once, by rank 0, not by every rank
run timeout 60 mpirun -np 3 decode -m "$M" -p hi -f "$T/p.jsonl" --tp 3
expect_status 2 "-p and -f under mpirun: a usage error"
expect_true "said once, not by each of 3 ranks" [ "$(grep -c 'give one of' "$ERR")" -eq 1 ]
run timeout 60 mpirun -np 2 prefill -m "$M" -p hi --bogus --tp 2
expect_status 2 "an unknown option under mpirun"
expect_true "said once" [ "$(grep -c 'bogus' "$ERR")" -eq 1 ]
# ... and with neither: each rank would run the whole job (twice the lines)
for p in decode prefill specdec; do
    run timeout 60 mpirun -np 2 $p -m "$M" -p hi -n 2 -o "$T/two.kvp"
    [ $p = prefill ] || run timeout 60 mpirun -np 2 $p -m "$M" -p hi -n 2
    expect_status 2 "$p over 2 ranks without --tp or --pp: a usage error"
    expect_err_has "$p: started as one of 2 ranks (mpirun -np 2), but without --tp or --pp" "$p: says why"
    expect_true "$p: said once" [ "$(grep -c 'started as one of' "$ERR")" -eq 1 ]
done

run_sh "printf '%s\n' 'The capital of France is' | timeout 120 mpirun -np 3 decode -m '$M' -f - -n 8 --tp 3 -t 1"
expect_status 0 "prompts from a pipe reach rank 0"
expect_out_has "Paris" "and it answers (Q4_1 weights)"

run timeout 120 mpirun -np 3 decode -m "$M" -p "The capital of France is" -n 8 --tp 3 --kv-dtype fp8 --kv-mem 1MiB -t 1
expect_status 0 "an fp8 cache of a few blocks"
expect_out_has "Paris" "answers too"

# ---- prefill: perplexity under --tp equals one process's ----
bytes=3000
[ "$N" = 24 ] || bytes=1200
head -c $bytes /usr/share/common-licenses/GPL-3 >"$T/text.txt" 2>/dev/null || head -c $bytes "$KVP_TESTS/../README.md" >"$T/text.txt"
run prefill -m "$T/f16.kvp" --perplexity "$T/text.txt" --ctx 128 --json -t "$THREADS"
ppl1=$(sed -n 's/.*"ppl":\([0-9.]*\).*/\1/p' "$OUT")
run timeout 300 mpirun -np 2 prefill -m "$T/f16.kvp" --perplexity "$T/text.txt" --ctx 128 --json --pp 2 -t 1
expect_status 0 "prefill --perplexity --pp 2"
expect_out_has "\"ppl\":$ppl1," "the same perplexity as one process, to the last digit"
run timeout 300 mpirun -np 3 prefill -m "$T/f16.kvp" --perplexity "$T/text.txt" --ctx 128 --json --tp 3 -t 1
expect_status 0 "prefill --perplexity --tp 3"
ppl3=$(sed -n 's/.*"ppl":\([0-9.]*\).*/\1/p' "$OUT")
# (f16 weights: 4e-4 apart seen; a misplaced logits row or head would be far off)
expect_true "the same perplexity to 0.2% ($ppl1 alone, $ppl3 over 3 ranks)" \
    awk -v a="$ppl1" -v b="$ppl3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d / a < 2e-3) }'

# ---- specdec over 3 ranks: its own --compare runs decode first ----
if [ "$N" = 24 ]; then
    run timeout 300 mpirun -np 3 specdec -m "$T/f16.kvp" -f "$KVP_TESTS/../scripts/demo-prompts.jsonl" -n "$N" \
        --tp 3 --compare --json -t 1
    expect_status 0 "specdec --tp 3 --compare: identical to decode --tp 3"
    # layerskip's own cache on rank 0 holds as many tokens as the target's
    # shard (68 blocks of 8 MiB here: 1,088 tokens), not 8 MiB of its
    # 15-layer blocks (45: 720 tokens): an 880-token prompt drafts too
    long=$(awk 'BEGIN { for (i = 0; i < 440; i++) printf "green apple "; }')
    printf '{"id":"s1","prompt":"Tell me about rivers."}\n{"id":"long","prompt":"%s"}\n' "$long" >"$T/mixlong.jsonl"
    run timeout 300 mpirun -np 3 specdec -m "$M" -f "$T/mixlong.jsonl" -n 16 --ignore-eos --tp 3 --kv-mem 8MiB \
        --method layerskip --draft-len 3 --json -t 1
    expect_status 0 "specdec --tp 3 --kv-mem 8MiB --method layerskip"
    expect_true "the long prompt drafts too" grep -q '"id":"long".*"drafted":[1-9]' "$OUT"
else
    echo "skip: under the sanitizers, specdec --tp 3 (make check runs it)"
fi

# ---- KV streams out of a parallel job: each block gathered whole ----
P="$KVP_TESTS/../scripts/demo-prompts.jsonl"
run prefill -m "$M" -f "$P" -o "$T/kv1.kvp" -t "$THREADS"
# to standard output, redirected: OpenMPI gives each rank a pseudo-terminal
# there, which prefill took for a screen ("the KV stream is binary")
run_sh "timeout 120 mpirun -np 2 prefill -m '$M' -f '$P' --pp 2 -t 1 > '$T/kv2.kvp'"
expect_status 0 "prefill --pp 2 writes a KV stream to a redirected standard output"
run kvdump --check "$T/kv2.kvp"
expect_status 0 "a whole, valid stream"
run decode -m "$M" -n "$N" --json "$T/kv1.kvp"
texts "$OUT" >"$T/d1.txt"
run decode -m "$M" -n "$N" --json "$T/kv2.kvp"
texts "$OUT" >"$T/d2.txt"
expect_true "decoded alone, the same text as one process's stream (Q4_1: the KV is the same bits)" \
    cmp -s "$T/d1.txt" "$T/d2.txt"
run prefill -m "$T/f16.kvp" -f "$P" -o "$T/kvf1.kvp" -t "$THREADS"
run timeout 300 mpirun -np 3 prefill -m "$T/f16.kvp" -f "$P" -o "$T/kvf3.kvp" --tp 3 -t 1
expect_status 0 "prefill --tp 3 writes a KV stream"
run decode -m "$T/f16.kvp" -n "$N" --json "$T/kvf1.kvp"
texts "$OUT" >"$T/f1.txt"
run decode -m "$T/f16.kvp" -n "$N" --json "$T/kvf3.kvp"
texts "$OUT" >"$T/f3.txt"
expect_true "decoded alone, the same text as one process's stream (f16)" cmp -s "$T/f1.txt" "$T/f3.txt"
run timeout 120 mpirun -np 3 decode -m "$M" -p "The capital of France is" -n 4 --tp 3 --kv-out "$T/kvo.kvp" -t 1
expect_status 0 "decode --tp 3 --kv-out"
run decode -m "$M" -n 4 "$T/kvo.kvp"
expect_status 0 "its state resumes in one process"

# ---- KV streams into a parallel job: each block scattered to the ranks ----
run timeout 120 mpirun -np 2 decode -m "$M" -n "$N" --json --pp 2 -t 1 "$T/kv1.kvp"
expect_status 0 "decode --pp 2 reads a KV stream"
texts "$OUT" >"$T/d3.txt"
expect_true "the same text as one process reading it (Q4_1: the same bits)" cmp -s "$T/d1.txt" "$T/d3.txt"
run_sh "prefill -m '$T/f16.kvp' -f '$P' -t $THREADS | timeout 300 mpirun -np 3 decode -m '$T/f16.kvp' -n $N --json --tp 3 -t 1"
expect_status 0 "prefill | mpirun decode --tp 3: the stream through a pipe to rank 0"
texts "$OUT" >"$T/f4.txt"
expect_true "the same text as one process reading it (f16)" cmp -s "$T/f1.txt" "$T/f4.txt"
run prefill -m "$M" -f "$P" --kv-dtype fp8 -o "$T/kv8.kvp" -t "$THREADS"
run decode -m "$M" -n "$N" --json "$T/kv8.kvp"
texts "$OUT" >"$T/e1.txt"
run timeout 120 mpirun -np 2 decode -m "$M" -n "$N" --json --pp 2 -t 1 "$T/kv8.kvp"
expect_status 0 "decode --pp 2 reads an fp8 stream (scales scattered with their heads)"
texts "$OUT" >"$T/e2.txt"
expect_true "the same text as one process reading it" cmp -s "$T/e1.txt" "$T/e2.txt"

# ---- a rank that stops, then one that dies ----
# the pid of rank $1 among the ranks of a job tagged by --system $2
rank_pid() {
    for p in $(pgrep -f "$2"); do
        if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1"; then
            echo "$p"
            return
        fi
    done
}
# wait up to 20 s for rank $1 of the job tagged $2
await_rank() {
    i=0
    while [ $i -lt 200 ]; do
        p=$(rank_pid "$1" "$2")
        [ -n "$p" ] && { echo "$p"; return; }
        sleep 0.1
        i=$((i + 1))
    done
}
# wait up to $3 seconds for mpirun (pid $1) of the job tagged $2 to end,
# then kill what is left of it; its exit status in $status
end_job() {
    waited=0
    while kill -0 "$1" 2>/dev/null && [ $waited -lt $(($3 * 2)) ]; do sleep 0.5; waited=$((waited + 1)); done
    kill -0 "$1" 2>/dev/null && { kill -9 "$1"; pkill -9 -f "$2"; }
    wait "$1"
    status=$?
}
# the counting job NAME of $2 tokens (more options after) on 3 ranks, in
# the background: $job its pid, $tag the --system that tags its ranks,
# $T/NAME.out and .err its outputs
count_job() {
    tag="tp-$1-$$" name=$1 n=$2
    shift 2
    mpirun -np 3 decode -m "$M" -p "Count to one thousand:" -n "$n" --ignore-eos --tp 3 -t 1 --chat \
        --system "$tag" "$@" >"$T/$name.out" 2>"$T/$name.err" &
    job=$!
}
# signal rank $1 of the job $job tagged $tag with $2 a second after it is
# up, then wait for the job's end ($3 seconds at most): $p the rank's pid,
# $took the seconds from the signal, $status the job's exit status
hit_rank() {
    p=$(await_rank "$1" "$tag")
    sleep 1
    [ -n "$p" ] && kill -"$2" "$p"
    start=$(date +%s)
    end_job "$job" "$tag" "$3"
    took=$(($(date +%s) - start))
}
count_job stop 4000 --timeout 3 --kv-out "$T/stop.kvp"
hit_rank 1 STOP 30
[ -n "$p" ] && kill -CONT "$p" 2>/dev/null
cp "$T/stop.err" "$ERR"
LAST_CMD="mpirun -np 3 decode --tp 3 --timeout 3, rank 1 stopped"
expect_true "a stopped rank ends the job with a failure (rank pid ${p:-none})" sh -c '[ -n "$1" ] && [ "$2" -ne 0 ]' _ "$p" "$status"
expect_true "within the timeout and some ($took s)" [ "$took" -le 20 ]
expect_err_has "waited 3 s for its peers" "the waiting rank says why"
expect_err_has "decode: rank 0: " "rank 0 says it, naming the program"
expect_true "said once (the other ranks wait half as long again)" [ "$(grep -c "for its peers" "$ERR")" -eq 1 ]
expect_true "no --kv-out file, nor its temporary file, left by the abort" \
    [ -z "$(ls "$T"/stop.kvp* 2>/dev/null)" ]

count_job kill 4000 --kv-out "$T/kill.kvp"
hit_rank 2 KILL 30
cp "$T/kill.err" "$ERR"
LAST_CMD="mpirun -np 3 decode --tp 3 --kv-out, rank 2 killed"
expect_true "a killed rank ends the job with a failure (rank pid ${p:-none})" sh -c '[ -n "$1" ] && [ "$2" -ne 0 ]' _ "$p" "$status"
expect_err_has "signal 9" "mpirun names the signal"
expect_true "no rank is left behind" [ -z "$(pgrep -f "$tag")" ]
# mpirun gives rank 0 SIGTERM and a second before SIGKILL; rank 0, waiting on
# the dead rank, cannot stop in order, so it removes its temporary file and
# aborts first (before, it waited on and the kill left k.kvp.tmp.XXXX)
expect_true "no --kv-out file, nor its temporary file ($(ls "$T" | grep kill.kvp))" \
    [ -z "$(ls "$T"/kill.kvp* 2>/dev/null)" ]
expect_err_has "decode: rank 0: stopped by Terminated while waiting" "rank 0 says why it aborts"

# SIGTERM to rank 0 alone while a peer hangs (stopped): rank 0 gives up on
# stopping in order after half a second, removes its temporary file and
# aborts, 143 (before, it waited out --timeout)
tag="tp-hung-$$"
mpirun -np 2 decode -m "$M" -p "Count to one thousand:" -n 4000 --ignore-eos --pp 2 -t 1 --chat --system "$tag" \
    --timeout 120 --kv-out "$T/hung.kvp" >"$T/hung.out" 2>"$T/hung.err" &
job=$!
p0=$(await_rank 0 "$tag")
p1=$(await_rank 1 "$tag")
sleep 1
[ -n "$p1" ] && kill -STOP "$p1"
sleep 0.5
[ -n "$p0" ] && kill -TERM "$p0"
start=$(date +%s)
end_job "$job" "$tag" 30
took=$(($(date +%s) - start))
[ -n "$p1" ] && kill -CONT "$p1" 2>/dev/null
cp "$T/hung.err" "$ERR"
LAST_CMD="mpirun -np 2 decode --pp 2 --kv-out, rank 1 stopped, SIGTERM to rank 0"
expect_true "the job ends 143 (got $status; ranks $p0 $p1)" sh -c '[ -n "$1" ] && [ -n "$2" ] && [ "$3" -eq 143 ]' _ "$p0" "$p1" "$status"
expect_true "within seconds of the signal ($took s), not --timeout's 120" [ "$took" -le 15 ]
expect_err_has "decode: rank 0: stopped by Terminated while waiting 0.5 s for its peers" "rank 0 says why"
expect_true "no --kv-out file, nor its temporary file" [ -z "$(ls "$T"/hung.kvp* 2>/dev/null)" ]
expect_true "no rank is left behind" [ -z "$(pgrep -f "$tag")" ]

# SIGTERM to every rank, as a scheduler stops a job (srun, scancel): rank
# 0 stops it as one process does (the step finished, what finished
# written, a message, 143, --stats written, no temporary file), the other
# ranks leave the stop to it; before, they died of the signal and took
# rank 0 down with its --kv-out temporary file left behind
tag="tp-term-$$"
i=0
while [ $i -lt 12 ]; do echo "{\"id\":\"t$i\",\"prompt\":\"Tell me a long story about river $i.\"}"; i=$((i + 1)); done \
    >"$T/term.jsonl"
mkdir -p "$T/term"
mpirun -np 3 decode -m "$M" -f "$T/term.jsonl" -n 400 --ignore-eos --tp 3 -t 1 --max-num-seqs 2 --chat \
    --system "$tag" --kv-out "$T/term/kv.kvp" --stats="$T/term/s.json" >"$T/term.out" 2>"$T/term.err" &
job=$!
p0=$(await_rank 0 "$tag")
sleep 3
pids=""
for r in 0 1 2; do pids="$pids $(rank_pid $r "$tag")"; done
[ -n "$p0" ] && kill -TERM $pids
end_job "$job" "$tag" 60
cp "$T/term.err" "$ERR"
LAST_CMD="mpirun -np 3 decode --tp 3 --kv-out --stats=FILE, SIGTERM to every rank"
expect_true "the job ends stopped, 143 (got $status; ranks:$pids)" sh -c '[ -n "$1" ] && [ "$2" -eq 143 ]' _ "$p0" "$status"
expect_err_has "decode: stopped by Terminated:" "rank 0 says what it stopped"
expect_true "no temporary file left ($(ls "$T/term"))" sh -c "! ls '$T/term' | grep -q tmp"
expect_true "--stats written, stopped" grep -q '"stopped":true' "$T/term/s.json"
last=$(tail -c 1 "$T/term.out" | od -An -tx1 | tr -d ' \n')
expect_true "whole lines only (last byte ${last:-none})" [ -z "$last" -o "$last" = 0a ]
expect_true "no rank is left behind" [ -z "$(pgrep -f "$tag")" ]

# SIGTERM to one rank past 0 alone (kill of one task): rank 0 never has
# it, so after 30 s that rank says so and ends the job (before, the signal
# was dropped and the job ran to its end, exit 0)
count_job one 40000
hit_rank 1 TERM 90
cp "$T/one.err" "$ERR"
LAST_CMD="mpirun -np 3 decode --tp 3, SIGTERM to rank 1 alone"
expect_true "the job ends with a failure (got $status, rank pid ${p:-none})" sh -c '[ -n "$1" ] && [ "$2" -ne 0 ]' _ "$p" "$status"
expect_true "about 30 s after the signal ($took s)" sh -c '[ "$1" -ge 25 ] && [ "$1" -le 80 ]' _ "$took"
expect_err_has "decode: rank 1: stopped by Terminated, which rank 0 has not had for 30 s" "rank 1 says why"
expect_true "no rank is left behind" [ -z "$(pgrep -f "$tag")" ]

done_testing
