# specdec.sh - speculative decoding: usage errors always; on the real model,
# output identical to decode's token for token (greedy and sampled, one
# request at a time and batched, fixed and adaptive draft lengths, a KV cache
# too small for every draft), the draft statistics, and a saved KV state that
# resumes as decode's does.
. "$KVP_TESTS/cli/lib.sh"

run specdec
expect_status 2 "no model: a usage error"
run specdec -m x.gguf -p hi --method medusa
expect_status 2 "an unknown method"
expect_err_has "--method: 'medusa'" "names it"
run specdec -m x.gguf -p hi --draft-len 0
expect_status 2 "--draft-len 0"
run specdec -m x.gguf -p hi --draft-len 17
expect_status 2 "--draft-len beyond the maximum"
run specdec -m x.gguf -p hi --ngram-min 4 --ngram-max 2
expect_status 2 "--ngram-min above --ngram-max"
expect_err_has "--ngram-min 4 is above --ngram-max 2" "says so"
# prompt lookup's lengths with another drafter, which would ignore them
for m in "layerskip" "draft --draft y.gguf" "heads --heads h.kvp"; do
    for o in "--ngram-min 1" "--ngram-max 4"; do
        run specdec -m x.gguf -p hi --method $m $o
        expect_status 2 "$o with --method ${m%% *}"
        expect_err_has "goes with --method ngram or --profile (not --method ${m%% *})" "says so ($o, ${m%% *})"
    done
done
run specdec -m x.gguf -p hi --method draft
expect_status 2 "--method draft without --draft"
expect_err_has "needs --draft MODEL" "says what it needs"
run specdec -m x.gguf -p hi --draft y.gguf
expect_status 2 "--draft without --method draft"
run specdec --selftest
expect_status 0 "--selftest: speculative sampling keeps the distribution"
expect_out_has "caught" "and the wrong rule is caught"
expect_out_lacks "FAIL" "no check fails"
run specdec -m x.gguf --compare kv.kvp
expect_status 2 "--compare with a KV stream"
run specdec --selftest --bogus
expect_status 2 "--selftest with an unknown option"
run specdec --selftest junk
expect_status 2 "--selftest with an argument"
run specdec -m x.gguf -p hi --profile-reps 3
expect_status 2 "--profile-reps without --profile"
run specdec -m x.gguf --train-heads p.jsonl -o h.kvp --method draft
expect_status 2 "--train-heads with --method"
run specdec -m x.gguf --train-heads p.jsonl -o h.kvp --compare
expect_status 2 "--train-heads with --compare"
run specdec -m x.gguf --train-heads p.jsonl -o h.kvp --progress
expect_status 2 "--train-heads with --progress"
# every generating run's option, which training would ignore, by its name
for o in "--draft-len auto" "--heads h0.kvp" "--ngram-max 4" "--burstiness 2" "--slo-ttft 5" "--slo-tpot 5" \
    "--min-goodput 0.5" "--json"; do
    run specdec -m x.gguf --train-heads p.jsonl -o h.kvp $o
    expect_status 2 "--train-heads with $o"
    expect_err_has "${o%% *} is a generating run's option" "names ${o%% *}"
done
run specdec -m x.gguf --profile p.jsonl --progress=5
expect_status 2 "--profile with --progress"
run specdec -m x.gguf --profile p.jsonl --method ngram
expect_status 2 "--profile with --method (it runs every method it can)"
run specdec -m x.gguf --profile p.jsonl --draft-len auto
expect_status 2 "--profile with --draft-len auto (it times fixed lengths)"
# standard input carries one input: a second '-' is refused naming both
# (it read an empty prompts file, or a model's bytes as a KV stream)
for args in "-f - --method draft --draft -" "-f - --method heads --heads -" "--method draft --draft -" \
    "-m - -p hi --method draft --draft -" "--profile - --heads -"; do
    case $args in -m*) m= ;; *) m="-m x.gguf" ;; esac
    run_sh "echo x | specdec $m $args"
    expect_status 2 "specdec $args: two inputs on standard input"
    expect_err_has "both read standard input" "specdec $args: says so"
done
expect_err_has "the prompts (--profile -) and the heads (--heads -)" "and names both"
run_sh "echo x | specdec -m x.gguf --method draft --draft -"
expect_err_has "the KV stream (standard input without -p, -f or --tokens) and the draft model (--draft -)" \
    "a KV stream read from standard input by default is named as such"
run decode -m x.gguf -p hi --method ngram
expect_status 2 "decode has no --method"
run specdec --help
expect_status 0 "--help"
expect_out_has "Usage: specdec" "specdec's usage"
expect_out_has "--draft-len" "lists its options"
expect_out_has "--kv-dtype" "and decode's"

need_model

