# decode as a batch engine: continuous batching under a small KV cache
# (preemption, nothing lost), a sequence too large for the cache ending alone
# with kv_memory, the same greedy text whatever the token budget or batching
# mode when sequences run alone, serving metrics and the goodput exit code.
. "$KVP_TESTS/cli/lib.sh"

run decode -m x.gguf -p hi --max-num-seqs 0
expect_status 2 "--max-num-seqs 0 is a usage error"
run decode -m x.gguf -p hi --min-goodput 1.5
expect_status 2 "--min-goodput above 1 is a usage error"
run decode -m x.gguf -p hi --slo-ttft -3
expect_status 2 "a negative SLO is a usage error"
expect_err_has "--slo-ttft" "names the option"
# 0 was taken for no bound: --min-goodput then passed every request
for o in --slo-ttft --slo-tpot; do
    run decode -m x.gguf -p hi $o 0 --min-goodput 0.5
    expect_status 2 "$o 0 is a usage error"
    expect_err_has "$o: a bound in milliseconds above 0" "$o 0: says why"
done

run decode -m x.gguf -p hi --progress=0
expect_status 2 "--progress=0 is a usage error"
run decode -m x.gguf -p hi --progress=soon
expect_status 2 "--progress=soon is a usage error"
expect_err_has "--progress" "names the option"

need_model

# 10 chat prompts, 3 of them identical to others
i=0
: >"$T/p.jsonl"
for q in "Name a fruit." "Name a color." "Name a fruit." "Say hello." "Name a city." \
    "Count to three." "Name a color." "Say hello." "Name an animal." "Name a planet."; do
    i=$((i + 1))
    printf '{"id":"q%d","messages":[{"role":"user","content":"%s"}]}\n' "$i" "$q" >>"$T/p.jsonl"
done
lines() { sed 's/,"ttft_ms.*//' "$OUT" | sort; }

# A 2 MiB cache holds 5 blocks of 16 tokens: sequences are preempted and
# recomputed, and every one still finishes.
run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 24 --kv-mem 2MiB --stats="$T/stats.json"
expect_status 0 "a job larger than the KV cache completes"
n=$(grep -c '"finish_reason":"\(stop\|length\|stop_string\)"' "$OUT")
if [ "$n" = 10 ]; then pass "every sequence has its line"; else fail "$n of 10 lines"; fi
if grep -q '"preemptions":[1-9]' "$T/stats.json"; then pass "the cache was short: sequences were preempted"
else fail "no preemption reported: $(cat "$T/stats.json")"; fi
for k in '"requests":10' '"ttft_ms":{"n":10' '"tpot_ms":' '"itl_ms":' '"e2e_ms":' '"p99":' '"goodput":1.0000'; do
    if grep -qF "$k" "$T/stats.json"; then pass "stats has $k"; else fail "stats lacks $k"; fi
done
if ls "$T"/stats.json.tmp.* >/dev/null 2>&1; then fail "a temporary stats file was left"; else pass "stats written whole"; fi
# a request that answers no token still has an E2E (arrival to its end),
# not a TTFT
printf '{"id":"a","prompt":"hi"}\n{"id":"z","prompt":"hi","max_tokens":0}\n' >"$T/zero.jsonl"
run decode -m "$M" -t 2 -f "$T/zero.jsonl" -n 3 --stats="$T/zero.json"
expect_status 0 "a request of max_tokens 0 with another"
expect_true "e2e_ms counts both, ttft_ms the one with a token" grep -q '"ttft_ms":{"n":1,.*"e2e_ms":{"n":2' \
    "$T/zero.json"
# a prompt never computed (max_tokens 0: over before its first step) is
# in prompt_tokens, not in the token throughput: output and the prompt of
# the request that ran, (3 + 1) / 3 of the output's, not (3 + 2) / 3
run decode -m "$M" -t 2 -f "$T/zero.jsonl" -n 3 --ignore-eos --stats="$T/zero.json"
expect_status 0 "max_tokens 0 beside a request of 3 tokens"
expect_true "prompt_tokens counts both prompts, total_token_throughput the one computed" python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
r = j["total_token_throughput"] / j["output_throughput"]
sys.exit(0 if j["prompt_tokens"] == 2 and j["output_tokens"] == 3 and abs(r - 4 / 3) < 0.01 else 1)' "$T/zero.json"
# no step ran (no request; every request over before its first): no work
# was timed, so no rate (2 requests in 80 us read as 25000 a second), and
# no mean or hit rate of nothing: null, "no step ran" in the text, not 0
: >"$T/empty.jsonl"
printf '{"id":"a","prompt":"hi","max_tokens":0}\n{"id":"b","prompt":"yo","max_tokens":0}\n' >"$T/zeros.jsonl"
for f in empty zeros; do
    run decode -m "$M" -t 2 -f "$T/$f.jsonl" --stats --json
    expect_status 0 "$f: --stats --json"
    for k in request_throughput output_throughput total_token_throughput goodput_rps; do
        expect_err_has "\"$k\":null" "$f: $k null, no step ran"
    done
    run decode -m "$M" -t 2 -f "$T/$f.jsonl" --stats
    expect_err_has " s (no step ran: no rates); 0 steps" "$f: the text says there are no rates"
done
run decode -m "$M" -t 2 -f "$T/empty.jsonl" --stats --json
expect_err_has '"prompt_tokens":0,"cached_prompt_tokens":0,"prefix_hit_rate":null,' "no prompt token: hit rate null"
expect_err_has '"mean_prompt_tokens":null,"mean_output_tokens":null,' "no request: means null"
run decode -m "$M" -t 2 -f "$T/zeros.jsonl" --stats --json
expect_err_has '"mean_prompt_tokens":1.00,"mean_output_tokens":0.00,' "two requests of no output: means given"
# where the time went: forward steps and sampling, both above 0 and
# together within the run's seconds
num() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p" "$T/stats.json"; }
expect_true "stats: forward and sampling seconds above 0, within the run's" awk -v f="$(num forward_seconds)" \
    -v s="$(num sample_seconds)" -v t="$(num seconds)" 'BEGIN { exit !(f > 0 && s > 0 && f + s <= t + 0.002) }'

# Without --rate a prompts file's requests all arrive when the job starts:
# one at a time, each waits behind those before it, and its TTFT says so
# (each was stamped when its line was read, so a later one read less).
for i in 0 1 2 3; do printf '{"id":"w%d","prompt":"Hello number %d"}\n' "$i" "$i"; done >"$T/wait.jsonl"
run decode -m "$M" -t 2 -f "$T/wait.jsonl" -n 8 --ignore-eos --max-num-seqs 1 --json
expect_status 0 "four requests one at a time"
ttfts=$(sed -n 's/.*"ttft_ms":\([0-9.]*\).*/\1/p' "$OUT" | tr '\n' ' ')
expect_true "each TTFT holds the wait behind the ones before it ($ttfts)" awk -v t="$ttfts" \
    'BEGIN { n = split(t, a, " "); if (n != 4) exit 1; for (i = 2; i <= n; i++) if (a[i] <= a[i - 1]) exit 1 }'

# An end token is not shown and sets no time: a chat answer ending on it
# has one gap between tokens fewer than its tokens, and TPOT their mean;
# a line with none or one token says null, not 0.
printf '%s\n' '{"id":"c","messages":[{"role":"user","content":"What is 2+2?"}],"max_tokens":10}' >"$T/eos.jsonl"
run decode -m "$M" -t 2 -f "$T/eos.jsonl" --json --stats="$T/eos.json" --system ""
expect_out_has '"finish_reason":"stop"' "the answer ends on its end token"
tok=$(sed -n 's/.*"tokens":\([0-9]*\).*/\1/p' "$OUT")
expect_true "the stats' gaps: tokens - 1 ($tok tokens)" grep -q "\"itl_ms\":{\"n\":$((tok - 1))," "$T/eos.json"
printf '%s\n' '{"id":"z","prompt":"Hi","max_tokens":0}' '{"id":"o","prompt":"Hi","max_tokens":1}' >"$T/none.jsonl"
run decode -m "$M" -t 2 -f "$T/none.jsonl" --json
expect_out_has '"id":"z","text":"","tokens":0,"finish_reason":"length","ttft_ms":null,"tpot_ms":null}' \
    "no token: TTFT and TPOT null"
expect_true "one token: a TTFT, TPOT null" grep -q '"id":"o",.*"tokens":1,.*"ttft_ms":[0-9.]*,"tpot_ms":null}' "$OUT"

# --kv-out in the same 2 MiB: each request's KV is written as it finishes
# and its blocks freed, so the state of all ten is kept though the cache
# never holds more than five blocks (finished requests held every block
# they had until the end of the job: the later ones ended "kv_memory" and
# the stream was lost to one with no KV)
run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 24 --kv-mem 2MiB --kv-out "$T/small.kvp"
expect_status 0 "--kv-out of a job larger than the KV cache completes"
n=$(grep -c '"finish_reason":"\(stop\|length\|stop_string\)"' "$OUT")
expect_true "every sequence has its line ($n of 10)" test "$n" = 10
run kvdump -s "$T/small.kvp"
expect_status 0 "the --kv-out stream is whole"
expect_out_has "sequence   10" "it holds all ten sequences"
run decode -m "$M" -t 2 -n 1 --kv-mem 2MiB "$T/small.kvp"
expect_status 0 "and decode continues them from it, in the same cache"
expect_true "ten lines" test "$(grep -c '"id":' "$OUT")" = 10
rm -f "$T/small.kvp"

# Greedy text of sequences that run alone does not depend on the batching
# mode.  (Across token budgets and batch compositions it needs kernels whose
# rounding does not depend on the step: not yet, see the README's limits.)
run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 8 --max-num-seqs 1
expect_status 0 "one at a time"
cp "$OUT" "$T/alone.raw"
lines >"$T/alone"
for mode in "--static" "--static --kv-mem 2MiB"; do
    # shellcheck disable=SC2086
    run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 8 --max-num-seqs 1 $mode
    lines >"$T/mode"
    if cmp -s "$T/alone" "$T/mode"; then pass "same text with $mode"; else fail "text differs with $mode"; fi
done
q1=$(grep '"id":"q1"' "$T/alone" | sed 's/"id":"q1"//')
q3=$(grep '"id":"q3"' "$T/alone" | sed 's/"id":"q3"//')
if [ -n "$q1" ] && [ "$q1" = "$q3" ]; then pass "equal prompts give equal text"; else fail "q1 and q3 differ"; fi

# --shard K/N: three shards hold every request once, each as run alone.
: >"$T/shards"
for k in 0 1 2; do
    run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 8 --max-num-seqs 1 --shard $k/3
    expect_status 0 "shard $k/3"
    lines >>"$T/shards"
done
sort "$T/shards" >"$T/shards.sorted"
if cmp -s "$T/alone" "$T/shards.sorted"; then pass "shards 0/3 1/3 2/3 together are the whole job"
else fail "the shards differ from the whole job"; fi
run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 1 --shard 1/4
if [ "$(wc -l <"$OUT")" = 3 ]; then pass "shard 1/4 of 10 takes 3 (ids 1, 5, 9)"; else fail "shard 1/4: $(wc -l <"$OUT") lines"; fi
run decode -m x.gguf -p hi --shard 3/3
expect_status 2 "--shard 3/3 is a usage error"
# a one-task job array's --shard 0/1 merges by id too: JSON Lines even for
# a shard of one request (it printed that request as plain text, no id)
printf '{"id":"solo","prompt":"Hi"}\n' >"$T/solo.jsonl"
run decode -m "$M" -t 2 -f "$T/solo.jsonl" -n 2 --shard 0/1
expect_status 0 "--shard 0/1 of one request"
expect_out_has '{"id":"solo","text":' "its line carries the id (JSON Lines)"

# --resume: a job cut off mid-line resumes to the same lines as one run.
head -n 3 "$T/alone.raw" >"$T/out.jsonl"
printf '{"id":"q9","text":"half a li' >>"$T/out.jsonl"
run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 8 --max-num-seqs 1 --resume "$T/out.jsonl"
expect_status 0 "--resume finishes the job"
expect_out_empty "results go to the file, not stdout"
expect_err_has "note: $T/out.jsonl: its unfinished last line (28 bytes) is cut off" "--resume says what it cut off"
sed 's/,"ttft_ms.*//' "$T/out.jsonl" | sort >"$T/resumed"
if cmp -s "$T/alone" "$T/resumed"; then pass "resumed lines equal one run's"; else fail "resumed lines differ"; fi
before=$(wc -l <"$T/out.jsonl")
run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 8 --max-num-seqs 1 --resume "$T/out.jsonl"
expect_status 0 "resuming a finished job"
if [ "$(wc -l <"$T/out.jsonl")" = "$before" ]; then pass "adds nothing"; else fail "a finished job grew"; fi
# A night with nothing to do (`gen | decode -f - --resume OUT` from cron):
# an empty input is a job of no request, as a shard given none is: exit 0,
# a note, the statistics; OUT keeps its lines (it was an error, and --stats
# was not written)
cp "$T/out.jsonl" "$T/night.jsonl"
run_sh "printf '' | decode -m '$M' -t 2 -f - -n 8 --resume '$T/night.jsonl' --stats='$T/night.json'"
expect_status 0 "an empty pipe with --resume: no request, exit 0"
expect_err_has "decode: note: -: no prompt in the file: no request to run" "a note says so"
expect_true "the results file is as it was" cmp -s "$T/out.jsonl" "$T/night.jsonl"
expect_true "--stats=FILE is written, of no request" grep -q '^{"requests":0,"kv_memory":0,' "$T/night.json"
printf '\n  \n' >"$T/blank.jsonl"
run decode -m "$M" -t 2 -f "$T/blank.jsonl" -n 8 --resume "$T/new.jsonl" --stats
expect_status 0 "blank lines alone, a new --resume file: exit 0"
expect_err_has "note: $T/blank.jsonl: no prompt in the file" "the note names the file"
expect_err_has "decode: 0 sequences, 0 tokens" "--stats says what ran: nothing"
expect_true "the new results file is there, empty" sh -c "test -f '$T/new.jsonl' && ! test -s '$T/new.jsonl'"
run decode -m "$M" -t 2 -f "$T/blank.jsonl" -n 8
expect_status 0 "blank lines alone to standard output: exit 0"
expect_out_empty "no result line"
# prefill's stream of an empty input holds no sequence; decode runs none
run_sh "printf '' | prefill -m '$M' -t 2 -f - | decode -m '$M' -t 2 -n 2 --stats"
expect_status 0 "prefill -f of an empty pipe into decode: exit 0"
expect_err_has "prefill: note: -: no prompt in the file: a stream of no sequences" "prefill says so"
expect_err_has "decode: 0 sequences, 0 tokens" "decode runs no request"
# A closed standard descriptor is no free number for the files opened
# after it: standard error closed, the field's note and the --stats
# summary went into the --resume file (descriptor 2); standard input
# closed, `-f -` read the model; standard output closed, prefill -o failed
printf '{"id":"n1","prompt":"Hi","max_token":3}\n' >"$T/note.jsonl"
run_sh "decode -m '$M' -t 2 -f '$T/note.jsonl' -n 2 --resume '$T/closed.jsonl' --stats 2>&-"
expect_status 0 "--resume with standard error closed"
if [ "$(wc -l <"$T/closed.jsonl")" = 1 ] && grep -q '^{"id":"n1",' "$T/closed.jsonl"; then
    pass "the results file holds the result line alone"