# A pipe: specdec starts on the first request without waiting for more.
fifo_two_parts "specdec -m '$M' -t 1 -f - -n 2 --json" "specdec -f -"

# Ids as decode prints them (the same output code): 7 as 7, "8" as "8", a
# line without one as its index; from a prompts file and through prefill.
printf '{"id":7,"prompt":"Once upon a time"}\n{"id":"8","prompt":"Hi"}\n{"prompt":"Yo"}\n' >"$T/ids.jsonl"
run specdec -m "$M" -t $THREADS -f "$T/ids.jsonl" -n 4
expect_status 0 "specdec -f, ids of each kind"
expect_out_has '{"id":7,' "an integer id as the integer"
expect_out_has '{"id":"8",' "a string id as the string"
expect_out_has '{"id":2,' "a line without one as its index"
run_sh "prefill -m '$M' -t $THREADS -f '$T/ids.jsonl' | specdec -m '$M' -t $THREADS -n 4"
expect_status 0 "prefill | specdec, ids of each kind"
expect_out_has '{"id":7,' "prefill | specdec: an integer id as the integer"
expect_out_has '{"id":"8",' "prefill | specdec: a string id as the string"
expect_out_has '{"id":2,' "prefill | specdec: a line without one as its index"

spec_prompts "$T/p.jsonl"

# same: decode's and specdec's lines without their timings, by id
same() { # DESC FILE_A FILE_B
    sed 's/,"ttft_ms.*//' "$2" | sort >"$T/a.cmp"
    sed 's/,"ttft_ms.*//' "$3" | sort >"$T/b.cmp"
    expect_true "$1" cmp -s "$T/a.cmp" "$T/b.cmp"
}
D="decode -m $M -t $THREADS -f $T/p.jsonl -n 48"
S="specdec -m $M -t $THREADS -f $T/p.jsonl -n 48"

run $D
expect_status 0 "decode, greedy"
cp "$OUT" "$T/d.jl"
run $S --stats --json
expect_status 0 "specdec, greedy, batched"
cp "$OUT" "$T/s.jl"
same "greedy, batched: the same tokens as decode" "$T/d.jl" "$T/s.jl"
expect_err_has '"spec":{"method":"ngram","draft_len":8,"adaptive":true' "the stats name the method"
expect_out_has '"drafted":' "each line counts its drafts"
# --draft-len auto drafts in a batch only where the measured steps say it
# pays (rarely on a CPU, where a step costs what its tokens cost): a fixed
# length makes every batched step verify guesses
run $S --draft-len 4 --stats --json
expect_status 0 "specdec, greedy, batched, 4 guesses a step"
same "greedy, batched, 4 guesses: the same tokens as decode" "$T/d.jl" "$OUT"
acc=$(sed -n 's/.*"spec":.*"accepted":\([0-9]*\),.*/\1/p' "$ERR")
expect_true "drafts were accepted ($acc)" test "${acc:-0}" -gt 20
# tokens_per_step is a request's, as --profile's: (decode_steps +
# accepted) / decode_steps, each of its steps after its first token giving
# it 1 + the drafts it kept; with --ignore-eos those are every token past
# the first.  The batch's tokens over its steps (8 requests a step) were
# past 1 + draft_len.
run specdec -m "$M" -t $THREADS -f "$T/p.jsonl" -n 24 --ignore-eos --draft-len 4 --stats="$T/tps.json"
expect_status 0 "specdec --draft-len 4 --ignore-eos --stats=FILE"
expect_true "tokens_per_step: a request's tokens a step" python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
s = j["spec"]
d, a = s["decode_steps"], s["accepted"]
sys.exit(0 if a > 0 and d + a == j["output_tokens"] - j["requests"] and abs(s["tokens_per_step"] - (d + a) / d) < 1e-3
         and s["tokens_per_step"] <= 5 else 1)' "$T/tps.json"