else
    fail "the results file holds more than the result: $(head -c 200 "$T/closed.jsonl")"
fi
run_sh "decode -m '$M' -t 2 -f - -n 1 <&-"
expect_status 1 "-f - with standard input closed fails"
expect_err_has "<stdin>: read at offset 0: Bad file descriptor" "reading it, not the model"
run_sh "decode -m '$M' -t 2 -f '$T/note.jsonl' -n 1 >&-"
expect_status 1 "results to a closed standard output fail"
expect_err_has "write error: Bad file descriptor" "says so"
run_sh "prefill -m '$M' -t 2 -f '$T/note.jsonl' -o '$T/closed.kvp' >&-"
expect_status 0 "prefill -o FILE with standard output closed"
printf 'not json\n' >"$T/bad.jsonl"
run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 1 --resume "$T/bad.jsonl"
expect_status 1 "a results file with a broken line is refused"
expect_err_has "bad.jsonl:1:1: invalid literal" "names the file, line and column (once)"
# --resume is read back and appended to: a regular file, not a stream
# (a pipe's reader waited on itself for ever), standard output or a device
mkfifo "$T/rfifo"
for r in - /dev/null "$T/rfifo"; do
    run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 1 --resume "$r"
    expect_status 2 "--resume $r: a usage error"
    expect_err_has "not a regular file" "--resume $r: says why"
done
rm -f "$T/rfifo"
test ! -e ./- || fail "--resume - made a file named -"
# ... nor standard output's own regular file: a log appended to (it would
# be parsed as results), or the results file itself (the shell emptied it)
echo "a log line" >"$T/so.log"
run_sh "decode -m '$M' -t 2 -f '$T/p.jsonl' -n 1 --resume /dev/stdout >>'$T/so.log'"
expect_status 2 "--resume /dev/stdout >> log: a usage error"
expect_err_has "is standard output's file" "--resume /dev/stdout: says why"
run_sh "decode -m '$M' -t 2 -f '$T/p.jsonl' -n 1 --resume '$T/so2.jsonl' >'$T/so2.jsonl'"
expect_status 2 "--resume FILE > FILE: a usage error"
prefill -m "$M" -t 2 -p hi -o "$T/r.kvp" 2>/dev/null
run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 1 --resume "$T/r.kvp"
expect_status 1 "--resume on a KV stream: refused"
expect_err_has "r.kvp: byte 9 is NUL: a binary file, not results" "--resume on a KV stream: named as binary"
# a prompts line's JSON fault: the file's line and column, once
printf '{"id":"a","prompt":"hi"}\n{"id":1,"prompt":"Hi","temperature":1e400}\n' >"$T/odd.jsonl"
run decode -m "$M" -t 2 -f "$T/odd.jsonl" -n 1
expect_status 1 "a number out of range: refused"
expect_err_has "odd.jsonl:2:37: \"temperature\": number out of range" "names the line and column once, and the field"

# Statistics or a KV stream into standard output's own file: the results
# are there (a usage error); into standard error's file, appended to what
# is there (written through the stream: a new file renamed over it had
# replaced the log)
run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 1 --json --stats=/dev/stdout
expect_status 2 "--stats=/dev/stdout with the results there: a usage error"
run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 1 --kv-out /dev/stdout
expect_status 2 "--kv-out /dev/stdout: a usage error"
# the null device keeps nothing: outputs thrown away together are no clash
run_sh "decode -m '$M' -t 2 -f '$T/p.jsonl' -n 1 --json --stats=/dev/null --kv-out /dev/null > /dev/null"
expect_status 0 "--stats, --kv-out and the results all to /dev/null"
expect_true "/dev/null is still the null device" test -c /dev/null
printf 'old line\n' >"$T/cron.log"
decode -m "$M" -t 2 -f "$T/p.jsonl" -n 1 --json --stats=/dev/stderr >/dev/null 2>>"$T/cron.log"
expect_true "--stats=/dev/stderr 2>> LOG keeps the log's lines" grep -qx "old line" "$T/cron.log"
expect_true "--stats=/dev/stderr 2>> LOG appends the statistics" grep -q '"requests":' "$T/cron.log"
printf 'HEAD\n' >"$T/appended.kvp"
prefill -m "$M" -t 2 -p hi -o /dev/stdout >>"$T/appended.kvp" 2>/dev/null
expect_true "prefill -o /dev/stdout >> FILE: appended" test "$(head -c 5 "$T/appended.kvp")" = "HEAD" -a \
    "$(wc -c <"$T/appended.kvp")" -eq $(($(wc -c <"$T/r.kvp") + 5))

# --progress: lines on stderr (not a terminal here: one a line, none on
# stdout), the last with the whole job done; the job's total follows
# --shard and --resume, and is left out where the input does not say it.
last_progress() { tail -n 1 "$ERR"; }
run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 4 --progress=0.001
expect_status 0 "--progress"
case $(last_progress) in
"decode: 10 of 10 requests (100.0%), 0 running, 0 waiting; "*" elapsed") pass "the last line has the job done" ;;
*) fail "last progress line: $(last_progress)" ;;
esac
n=$(grep -c '^decode: [0-9]* of 10 requests ([0-9.]*%), [0-9]* running, [0-9]* waiting; [0-9]* tok/s out' "$ERR")
if [ "$n" -ge 2 ]; then pass "a line as the job goes ($n lines)"; else fail "$n progress lines"; fi
if [ "$(wc -l <"$OUT")" = 10 ] && ! grep -q '^decode:' "$OUT"; then pass "stdout holds the results alone"
else fail "stdout: $(head -c 200 "$OUT")"; fi
run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 1 --shard 1/4 --progress
case $(last_progress) in "decode: 3 of 3 requests (100.0%)"*) pass "--shard 1/4 of 10: 3 to do" ;;
*) fail "shard progress: $(last_progress)" ;; esac
head -n 3 "$T/alone.raw" >"$T/prog.jsonl"
run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 8 --max-num-seqs 1 --resume "$T/prog.jsonl" --progress=0.001
case $(last_progress) in "decode: 7 of 7 requests (100.0%)"*) pass "--resume: the 7 not done before" ;;
*) fail "resume progress: $(last_progress)" ;; esac
# done ids late in the file: the total is right from the first line on
tail -n 4 "$T/alone.raw" >"$T/prog2.jsonl"
run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 8 --max-num-seqs 1 --resume "$T/prog2.jsonl" --progress=0.001
if grep '^decode: ' "$ERR" | grep -qv ' of 6 request'; then fail "a line with another total: $(grep -v ' of 6 ' "$ERR" | head -2)"
else pass "--resume with the done ids last: 6 to do in every line"; fi
run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 8 --max-num-seqs 1 --resume "$T/prog2.jsonl" --progress
case $(last_progress) in "decode: 0 of 0 requests (100.0%)"*) pass "--resume with all done: 0 of 0" ;;
*) fail "all-done progress: $(last_progress)" ;; esac
run decode -m "$M" -f "$T/p.jsonl" --progress 5
expect_status 2 "--progress 5 (two words) is a usage error"
expect_err_has "--progress=5" "says to write --progress=5"
run_sh "decode -m '$M' -t 2 -f - -n 1 --progress < '$T/p.jsonl'"
case $(last_progress) in "decode: 10 requests, 0 running"*) pass "standard input: no total" ;;
*) fail "stdin progress: $(last_progress)" ;; esac
run decode -m "$M" -t 2 -p "Say hello." -n 2 --progress
case $(last_progress) in "decode: 1 of 1 request (100.0%)"*) pass "one prompt: a total of 1" ;;
*) fail "one-prompt progress: $(last_progress)" ;; esac

# Killed (SIGKILL) at random moments and resumed until done: the same lines.
rm -f "$T/killed.jsonl"
seed=7
for round in 1 2 3 4 5 6 7 8 9 10 11 12; do
    decode -m "$M" -t 2 -f "$T/p.jsonl" -n 8 --max-num-seqs 1 --resume "$T/killed.jsonl" >/dev/null 2>&1 &
    pid=$!
    seed=$(( (seed * 1103515245 + 12345) % 2147483648 ))
    sleep "0.$(( 3 + seed % 7 ))"
    kill -9 $pid 2>/dev/null
    wait $pid 2>/dev/null
done
run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 8 --max-num-seqs 1 --resume "$T/killed.jsonl"
expect_status 0 "the last resume completes"
sed 's/,"ttft_ms.*//' "$T/killed.jsonl" | sort >"$T/killed"
if cmp -s "$T/alone" "$T/killed"; then pass "killed 12 times, resumed: the same lines as one run"
else fail "killed and resumed: lines differ ($(wc -l <"$T/killed.jsonl") lines)"; fi

# SIGTERM: the step in progress ends, what finished is written, exit 143.
rm -f "$T/term.jsonl"
# (long enough at any speed: 200 tokens each, one at a time; the signal
# comes once the first has been written)
decode -m "$M" -t 2 -f "$T/p.jsonl" -n 200 --ignore-eos --max-num-seqs 1 --resume "$T/term.jsonl" \
    --stats="$T/term.json" >/dev/null 2>"$T/term.err" &