run $S --compare --stats --json
expect_status 0 "--compare"
expect_err_has '"same":8,"differ":0,"unchecked":0}' "decode's and specdec's outputs are the same for all 8"
expect_err_has '"compare":{"decode_output_throughput":' "with decode's speed beside"
same "--compare prints specdec's output only" "$T/d.jl" "$OUT"
run $S --compare
expect_status 0 "--compare without --stats"
expect_err_has "compare: decode " "still says what it found"
expect_err_has "the same output for 8 of 8 sequences" "with the count"
# a shard given no request: no speedup of nothing (it printed 0.00x)
run $S --compare --shard 9/10 --stats --json
expect_status 0 "--compare on a shard of no request"
expect_err_has '"speedup":null,"same":0,"differ":0' "its speedup is null"
run $S --compare --shard 9/10
expect_err_has "compare: no token generated" "and its line says there is nothing to compare"
expect_err_lacks "0.00x" "with no 0.00x"
# prompts from a pipe are held for the second run (decode's first used them)
run_sh "cat '$T/p.jsonl' | specdec -m '$M' -t $THREADS -f - -n 48 --compare"
expect_status 0 "--compare on standard input"
expect_err_has "the same output for 8 of 8 sequences" "runs both passes on all 8"
same "--compare on standard input prints specdec's output" "$T/d.jl" "$OUT"
printf '{"id":"x","prompt":"hi","top_p":"q"}\n' >"$T/badc.jsonl"
run_sh "cat '$T/badc.jsonl' | specdec -m '$M' -t $THREADS -f - -n 2 --compare"
expect_status 1 "--compare on standard input: a bad line"
expect_err_has '-:1: "top_p" must be' "is named by the user's file name, not the copy's"
# a comparison of no request would print a speedup of nothing: refused
run_sh "printf '\\n' | specdec -m '$M' -t $THREADS -f - -n 2 --compare"
expect_status 1 "--compare on an empty pipe"
expect_err_has "specdec: -: no prompt in the file: nothing to compare" "says why"
: >"$T/none.jsonl"
run specdec -m "$M" -t $THREADS -f "$T/none.jsonl" -n 2
expect_status 0 "specdec -f of an empty file: no request, exit 0 (as decode)"
expect_err_has "note: $T/none.jsonl: no prompt in the file" "with a note"
run specdec -m "$M" -t $THREADS --train-heads "$T/none.jsonl" -n 2 -o "$T/none-heads.kvp"
expect_status 1 "--train-heads on an empty file"
expect_err_has "none.jsonl: no prompt in the file: nothing to train the heads on" "says why"
expect_true "writes no heads" test ! -e "$T/none-heads.kvp"
# drafts count against --max-batched-tokens: a step of one token has no
# room for any (and a position never drafted has no rate: null)
run $S --max-batched-tokens 1 --draft-len 4 --stats --json
expect_status 0 "--max-batched-tokens 1"
same "greedy under --max-batched-tokens 1: decode's tokens" "$T/d.jl" "$OUT"
expect_err_has '"drafted":0,' "no draft past the step's budget"
expect_err_has '"acceptance_at":[null,null,null,null]' "never-drafted positions are null"
run $S --max-num-seqs 1 --draft-len 4
same "greedy, one at a time, --draft-len 4" "$T/d.jl" "$OUT"
run $S --draft-len 16 --ngram-min 2 --ngram-max 4
same "greedy, --draft-len 16, 2- to 4-grams" "$T/d.jl" "$OUT"

for opts in "--temperature 0.8 --top-p 0.9 --seed 3" "--temperature 1 --top-k 40 --min-p 0.05 --repeat-penalty 1.1 --seed 9"; do
    # shellcheck disable=SC2086
    run $D $opts
    cp "$OUT" "$T/d.jl"
    # shellcheck disable=SC2086
    run $S $opts --stats
    expect_status 0 "specdec $opts"
    same "sampled ($opts): the same tokens as decode" "$T/d.jl" "$OUT"
done

# a cache of 12 blocks: drafts that do not fit are dropped for the step,
# and preemption recomputes; nothing changes in the output
run $D --kv-blocks 12
cp "$OUT" "$T/d.jl"
run $S --kv-blocks 12 --stats
expect_status 0 "specdec with a 12-block cache"
same "a small cache: the same tokens as decode" "$T/d.jl" "$OUT"