pid=$!
i=0
while [ ! -s "$T/term.jsonl" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
kill -TERM $pid
wait $pid
status=$?
LAST_CMD="decode ... --resume term.jsonl, then SIGTERM"
expect_status 143 "SIGTERM exits 143"
if grep -q "stopped by" "$T/term.err" && grep -q "not finished.*; run again with --resume" "$T/term.err"; then
    pass "says how many remain and how to go on"
else fail "SIGTERM message: $(cat "$T/term.err")"; fi
if [ ! -s "$T/term.jsonl" ] || [ "$(tail -c 1 "$T/term.jsonl" | od -An -c | tr -d ' ')" = '\n' ]; then
    pass "only whole lines were written"
else fail "a half line after SIGTERM"; fi
# the statistics count the finished requests alone, their gaps (ITL) too:
# the one cut off by the signal counts in none
nreq=$(sed -n 's/.*"requests":\([0-9]*\).*/\1/p' "$T/term.json")
nitl=$(sed -n 's/.*"itl_ms":{"n":\([0-9]*\).*/\1/p' "$T/term.json")
expect_true "a stopped job's ITL holds its $nreq finished requests' 199 gaps each (n $nitl)" \
    test -n "$nreq" -a "$nreq" -ge 1 -a "$nitl" = "$((nreq * 199))"

# prefill | decode: decode takes each sequence as it arrives; the text is
# what decode alone gives, and the stream carries each request's arrival and
# first-token times (wall clock) so decode's TTFT counts prefill too.
run_sh "prefill -m '$M' -t 2 -f '$T/p.jsonl' | decode -m '$M' -t 2 -n 8 --max-num-seqs 1"
expect_status 0 "prefill | decode"
lines >"$T/piped"
if cmp -s "$T/alone" "$T/piped"; then pass "prefill | decode gives decode's own text"; else fail "prefill | decode differs"; fi
run prefill -m "$M" -t 2 -f "$T/p.jsonl" -o "$T/p.kvp"
run kvdump --json "$T/p.kvp"
if grep -q '"arrival_ns":1[0-9]\{18\}' "$OUT" && grep -q '"first_token_ns":1[0-9]\{18\}' "$OUT"; then
    pass "sequence records carry arrival and first-token times"
else fail "no times in the sequence records"; fi

# The prefix cache across requests: one after another (nothing shared while
# running), a later request reuses the blocks of an earlier one's system
# prompt; --no-prefix-cache computes them again; salts keep tenants apart.
sys=$(i=0; while [ $i -lt 40 ]; do printf 'Rule %d: be brief. ' $i; i=$((i + 1)); done)
{
    printf '{"id":"s1","messages":[{"role":"system","content":"%s"},{"role":"user","content":"Name a fruit."}]}\n' "$sys"
    printf '{"id":"s2","messages":[{"role":"system","content":"%s"},{"role":"user","content":"Name a color."}]}\n' "$sys"
} >"$T/sys.jsonl"
run decode -m "$M" -t 2 -f "$T/sys.jsonl" -n 2 --max-num-seqs 1 --stats="$T/sys.json"
expect_status 0 "requests with one system prompt"
if grep -q '"cached_prompt_tokens":[1-9]' "$T/sys.json"; then pass "the second reuses the first one's blocks"
else fail "no prefix reuse: $(cat "$T/sys.json")"; fi
run decode -m "$M" -t 2 -f "$T/sys.jsonl" -n 2 --max-num-seqs 1 --no-prefix-cache --stats="$T/sys.json"
if grep -q '"cached_prompt_tokens":0,' "$T/sys.json"; then pass "--no-prefix-cache computes all"; else fail "reuse with --no-prefix-cache"; fi
sed 's/"messages"/"cache_salt":"tenant-a","messages"/; 2s/tenant-a/tenant-b/' "$T/sys.jsonl" >"$T/salted.jsonl"
run decode -m "$M" -t 2 -f "$T/salted.jsonl" -n 2 --max-num-seqs 1 --stats="$T/sys.json"
if grep -q '"cached_prompt_tokens":0,' "$T/sys.json"; then pass "different cache salts share nothing"
else fail "blocks shared across salts: $(cat "$T/sys.json")"; fi
run decode -m "$M" -t 2 -f "$T/sys.jsonl" -n 2 --max-num-seqs 1 --cache-salt tenant-c --stats="$T/sys.json"
if grep -q '"cached_prompt_tokens":[1-9]' "$T/sys.json"; then pass "one salt for all: shared among them"
else fail "--cache-salt stopped sharing within its tenant"; fi

# --rate: requests released over time still all complete (timings are
# scripts/bench-serve's business, not a test's)
run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 2 --rate 50 --burstiness 0.5 --seed 3 --stats --json
expect_status 0 "requests released at a rate"
if [ "$(grep -c '"finish_reason"' "$OUT")" = 10 ]; then pass "all 10 answered"; else fail "not all answered"; fi
# a line a pipe gives after its time in the schedule arrives when it is
# read: its TTFT does not count the seconds before it was written (it
# counted the pipe's 2 s pause)
run_sh "(printf '{\"prompt\":\"Hi\"}\\n'; sleep 2; printf '{\"prompt\":\"Yo\"}\\n') | decode -m '$M' -t 2 -f - -n 2 --rate 100 --json"
expect_status 0 "--rate with a late line on a pipe"
late=$(sed -n '2s/.*"ttft_ms":\([0-9.]*\).*/\1/p' "$OUT")
expect_true "the late line's TTFT counts from when it was read (${late:-none} ms)" \
    awk -v t="${late:-99999}" 'BEGIN { exit !(t < 1000) }'
run decode -m x.gguf -p hi --rate 0
expect_status 2 "--rate 0 is a usage error"

# A request line's own parameters override the command line's.
cat >"$T/params.jsonl" <<'J'
{"id":"a","prompt":"The capital of France is","max_tokens":3}
{"id":"b","prompt":"The capital of France is","stop":["United"],"max_tokens":40}
{"id":"c","prompt":"Once upon a time","temperature":0.8,"seed":5,"max_tokens":6}
{"id":"d","prompt":"Once upon a time","temperature":0.8,"seed":5,"max_tokens":6}
{"id":"e","prompt":"Once upon a time","temperature":0.8,"max_tokens":6}
J
run decode -m "$M" -t 2 -f "$T/params.jsonl" -n 10 --max-num-seqs 1
expect_status 0 "requests with their own parameters"
expect_out_has '"id":"a","text":" Paris.\n","tokens":3,"finish_reason":"length"' "max_tokens 3 of the line, not -n 10"
expect_out_has '"id":"b","text":" Paris.\n\nThe ","tokens":6,"finish_reason":"stop_string"' "the line's stop string"
c=$(grep '"id":"c"' "$OUT" | sed 's/.*"text"//; s/,"ttft.*//')
d=$(grep '"id":"d"' "$OUT" | sed 's/.*"text"//; s/,"ttft.*//')
if [ -n "$c" ] && [ "$c" = "$d" ]; then pass "the same seed draws the same text"; else fail "seed 5 twice: $c / $d"; fi
expect_out_has '"id":"e","text"' "a line without a seed samples too"

# A field no request has is passed over with a note, once a name at its
# first line (a misspelt "max_token" left the default budget unseen).
printf '%s\n' '{"id":"u1","prompt":"Hi","max_token":3,"model":"x"}' '{"id":"u2","prompt":"Hi","max_token":3}' \
    '{"id":"u3","prompt":"Hi","user":"me"}' >"$T/unknown.jsonl"
run decode -m "$M" -t 2 -n 2 -f "$T/unknown.jsonl" --json
expect_status 0 "unknown fields are passed over"
expect_err_has 'decode: note: '"$T"'/unknown.jsonl:1: "max_token" is not a request field' "the misspelt field, its line"
expect_err_has 'unknown.jsonl:3: "user" is not a request field' "each name at its first line"
n=$(grep -c 'is not a request field' "$ERR")
expect_true "each name once ($n notes for max_token, model, user)" test "$n" -eq 3
n=$(grep -c '"finish_reason"' "$OUT")
expect_true "every request answered ($n)" test "$n" -eq 3

# Several stop strings that end inside one token (" Paris"): the text is
# cut at the earliest, whatever their order; no stop string is left in it.
for order in "--stop ris --stop Pa" "--stop Pa --stop ris"; do
    run decode -m "$M" -t 2 -n 8 -p "The capital of France is" --json $order
    expect_out_has '"text":" ","tokens":1,"finish_reason":"stop_string"' "$order: cut before Pa"
done
printf '%s\n' '{"id":"s","prompt":"The capital of France is","stop":["ris","Pa"],"max_tokens":8}' >"$T/stops.jsonl"
run decode -m "$M" -t 2 -f "$T/stops.jsonl" --json
expect_out_has '"id":"s","text":" ","tokens":1,"finish_reason":"stop_string"' "a line's stop list: the earliest too"
printf '{"id":"x","prompt":"hi"}\n{"id":"y","prompt":"hi","top_p":2}\n' >"$T/badp.jsonl"
run decode -m "$M" -t 2 -f "$T/badp.jsonl"
expect_status 1 "a bad request parameter is refused"
expect_err_has 'badp.jsonl:2: "top_p" must be a number in [1e-06, 1]' "names file, line and field"
printf '{"id":"y","prompt":"hi","stop":[1,2]}\n' >"$T/badp.jsonl"
run decode -m "$M" -t 2 -f "$T/badp.jsonl"
expect_err_has 'badp.jsonl:1: "stop" entry 0 is not a string' "a stop that is not a string"

# A KV stream's sequences read ahead hold their blocks while they wait:
# one that fits the cache alone takes those back (they compute their
# prompts when they run) rather than end for memory.  4 prompts of 12
# tokens, 24 more each: 3 blocks of 16 a sequence, the whole cache.
i=1
while [ $i -le 4 ]; do
    printf '{"id":%d,"prompt":"Tell me a story about the sea, part %d."}\n' $i $i
    i=$((i + 1))
done >"$T/sea.jsonl"
run decode -m "$M" -t 2 -f "$T/sea.jsonl" -n 24 --ignore-eos --kv-blocks 3 --max-num-seqs 1 --json
expect_status 0 "4 prompts through a cache that holds one sequence"
sed 's/,"ttft_ms.*//' "$OUT" >"$T/sea.want"
run_sh "prefill -m '$M' -t 2 -f '$T/sea.jsonl' | decode -m '$M' -t 2 -n 24 --ignore-eos --kv-blocks 3 --max-num-seqs 1 --json --stats=$T/sea.stats"
expect_status 0 "the same through a KV stream: the waiting sequences give their blocks back"
sed 's/,"ttft_ms.*//' "$OUT" >"$T/sea.got"
expect_true "the stream's outputs are the prompts' (no kv_memory)" cmp -s "$T/sea.want" "$T/sea.got"
expect_true "the blocks given back count as preemptions" grep -q '"preemptions":[1-9]' "$T/sea.stats"
# one that cannot fit ends at the length it reached (33 of 9 + 64 in two
# blocks): kvcalc --check does not take that length for what it asked
run decode -m "$M" -t 2 -p "Tell me a long story about a dragon." -n 64 --ignore-eos --kv-blocks 2 --stats="$T/km.json"
expect_status 1 "a sequence longer than the cache"
run kvcalc --check "$T/km.json"
expect_status 0 "kvcalc --check agrees with a run whose longest request ran out of the pool"
expect_out_has "the longest filled the pool" "and says why kv_memory is not judged"

# --kv-out and a prompt that asks for no token: it ran no step, so it has
# no KV to keep, and its absence is said
printf '{"id":"z","prompt":"Hi there","max_tokens":0}\n{"id":"y","prompt":"Hello","max_tokens":2}\n' >"$T/z.jsonl"
run decode -m "$M" -t 2 -f "$T/z.jsonl" --kv-out "$T/z.kvp"
expect_status 0 "max_tokens 0 with --kv-out"
expect_err_has "leaves out 1 request that asked for no token (max_tokens 0)" "the request left out is said"

# A prompt longer than the whole cache ends alone; the others complete.
long=$(i=0; while [ $i -lt 60 ]; do printf 'word%d ' $i; i=$((i + 1)); done)
{
    printf '{"id":"short1","prompt":"The capital of France is"}\n'
    printf '{"id":"long","prompt":"%s"}\n' "$long"
    printf '{"id":"short2","prompt":"The sky is"}\n'
} >"$T/mix.jsonl"
run decode -m "$M" -t 2 -f "$T/mix.jsonl" -n 4 --kv-blocks 6 --block-size 8
expect_status 1 "a sequence that cannot fit is a failure of the job"
expect_out_has '"id":"long","text":"","tokens":0,"finish_reason":"kv_memory"' "it ends with finish_reason kv_memory"
expect_out_has '"id":"short1"' "the one before it completes"
expect_out_has '"id":"short2"' "the one after it completes"
expect_err_has "sequence long: KV cache out of blocks" "the message names the sequence"
expect_err_has "1 of 3 sequences did not fit" "and says how many"
# an id is escaped in a message: a newline in it split the message in two
python3 -c 'import json; print(json.dumps({"id": "a\nb", "prompt": "word " * 100}))' >"$T/nl.jsonl"
run decode -m "$M" -t 2 -f "$T/nl.jsonl" -n 2 --kv-blocks 2
expect_status 1 "kv_memory, an id with a newline"
expect_err_has 'decode: sequence a\nb: KV cache out of blocks' "the message escapes the id"
expect_true "and stays one line" sh -c '! grep -q "^b: KV cache" "$1"' _ "$ERR"
printf '{"id":"a\\nb","prompt":""}\n' >"$T/nl-empty.jsonl"
run decode -m "$M" -t 2 -f "$T/nl-empty.jsonl"
expect_status 1 "an empty prompt whose id holds a newline"
expect_err_one_line "its error is one line"
expect_err_has 'nl-empty.jsonl:1: prompt a\nb is empty' "the id escaped in it"
# its E2E counts, arrival to when it was ended (e2e_ms left it out: n 2)
run decode -m "$M" -t 2 -f "$T/mix.jsonl" -n 4 --kv-blocks 6 --block-size 8 --stats="$T/mix.json"
expect_status 1 "kv_memory with --stats=FILE"
expect_true "e2e_ms counts all 3 requests, ttft_ms the 2 that answered" \
    grep -q '"requests":3,"kv_memory":1,.*"ttft_ms":{"n":2,.*"e2e_ms":{"n":3,' "$T/mix.json"
# A request that cannot fit alone has no KV to keep: left out, the others kept
run decode -m "$M" -t 2 -f "$T/mix.jsonl" -n 4 --kv-blocks 6 --block-size 8 --kv-out "$T/mix.kvp"
expect_status 1 "--kv-out with a sequence that cannot fit: a failure of the job"
expect_err_has "mix.kvp holds the other 2" "says what the stream holds"
run kvdump -s "$T/mix.kvp"
expect_status 0 "the stream is written"
expect_out_has "sequence   2" "with the two that fit"
rm -f "$T/mix.kvp"

# Under --resume a sequence that did not fit is not written: the job run
# again with a larger cache (as the message advises) retries it.
rm -f "$T/kvres.jsonl"
run decode -m "$M" -t 2 -f "$T/mix.jsonl" -n 4 --kv-blocks 6 --block-size 8 --resume "$T/kvres.jsonl"
expect_status 1 "kv_memory under --resume"
expect_err_has "not written to the --resume file" "says it was left out"
expect_true "the two that fit are written" test "$(wc -l <"$T/kvres.jsonl")" -eq 2
expect_true "the one that did not is not" sh -c "! grep -q '\"id\":\"long\"' '$T/kvres.jsonl'"
run decode -m "$M" -t 2 -f "$T/mix.jsonl" -n 4 --kv-blocks 64 --block-size 8 --resume "$T/kvres.jsonl"
expect_status 0 "resumed with more KV memory"
expect_true "the long one now ran" grep -q '"id":"long","text":".*"finish_reason":"length"' "$T/kvres.jsonl"
expect_true "three lines in all" test "$(wc -l <"$T/kvres.jsonl")" -eq 3

# Goodput: an SLO nobody meets
run decode -m "$M" -t 2 -f "$T/mix.jsonl" -n 2 --slo-ttft 0.001 --min-goodput 0.5 --stats
expect_status 3 "goodput below --min-goodput exits 3"
expect_err_has "goodput 0.0000 (0 of 3 requests within TTFT 0.001 ms)" "the summary reports goodput, and the bound as given"
expect_err_has "is below --min-goodput" "says why it failed"
# The text summary of a job with no request (a shard given none) and of a
# one-token answer (no TPOT, no ITL): a value no request gave reads "-",
# as the JSON's null, never nan.
printf '{"id":"one","prompt":"Hi"}\n' >"$T/one.jsonl"
run decode -m "$M" -t 2 -f "$T/one.jsonl" -n 2 --shard 1/2 --stats
expect_status 0 "a shard with no request, --stats"
expect_err_has "decode: TTFT         -        -        -        -" "its summary's TTFT row reads -"
expect_err_has "decode: E2E          -        -        -        -" "and its E2E row"
expect_true "no nan in the summary" sh -c "! grep -q ' nan' '$ERR'"
# no request: goodput is undefined (null, "-"), and --min-goodput gates
# nothing, saying so rather than passing it as a perfect 1
run decode -m "$M" -t 2 -f "$T/one.jsonl" -n 2 --shard 1/2 --slo-ttft 100 --min-goodput 0.9 --stats
expect_status 0 "no request with --min-goodput: nothing to gate, exit 0"
expect_err_has "decode: goodput - (0 of 0 requests within TTFT 100 ms" "the text summary's goodput reads -"
expect_err_has "note: no requests, so no goodput: --min-goodput 0.9000 gates nothing" "and a note says why"
run decode -m "$M" -t 2 -f "$T/one.jsonl" -n 2 --shard 1/2 --slo-ttft 100 --stats="$T/empty-stats.json"
expect_true "--stats JSON: goodput null with no request" grep -q '"good_requests":0,"goodput":null,' "$T/empty-stats.json"
expect_true "--stats JSON: the TPOT objective not given is null, not 0 ms" \
    grep -q '"slo_ttft_ms":100.000,"slo_tpot_ms":null,' "$T/empty-stats.json"
expect_err_lacks "TPOT 0 ms" "the text names only the objective given"
run decode -m "$M" -t 2 -f "$T/one.jsonl" -n 1 --stats
expect_err_has "decode: TPOT         -        -        -        -" "a one-token answer's TPOT row reads -"
expect_true "no nan there either" sh -c "! grep -q ' nan' '$ERR'"
run decode -m "$M" -t 2 -f "$T/mix.jsonl" -n 2 --slo-ttft 1000000 --min-goodput 1
expect_status 0 "an SLO everyone meets exits 0"
# A failure outranks a missed SLO: a sequence that did not fit exits 1 even
# when goodput is short too, and both are said.
run decode -m "$M" -t 2 -f "$T/mix.jsonl" -n 4 --kv-blocks 6 --block-size 8 --slo-ttft 1000000 --min-goodput 1
expect_status 1 "kv_memory and a goodput miss: exit 1, not 3"
expect_err_has "is below --min-goodput" "the goodput miss is said"
expect_err_has "1 of 3 sequences did not fit" "and the failure"

# --max-model-len (default: the model's trained context) bounds a sequence:
# generation ends there, a longer prompt is refused at its line, and no more
# than the model was trained for can be asked.
printf '{"id":"a","prompt":"hi"}\n{"id":"b","prompt":"The capital of France is a city"}\n' >"$T/ctx.jsonl"
run decode -m "$M" -t 2 -p "The capital of France is" -n 20 --max-model-len 8 --json
expect_status 0 "--max-model-len 8"
expect_out_has '"tokens":3,"finish_reason":"length"' "a 5-token prompt generates 3 tokens, ending by length"
run decode -m "$M" -t 2 -f "$T/ctx.jsonl" -n 4 --max-model-len 5
expect_status 1 "a prompt longer than --max-model-len"
expect_out_has '"id":"a"' "the request before it is answered"
expect_err_has "ctx.jsonl:2: prompt b is 7 tokens, more than a sequence may hold (5:" "the line and sizes are named"
run decode -m "$M" -t 2 -p "The capital of France is a city" -n 4 --max-model-len 5
expect_status 1 "-p: a prompt longer than --max-model-len"
expect_err_has "decode: the prompt is 7 tokens, more than" "-p's prompt is 'the prompt' (its id is 0: no count)"
run_sh "prefill -m '$M' -t 2 -p 'The capital of France is' | decode -m '$M' -t 2 -n 20 --max-model-len 7 --json"
expect_out_has '"tokens":2,"finish_reason":"length"' "a KV stream's sequence is bounded too"
# a prompt over it is refused through a stream as with -f, naming the
# stream and the sequence, after the one before it is answered
run_sh "prefill -m '$M' -t 2 -f '$T/ctx.jsonl' -o '$T/ctx.kvp' && decode -m '$M' -t 2 -n 4 --max-model-len 5 '$T/ctx.kvp'"
expect_status 1 "a stream's prompt longer than --max-model-len"
expect_out_has '"id":"a"' "the stream's sequence before it is answered"
expect_err_has "ctx.kvp: sequence 1 \"b\" is 7 tokens, more than a sequence may hold (5:" \
    "the stream, sequence (as kvdump lists it) and sizes are named"
run decode -m "$M" -t 2 -p hi --max-model-len 100000
expect_status 1 "--max-model-len above the trained context"
expect_err_has "trained context of 8192 tokens" "says the model's"
run decode -m "$M" -t 2 -p "The capital of France is a city" -n 4 --max-model-len 5
expect_err_has "(5: --max-model-len)" "a prompt over --max-model-len names it as the limit"
# a sliding window shorter than the context (Mistral's kind; the engine
# attends over every position): sequences are held to the window, said
# once; a prompt over it is refused naming the window
"$KVP_UNIT_DIR/test_convert" --write-gguf "$T/window.gguf" window || fail "could not write the windowed GGUF"
run decode -m "$T/window.gguf" -p abab -n 20 --json
expect_status 0 "a windowed model runs"
expect_out_has '"tokens":2,"finish_reason":"length"' "4 prompt tokens and 2 more fill the window of 6"
expect_err_has "attends over a sliding window of 6 tokens, which this engine does not apply: sequences are held to 6" \
    "the window is noted"
run decode -m "$T/window.gguf" -p abababab -n 4
expect_status 1 "a prompt over the window"
expect_err_has "the prompt is 8 tokens, more than a sequence may hold (6: the model's sliding window" \
    "the window is named as the limit"
run prefill -m "$T/window.gguf" -p abababab -o "$T/w.kvp"
expect_status 1 "prefill: a prompt over the window"
expect_err_has "8 tokens are more than the model's sliding window (which the engine does not apply) of 6" \
    "prefill names the window too"
run decode -m "$T/window.gguf" -p ab --max-model-len 7
expect_status 1 "--max-model-len past the window"
expect_err_has "above $T/window.gguf's sliding window of 6 tokens" "names the window"

# Usage errors for options that would otherwise be silently lenient or ignored
for bad in 0/-1 1/4294967298 0/4294967297 0/99999999999999999999 " 1/3" "1/ 3" +1/3 1/3x 0x1/3 /3 1/; do
    run decode -m x.gguf -p hi --shard "$bad"
    expect_status 2 "--shard '$bad' is a usage error"
done
run decode -m x.gguf -p hi --kv-mem 0
expect_status 2 "--kv-mem 0 is a usage error"
run decode -m x.gguf -p hi --kv-mem 1M --kv-blocks 8
expect_status 2 "--kv-mem with --kv-blocks is a usage error"
expect_err_has "give one" "says to give one"
run decode -m x.gguf -p hi --stop ""
expect_status 2 "--stop '' is a usage error"
run decode -m x.gguf -p hi --stop "$(printf '\360\237')"
expect_status 2 "--stop of invalid UTF-8 is a usage error, as -p's"
expect_err_has "--stop: invalid UTF-8 at byte offset 0" "names the option and the byte"
run decode -m x.gguf -p hi --resume "$T/r.jsonl" --kv-out "$T/r.kvp"
expect_status 2 "--resume with --kv-out"
expect_err_has "--resume and --kv-out at once" "says why"
run decode -m x.gguf -p hi --stats=
expect_status 2 "--stats= (no name) is a usage error"
run decode -m x.gguf -f "$T/p.jsonl" --burstiness 0.5
expect_status 2 "--burstiness without --rate is a usage error"
run decode -m x.gguf -f "$T/p.jsonl" --resume "$T/p.jsonl"
expect_status 2 "--resume naming the prompts file is a usage error"
# no output option may replace the job's input, not through a symlink nor
# through standard input either; the input is left as it was
cp "$T/p.jsonl" "$T/keep.jsonl"
ln -sf "$T/keep.jsonl" "$T/keep-link.jsonl"
run decode -m x.gguf -f "$T/keep.jsonl" --kv-out -
expect_status 2 "--kv-out - (standard output carries the results) is a usage error"
expect_err_has "give --kv-out a file" "says what to give"
run decode -m x.gguf -f "$T/keep.jsonl" --kv-out "$T/keep-link.jsonl"
expect_status 2 "--kv-out naming the prompts file (a symlink to it) is a usage error"
expect_err_has "is the prompts file" "says why"
run decode -m x.gguf -f "$T/keep.jsonl" --stats="$T/keep.jsonl"
expect_status 2 "--stats=FILE naming the prompts file is a usage error"
run_sh "decode -m x.gguf -f - --stats='$T/keep.jsonl' < '$T/keep.jsonl'"
expect_status 2 "--stats=FILE naming the file standard input reads is a usage error"
run prefill -m x.gguf -f "$T/keep.jsonl" -o "$T/keep-link.jsonl"
expect_status 2 "prefill -o naming the prompts file is a usage error"
expect_err_has "-o $T/keep-link.jsonl is the prompts file" "names the option and file"
# ... nor standard output (`>>` onto the prompts: decode read its own
# results back as prompts), nor a --stats symlink dangling at the output
run_sh "decode -m x.gguf -f '$T/keep.jsonl' >> '$T/keep.jsonl'"
expect_status 2 "decode appending its results to its prompts file is a usage error"
expect_err_has "standard output is $T/keep.jsonl, the prompts file" "says which file"
run_sh "prefill -m x.gguf -f '$T/keep.jsonl' >> '$T/keep.jsonl'"
expect_status 2 "prefill appending its stream to its prompts file is a usage error"
run_sh "decode -m '$T/keep.jsonl' -p hi >> '$T/keep.jsonl'"
expect_status 2 "decode appending to its model file is a usage error"
expect_err_has "the model" "names the model"
if cmp -s "$T/p.jsonl" "$T/keep.jsonl"; then pass "the prompts file is untouched"; else fail "the prompts file changed"; fi
ln -sf "$T/r-new.jsonl" "$T/stats-link.json"
run decode -m x.gguf -f "$T/keep.jsonl" --resume "$T/r-new.jsonl" --stats="$T/stats-link.json"
expect_status 2 "--stats through a symlink dangling at the --resume file is a usage error"
expect_err_has "is the --resume results file" "says why"
run prefill -m x.gguf -f "$T/keep.jsonl" -o "$T/r-new.jsonl" --stats="$T/stats-link.json"
expect_status 2 "prefill --stats through a symlink dangling at -o is a usage error"
expect_true "nothing was written through the link" test ! -e "$T/r-new.jsonl"
# a line's empty stop string is refused at its line, as --stop '' is
printf '{"id":"a","prompt":"hi","stop":["x",""]}\n' >"$T/stop0.jsonl"
run decode -m "$M" -t 2 -f "$T/stop0.jsonl" -n 2
expect_status 1 "a line's empty stop string is an error"
expect_err_has 'stop0.jsonl:1: "stop" entry 1 is an empty string' "at its line"
run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 2 --stats="$T/missing/s.json"
expect_status 1 "--stats into a missing folder fails"
expect_out_empty "before any work"

# SIGTERM while decode waits for input on a pipe ends it at once (exit 143),
# and a second job resuming into the same file is refused while it runs.
# One line is written: decode answers it without waiting for a second.
rm -f "$T/fifo" "$T/wait.jsonl"
mkfifo "$T/fifo"
decode -m "$M" -t 2 -f "$T/fifo" -n 2 --resume "$T/wait.jsonl" >/dev/null 2>"$T/wait.err" &
pid=$!
exec 7>"$T/fifo"
head -n 1 "$T/p.jsonl" >&7
i=0
while [ "$(wc -l <"$T/wait.jsonl" 2>/dev/null || echo 0)" -lt 1 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
run decode -m "$M" -t 2 -f "$T/p.jsonl" -n 2 --resume "$T/wait.jsonl"
expect_status 1 "a second decode resuming into a file in use"
expect_err_has "another decode is resuming into it" "says why"
kill -TERM $pid
i=0
while kill -0 $pid 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
if kill -0 $pid 2>/dev/null; then
    fail "SIGTERM while waiting for input: still running 10 s later"
    kill -KILL $pid
fi
wait $pid
status=$?
exec 7>&-
LAST_CMD="decode -f FIFO --resume wait.jsonl, SIGTERM while it waits"
expect_status 143 "SIGTERM while waiting for input exits 143 at once"
expect_true "the request it had is written" test "$(wc -l <"$T/wait.jsonl")" -eq 1
expect_true "and it says it was stopped, input left unread" \
    grep -q "stopped by Terminated: 1 sequences written, 0 read and not finished, the rest of the input not read yet" \
    "$T/wait.err"

# SIGTERM before the first request has come (a FIFO no writer has opened
# yet, or a KV stream on a pipe with nothing in it yet): the job ends as a
# stop, and --stats=FILE is written all the same (no request, stopped, the
# pool the options size), whole, as a monitoring job expects of every run.
rm -f "$T/fifo" "$T/s0.json"
mkfifo "$T/fifo"
decode -m "$M" -t 2 -f "$T/fifo" -n 2 --slo-ttft 500 --stats="$T/s0.json" >"$OUT" 2>"$ERR" &
term_when_waiting $! "SIGTERM before a writer opened -f FIFO"
LAST_CMD="decode -f FIFO --stats=FILE, SIGTERM before any writer opened the FIFO"
expect_status 143 "SIGTERM before the first request exits 143"
expect_err_has "stopped by Terminated: 0 sequences written, 0 read and not finished" "and says it was stopped"
expect_true "--stats=FILE is written" grep -q '^{"requests":0,"kv_memory":0,' "$T/s0.json"
expect_true "it says stopped, prompts, no request and the SLO" \
    grep -q '"input":"prompts",.*"stopped":true,.*"max_seq_len":0,.*"slo_ttft_ms":500.000,' "$T/s0.json"
expect_true "with the pool the options size (the model's context: 512 blocks of 16)" \
    grep -q '"kv_blocks":512,"block_size":16,' "$T/s0.json"
if ls "$T"/s0.json.tmp.* >/dev/null 2>&1; then fail "a temporary stats file was left"; else pass "written whole"; fi
run kvcalc --check "$T/s0.json"
expect_status 0 "kvcalc --check reads it"
rm -f "$T/s1.json"
decode -m "$M" -t 2 -n 2 --stats="$T/s1.json" <"$T/fifo" >"$OUT" 2>"$ERR" &
pid=$!
exec 7>"$T/fifo"
term_when_waiting $pid "SIGTERM before a KV stream's first byte"
exec 7>&-
LAST_CMD="decode --stats=FILE < FIFO (a KV stream not begun), SIGTERM"
expect_status 143 "SIGTERM before a KV stream's first sequence exits 143"
expect_true "--stats=FILE is written" grep -q '"requests":0,.*"input":"kvp",.*"stopped":true,' "$T/s1.json"
rm -f "$T/fifo"

# SIGTERM while the model loads (decode(1), SIGINT): the load goes on, then
# the job stops before reading its input, as above.  The model path is a
# FIFO, so the load waits in open(2) for a writer until the signal has
# come; then the whole model comes through it (the bytes read to tell the
# format are kept for the GGUF reader).
# term_in_load: decode started on a model FIFO no one writes yet (its
# load waits in open(2)), SIGTERM once it catches signals; its pid in $pid
term_in_load() {
    rm -f "$T/mfifo" "$T/s2.json"
    mkfifo "$T/mfifo"
    decode -m "$T/mfifo" -t 2 -f "$T/p.jsonl" -n 2 --stats="$T/s2.json" >"$OUT" 2>"$ERR" &
    pid=$!
    wait_catching $pid
    kill -TERM $pid
    sleep 0.3
}
term_in_load
cat "$M" >"$T/mfifo" 2>/dev/null &
catpid=$!
wait_exit $pid "SIGTERM while the model loads"
kill $catpid 2>/dev/null # (only when decode never opened the FIFO)
wait $catpid 2>/dev/null
LAST_CMD="decode -m FIFO -f p.jsonl --stats=FILE, SIGTERM while it waits in the model load"
expect_status 143 "SIGTERM during the model load exits 143"
expect_err_has "stopped by Terminated: 0 sequences written, 0 read and not finished" "once loaded, says it was stopped"
expect_out_empty "no request was run"
expect_true "--stats=FILE is written" grep -q '^{"requests":0,.*"input":"prompts",.*"stopped":true,' "$T/s2.json"
# a second signal during the load ends decode at once (the default action)
term_in_load
kill -TERM $pid 2>/dev/null
wait_exit $pid "a second SIGTERM while the model loads"
LAST_CMD="decode -m FIFO, SIGTERM twice while it waits in the model load"
expect_status 143 "a second SIGTERM during the load ends it at once"
expect_true "without --stats" test ! -e "$T/s2.json"
rm -f "$T/mfifo"

done_testing