# the KV state saved at the end resumes as decode's does (the rejected
# drafts' K/V are gone)
head -2 "$T/p.jsonl" >"$T/p2.jsonl"
run decode -m "$M" -t $THREADS -f "$T/p2.jsonl" -n 20 --kv-out "$T/d.kvp"
run specdec -m "$M" -t $THREADS -f "$T/p2.jsonl" -n 20 --kv-out "$T/s.kvp"
expect_status 0 "specdec --kv-out"
run decode -m "$M" -t $THREADS -n 16 "$T/d.kvp"
cp "$OUT" "$T/d2.jl"
run decode -m "$M" -t $THREADS -n 16 "$T/s.kvp"
expect_status 0 "decode resumes specdec's state"
same "and continues it as it continues decode's" "$T/d2.jl" "$OUT"
# a stop string met inside a verify step's kept guesses: the state saved
# is the one decode saves (the tokens holding it left out, none pending)
# (on the plain letters, the stop's tokens outnumber the guesses after the
# one it ended at, or not: the job failed "truncate sequence 0 to 22 of 21
# tokens", or saved the stop's tokens)
P="Repeat exactly: The prime I am referring to is two, the prime I am referring to is two."
L="a b c d e f a b c d e f a b c d e f"
for st in " referring" " is 2" "L:c d e" "L:b c" "L:d e f a"; do
    chat=--chat p=$P
    case $st in L:*) st=${st#L:} chat= p=$L ;; esac
    run decode -m "$M" -t $THREADS $chat -p "$p" -n 64 --stop "$st" --kv-out "$T/dst.kvp"
    run specdec -m "$M" -t $THREADS $chat -p "$p" -n 64 --stop "$st" --kv-out "$T/sst.kvp" --draft-len 6
    expect_status 0 "specdec --stop '$st' --kv-out"
    run kvdump --json "$T/dst.kvp"
    grep -o '"token_ids":\[[0-9,]*\]\|"next_token":[-0-9]*' "$OUT" >"$T/dst.ids"
    run kvdump --json "$T/sst.kvp"
    grep -o '"token_ids":\[[0-9,]*\]\|"next_token":[-0-9]*' "$OUT" >"$T/sst.ids"
    expect_true "stop '$st': specdec saves decode's state" cmp -s "$T/dst.ids" "$T/sst.ids"
    expect_true "stop '$st': nothing pending" grep -q '"next_token":-1' "$T/sst.ids"
done

# a draft model: the test model re-quantized to q4_0 drafts for it, and the
# model itself (everything accepted); greedy and sampled, the same output
run quantize --to q4_0 "$M" -o "$T/q4.kvp"
expect_status 0 "quantize a draft model"
run $D
cp "$OUT" "$T/d.jl"
# (a fixed draft length: auto's clock backs off a drafter that costs more
# than it saves on this CPU, which would leave few drafts to judge)
run $S --method draft --draft "$T/q4.kvp" --draft-len 3 --stats --json
expect_status 0 "--method draft (q4_0 drafting for Q4_1)"
same "a draft model, greedy: the same tokens as decode" "$T/d.jl" "$OUT"
expect_err_has '"spec":{"method":"draft"' "the stats name the method"
acc=$(sed -n 's/.*"spec":.*"acceptance":\([0-9.]*\),.*/\1/p' "$ERR")
expect_true "most of q4_0's drafts are kept ($acc)" awk -v a="$acc" 'BEGIN { exit !(a > 0.5) }'
run $S --method draft --draft "$M" --max-num-seqs 1 --draft-len 6 --stats --json
same "the model drafting for itself, one at a time" "$T/d.jl" "$OUT"
acc=$(sed -n 's/.*"spec":.*"acceptance":\([0-9.]*\),.*/\1/p' "$ERR")
expect_true "and every draft is kept ($acc)" awk -v a="$acc" 'BEGIN { exit !(a == 1) }'
# --draft-len auto times a costly drafter: the model drafting for itself is
# always right, but each guess costs a step of the model, so guessing loses
# and it backs off (without the clock it drafted nearly every token)
run $S --method draft --draft "$M" --max-num-seqs 1 --stats --json
same "the model drafting for itself, auto: the same tokens as decode" "$T/d.jl" "$OUT"
dr=$(sed -n 's/.*"spec":.*"drafted":\([0-9]*\),.*/\1/p' "$ERR")
ot=$(sed -n 's/.*"output_tokens":\([0-9]*\),.*/\1/p' "$ERR" | head -n 1)
expect_true "a right but costly drafter backs off: $dr drafts for $ot tokens" \
    awk -v d="$dr" -v o="$ot" 'BEGIN { exit !(d != "" && o > 0 && 2 * d < o) }'
# and in a batch, where its steps are timed against plain steps of as many
# requests (without that it drafted 327 of 384 tokens here)
run $S --method draft --draft "$M" --stats --json
same "the model drafting for itself, batched, auto: the same tokens as decode" "$T/d.jl" "$OUT"
dr=$(sed -n 's/.*"spec":.*"drafted":\([0-9]*\),.*/\1/p' "$ERR")
ot=$(sed -n 's/.*"output_tokens":\([0-9]*\),.*/\1/p' "$ERR" | head -n 1)
expect_true "batched, a right but costly drafter backs off: $dr drafts for $ot tokens" \
    awk -v d="$dr" -v o="$ot" 'BEGIN { exit !(d != "" && o > 0 && 2 * d < o) }'
# until the clock has judged it, the first two requests explore (the rest
# decode plainly): all 8 drafted at once before, each paying its prompt's
# prefill in the draft model
nd=$(grep -c '"drafted":0,' "$OUT")
expect_true "batched, only two requests explore a costly drafter ($nd of 8 never drafted)" test "$nd" -ge 5
# a run that drafts nothing (one token a request: the prompt's step gives
# it) has no acceptance: null, not a rate of 0
run specdec -m "$M" -t "$THREADS" -p hi -n 1 --stats --json
expect_status 0 "one token, nothing to draft"
expect_err_has '"drafted":0,"accepted":0,"acceptance":null,"mean_accepted":null,' "no drafts: acceptance null"
expect_err_has '"decode_steps":0,"tokens_per_step":null,' "no step after a first token: tokens_per_step null"
printf '{"id":"a","prompt":"hi","max_tokens":0}\n{"id":"b","prompt":"yo","max_tokens":0}\n' >"$T/zeros.jsonl"
run specdec -m "$M" -t "$THREADS" -f "$T/zeros.jsonl" --stats --json
expect_status 0 "max_tokens 0 twice: no step"
expect_err_has '"mean_accepted":null,"decode_steps":0,"tokens_per_step":null,' "no step: no tokens a step"
run specdec -m "$M" -t "$THREADS" -f "$T/zeros.jsonl" --stats
expect_err_has "0 of 0 draft tokens accepted (-), - accepted a verify step, - tokens a request's step;" \
    "the text line's ratios of nothing read -"
expect_err_has "(no step ran: no rates)" "and its rates"
run $D --temperature 0.7 --seed 11
cp "$OUT" "$T/d.jl"
run $S --method draft --draft "$T/q4.kvp" --temperature 0.7 --seed 11 --greedy-drafts
same "a draft model, sampled, --greedy-drafts: the same tokens as decode" "$T/d.jl" "$OUT"
# sampled drafts keep decode's distribution, not its draws: --compare counts
# them and does not call them a bug
run $S --method draft --draft "$T/q4.kvp" --temperature 0.7 --seed 11 --draft-len 3 --compare
expect_status 0 "--compare with sampled drafts"
expect_err_has "sampled with sampled drafts not compared" "says they were not compared"
nbug=$(grep -c "a bug" "$ERR")
expect_true "and calls nothing a bug" test "$nbug" -eq 0
# sampled drafts, kept by speculative sampling: the model drafting for
# itself draws from the very distribution it is checked against (the
# engine gives the same bits in any batch), so every draft is kept
run $S --method draft --draft "$M" --temperature 0.7 --seed 11 --max-num-seqs 1 --draft-len 6 --stats --json
expect_status 0 "sampled drafts from the model itself"
acc=$(sed -n 's/.*"spec":.*"acceptance":\([0-9.]*\),.*/\1/p' "$ERR")
expect_true "speculative sampling keeps every draft of p itself ($acc)" awk -v a="$acc" 'BEGIN { exit !(a == 1) }'
cp "$OUT" "$T/s1.jl"
run $S --method draft --draft "$M" --temperature 0.7 --seed 11 --max-num-seqs 1 --draft-len 6
same "a sampled speculative run is reproducible (same seed, same text)" "$T/s1.jl" "$OUT"
run $S --method draft --draft "$T/q4.kvp" --temperature 0.7 --seed 11 --stats --json
expect_status 0 "q4_0 drafts drawn and kept by speculative sampling"
acc2=$(sed -n 's/.*"spec":.*"acceptance":\([0-9.]*\),.*/\1/p' "$ERR")
expect_true "it keeps some of them ($acc2)" awk -v a="$acc2" 'BEGIN { exit !(a > 0.2) }'
# a batch's drafts are drawn in one draft-model step a position for all its
# requests (draft_batch): each request's draws are the ones it makes alone,
# so the sampled text is the same (a fixed length: auto's clock times the host)
run $S --method draft --draft "$T/q4.kvp" --temperature 0.7 --seed 11 --draft-len 4 --max-num-seqs 1
cp "$OUT" "$T/s1.jl"
run $S --method draft --draft "$T/q4.kvp" --temperature 0.7 --seed 11 --draft-len 4
same "sampled drafts drawn for the whole batch at once: the text of one at a time" "$T/s1.jl" "$OUT"
# ... also where prompt chunks fill the step's token budget: a fixed
# length's guesses are kept in it first (8 x (1 + 4) of 48), else the
# drafts cut short would change the draws
run $S --method draft --draft "$T/q4.kvp" --temperature 0.7 --seed 11 --draft-len 4 --max-batched-tokens 48
same "sampled drafts, prompts chunked into a 48-token budget: the text of one at a time" "$T/s1.jl" "$OUT"
run $S --greedy-drafts
expect_status 2 "--greedy-drafts without --method draft"

# self-speculation: the model's first layers and its output head draft
run $D
cp "$OUT" "$T/d.jl"
run $S --method layerskip --draft-layers 12 --stats --json
expect_status 0 "--method layerskip"
same "layerskip, greedy: the same tokens as decode" "$T/d.jl" "$OUT"
expect_err_has '"spec":{"method":"layerskip"' "the stats name the method"
run $S --method layerskip --draft-layers 30 --max-num-seqs 1 --draft-len 6 --stats --json
same "every layer drafting: the same tokens as decode" "$T/d.jl" "$OUT"
acc=$(sed -n 's/.*"spec":.*"acceptance":\([0-9.]*\),.*/\1/p' "$ERR")
expect_true "and every draft is kept ($acc)" awk -v a="$acc" 'BEGIN { exit !(a == 1) }'
run $S --method layerskip --draft-layers 30 --temperature 0.9 --seed 4 --max-num-seqs 1 --stats --json
acc=$(sed -n 's/.*"spec":.*"acceptance":\([0-9.]*\),.*/\1/p' "$ERR")
expect_true "sampled drafts of every layer are all kept ($acc)" awk -v a="$acc" 'BEGIN { exit !(a == 1) }'
# one layer of 30 guesses next to nothing: once the job has seen its guesses
# fail, a new request starts paused with one guess instead of climbing down
# from 8 (about 6 tries in 48 tokens each), and drafting on the model's own
# cache leaves its text as decode's
run $S --method layerskip --draft-layers 1 --max-num-seqs 1 --stats --json
same "one layer drafting: the same tokens as decode" "$T/d.jl" "$OUT"
vs=$(sed -n 's/.*"spec":.*"verify_steps":\([0-9]*\),.*/\1/p' "$ERR")
nreq=$(wc -l <"$T/p.jsonl")
expect_true "later requests start paused: $vs verify steps for $nreq requests" \
    awk -v v="$vs" -v n="$nreq" 'BEGIN { exit !(v != "" && v <= 6 + 2 * (n - 1)) }'
run $S --method layerskip --draft-layers 31
expect_status 1 "--draft-layers past the model's layers"
expect_err_has "30 layers" "says how many it has"
run $S --draft-layers 4
expect_status 2 "--draft-layers without --method layerskip"
run $S --method draft --draft "$T/missing.gguf"
expect_status 1 "a missing draft model"
expect_err_has "missing.gguf" "names it"

# Medusa heads: trained on the model's own answers (a quick run: one
# epoch), then drafting; greedy and sampled, decode's very tokens
run specdec -m "$M" -t $THREADS --train-heads "$T/p.jsonl" -n 24 --epochs 1 --n-heads 3 -o "$T/h.kvp"
expect_status 0 "--train-heads"
expect_err_has "top-1 accuracy" "reports each head's accuracy"
expect_err_has "wrote $T/h.kvp (3 heads)" "and the file written"
run kvcalc -m "$T/h.kvp"
expect_status 1 "kvcalc -m a heads file: refused"
expect_err_has "$T/h.kvp: a Medusa heads file (specdec --heads), not a model" "kvcalc says what the file is"
run specdec -m "$M" -p hi -n 2 --method draft --draft "$T/h.kvp"
expect_status 1 "a heads file as the draft model: refused"
expect_err_has "$T/h.kvp: a Medusa heads file (specdec --heads), not a model" "specdec says what the file is"
run decode -m "$T/h.kvp" -p hi -n 2
expect_status 1 "decode -m a heads file: refused"
expect_err_has "$T/h.kvp: a Medusa heads file (specdec --heads), not a model" "decode says what the file is"
run kvdump "$T/h.kvp"
expect_status 0 "kvdump reads a heads file"
expect_out_has "medusa.3.w1 f32 [576, 576]" "its tensors"
fp=$(sed -n 's/.*fingerprint \([0-9a-f]*\).*/\1/p' "$OUT")
run $D
cp "$OUT" "$T/d.jl"
# (a fixed draft length, so the batch drafts whatever auto's clock would
# judge of the heads' cost on this host)
run $S --method heads --heads "$T/h.kvp" --draft-len 3 --stats --json
expect_status 0 "--method heads"
expect_err_has '"branch_rows":0,"tree_steps":0' "a chain's stats: no branch rows, no tree steps (present, as for a tree)"
same "heads, greedy, batched: the same tokens as decode" "$T/d.jl" "$OUT"
expect_err_has '"spec":{"method":"heads"' "the stats name the method"
expect_err_has "\"model_fingerprint\":\"$fp\"" "the heads file carries the model's fingerprint ($fp)"
dr=$(sed -n 's/.*"spec":.*"drafted":\([0-9]*\),.*/\1/p' "$ERR")
expect_true "the heads drafted ($dr tokens)" test "${dr:-0}" -gt 20
# 3 heads draft 3 positions at most: the draft length, auto's or given,
# is cut to them, and so are the positions reported
run specdec -m "$M" -t $THREADS -p "Count: one two three" -n 8 --method heads --heads "$T/h.kvp" --stats
expect_err_has "heads drafts (auto, up to 3)" "auto's bound is the file's 3 heads"
run specdec -m "$M" -t $THREADS -p "Count: one two three" -n 8 --method heads --heads "$T/h.kvp" --draft-len 6 \
    --stats --json
expect_err_has '"draft_len":3,' "--draft-len 6 with 3 heads: 3"
at=$(sed -n 's/.*"acceptance_at":\[\([^]]*\)\].*/\1/p' "$ERR" | awk -F, '{ print NF }')
expect_true "acceptance_at has 3 positions ($at)" test "$at" = 3
run $S --method heads --heads "$T/h.kvp" --max-num-seqs 1 --draft-len 2
same "heads, greedy, one at a time, --draft-len 2" "$T/d.jl" "$OUT"
run $S --method heads --heads "$T/h.kvp" --kv-blocks 12
same "heads with a 12-block cache (drafts dropped, preemption)" "$T/d.jl" "$OUT"
# a draft tree: three branches merged into one tree in the sequence (a
# guess they share computed once), each token seeing its own path; the
# longest kept wins and its path moves into place
run $S --method heads --heads "$T/h.kvp" --branches 3 --stats --json
expect_status 0 "--branches 3"
same "heads, a tree of 3 branches: the same tokens as decode" "$T/d.jl" "$OUT"
expect_err_has '"branch_rows":' "the stats count the branches' rows"
expect_err_has '"tree_steps":' "and the steps verified as one tree"
run $S --method heads --heads "$T/h.kvp" --branches 3 --max-num-seqs 2 --kv-blocks 14
same "a tree in a small cache (a tree that does not fit drops the drafts)" "$T/d.jl" "$OUT"
run $S --branches 2
expect_status 2 "--branches without --method heads"
run $D --temperature 0.8 --top-p 0.9 --seed 3
cp "$OUT" "$T/d.jl"
run $S --method heads --heads "$T/h.kvp" --temperature 0.8 --top-p 0.9 --seed 3
same "heads, sampled: the same tokens as decode" "$T/d.jl" "$OUT"
run $S --method heads --heads "$T/h.kvp" --temperature 0.8 --top-p 0.9 --seed 3 --branches 4 --repeat-penalty 1.2
cp "$OUT" "$T/s.jl"
run $D --temperature 0.8 --top-p 0.9 --seed 3 --repeat-penalty 1.2
same "heads, sampled with a penalty, a tree of 4: the same tokens as decode" "$OUT" "$T/s.jl"
run $S --method heads --heads "$T/h.kvp" -m "$T/q4.kvp"
expect_status 1 "heads trained for another model"
expect_err_has "heads trained for model" "says so"
expect_err_has "--train-heads" "and how to make the right ones"
head -c 2000 "$T/h.kvp" >"$T/hcut.kvp"
run $S --method heads --heads "$T/hcut.kvp"
expect_status 1 "a heads file cut short"
expect_err_has "hcut.kvp" "names it"
run $S --method heads
expect_status 2 "--method heads without --heads"
expect_err_has "--train-heads makes one" "says where heads come from"
run $S --heads "$T/h.kvp"
expect_status 2 "--heads without --method heads"
# answers of 3 tokens (-n 3) label heads 1 and 2 alone: head 3 has no
# accuracy to show ("-", not 0%), nor to record in the file
awk 'BEGIN { for (i = 0; i < 10; i++) printf "{\"prompt\":\"Count: one two three %d\"}\n", i }' >"$T/short.jsonl"
run specdec -m "$M" -t $THREADS --train-heads "$T/short.jsonl" -n 3 --epochs 1 --n-heads 3 -o "$T/h3.kvp"
expect_status 0 "--train-heads -n 3 --n-heads 3"
expect_true "held out and training rows show - for head 3 ($(grep -c '%      -   loss' "$ERR") of 3)" \
    test "$(grep -c '%      -   loss' "$ERR")" -eq 3
expect_err_lacks "%      -      -" "and for head 3 alone"
expect_err_has "-: no sample for that head" "says what - means"
expect_err_has "raise -n" "and what to do"
expect_true "the file records heads 1 and 2's held-out accuracy" grep -aq "medusa.2.heldout_top1" "$T/h3.kvp"
expect_true "and not head 3's" sh -c "! grep -aq 'medusa.3.heldout_top1' '$T/h3.kvp'"
rm -f "$T/h3.kvp"
run specdec -m "$M" --train-heads "$T/p.jsonl"
expect_status 2 "--train-heads without -o"
run specdec -m "$M" --train-heads "$T/p.jsonl" -o "$T/no/such/dir/h.kvp"
expect_status 1 "an output that cannot be written"
expect_err_has "no/such/dir/h.kvp" "is named at once"
expect_err_one_line "before any answer is computed: one line"
# -o naming an input that comes on standard input: the model (-m -) or the
# prompts (--train-heads -), through /dev/stdin, /proc/self/fd/0 or a
# symlink to the file redirected: refused before anything is read (the
# heads had been written over it, exit 0)
cp "$M" "$T/m-in.gguf"
run_sh "specdec -m - -t $THREADS --train-heads '$T/p.jsonl' -o /dev/stdin -n 8 --epochs 1 --n-heads 2 < '$T/m-in.gguf'"
expect_status 2 "-o /dev/stdin with the model on standard input: a usage error"
expect_err_has "-o /dev/stdin is the model" "says so"
expect_true "the model is kept" cmp -s "$M" "$T/m-in.gguf"
rm -f "$T/m-in.gguf"
cp "$T/p.jsonl" "$T/p-in.jsonl"
ln -s "$T/p-in.jsonl" "$T/p-in.sym"
for o in "$T/p-in.sym" /proc/self/fd/0; do
    [ "$o" = /proc/self/fd/0 ] && [ ! -e /proc/self/fd/0 ] && continue
    run_sh "specdec -m '$M' -t $THREADS --train-heads - -o $o -n 8 --epochs 1 --n-heads 2 < '$T/p-in.jsonl'"
    expect_status 2 "-o $o with the prompts on standard input: a usage error"
    expect_err_has "is the prompts file" "says so ($o)"
    expect_true "the prompts are kept ($o)" cmp -s "$T/p.jsonl" "$T/p-in.jsonl"
done
rm -f "$T/p-in.jsonl" "$T/p-in.sym"
run specdec -m "$M" --train-heads "$T/absent.jsonl" -o "$T/x.kvp"
expect_status 1 "a prompts file that is not there"
expect_err_has "absent.jsonl" "is named"
run specdec -m "$M" --train-heads "$T/p.jsonl" -o "$T/x.kvp" --temperature 0.5
expect_status 2 "--train-heads learns greedy answers only"
run $S --epochs 3
expect_status 2 "--epochs without --train-heads"
run decode -m "$M" -p hi --heads "$T/h.kvp"
expect_status 2 "decode has no --heads"
expect_true "no heads file was left by the refused runs" test ! -e "$T/x.kvp"
rm -f "$T/q4.kvp" "$T/h.kvp" "$T/hcut.kvp"

run_sh "prefill -m '$M' -t $THREADS -p 'Repeat: one two three four five six seven. Again: one two three' | specdec -m '$M' -t $THREADS -n 24"
expect_status 0 "prefill | specdec"
cp "$OUT" "$T/s.txt"
run_sh "prefill -m '$M' -t $THREADS -p 'Repeat: one two three four five six seven. Again: one two three' | decode -m '$M' -t $THREADS -n 24"
expect_true "prefill | specdec writes what prefill | decode does" cmp -s "$T/s.txt" "$OUT"

# SIGTERM while one prompt's text streams: exit 143, and the text ends its line
specdec -m "$M" -t $THREADS -p "Write a long story about a dragon." -n 2000 --ignore-eos >"$T/st.txt" 2>"$T/st.err" &
pid=$!
i=0
while [ ! -s "$T/st.txt" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
sleep 0.3
kill -TERM $pid
wait $pid
status=$?
LAST_CMD="specdec -p ... -n 2000, SIGTERM mid-stream"
expect_status 143 "SIGTERM while streaming exits 143"
expect_true "the streamed text ends with a newline" test "$(tail -c 1 "$T/st.txt" | od -An -c | tr -d ' ')" = '\n'

# --compare reads its prompts (a pipe's into memory) before the model loads:
# a signal while it waits for them stops the job as a wait for input does
# later (decode(1), SCHEDULING), with --stats=FILE (the model loaded for it)
# and without (at once).  The stop handlers came after that read, and such a
# signal killed specdec outright: no message, no --stats.
printf '{"id":"c1","prompt":"One"}\n' >"$T/c1.jsonl"
for stats in "--stats=$T/s3.json" ""; do
    rm -f "$T/fifo" "$T/s3.json"
    mkfifo "$T/fifo"
    specdec -m "$M" -t $THREADS --compare -f - -n 2 $stats <"$T/fifo" >"$OUT" 2>"$ERR" &
    pid=$!
    exec 7>"$T/fifo"
    cat "$T/c1.jsonl" >&7
    term_when_waiting $pid "SIGTERM while --compare reads its prompts ($stats)"
    exec 7>&-
    rm -f "$T/fifo"
    LAST_CMD="specdec --compare -f - $stats < FIFO (kept open), SIGTERM while it reads the prompts"
    expect_status 143 "SIGTERM while --compare reads its prompts exits 143 ($stats)"
    expect_err_has "stopped by Terminated: 0 sequences written, 0 read and not finished, the rest of the input not read yet" \
        "and says it was stopped ($stats)"
    expect_out_empty "no request was run ($stats)"
    if [ -n "$stats" ]; then
        expect_true "--compare's --stats=FILE is written" \
            grep -q '"requests":0,.*"input":"prompts",.*"stopped":true,' "$T/s3.json"
    fi
done

done_testing
