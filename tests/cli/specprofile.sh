# specprofile.sh - specdec --profile: usage errors always; on the real model,
# the table's structure and the invariants that can fail (each histogram
# sums to its verify steps and its mean is the drafts kept, acceptance in
# [0, 1], a model drafting for itself keeps every draft, speedups finite and
# positive, every speculative run's text is plain decoding's, the
# recommendation names a profiled row and the best predicted one), and
# predicted against measured speedups.  Timings are never asserted
# strictly here (DESIGN.md): the 25% comparison is scripts/check-profile;
# this one allows 50%, which only a wrong model or a broken clock misses.
. "$KVP_TESTS/cli/lib.sh"

run specdec -m x.gguf --profile p.jsonl --draft-len 0
expect_status 2 "--profile --draft-len 0"
run specdec -m x.gguf --profile p.jsonl --draft-len 2,17
expect_status 2 "a draft length beyond the maximum in the list"
expect_err_has "'17' is not a whole number from 1 to 16" "names it"
run specdec -m x.gguf --profile p.jsonl --draft-len 2,,4
expect_status 2 "an empty length in the list"
run specdec -m x.gguf --profile p.jsonl --draft-len 4,2,4
expect_status 2 "a length twice in the list (it would be profiled twice)"
expect_err_has "--draft-len: 4 twice in '4,2,4'" "names it"
run specdec -m x.gguf -p hi --draft-len 2,4
expect_status 2 "a list of draft lengths without --profile"
expect_err_has "goes with --profile" "says so"
run specdec -m x.gguf -p hi --profile p.jsonl
expect_status 2 "--profile with -p"
# a run's options the profile would ignore (its own arrivals, SLOs and
# report), each refused by its name
for o in "--min-goodput 0.5" "--slo-ttft 5" "--slo-tpot 5" "--burstiness 2" "--rate 2" "--stats" "--progress" \
    "--shard 1/2" "--compare" "-f q.jsonl" "--cache-salt t1"; do
    run specdec -m x.gguf --profile p.jsonl $o
    expect_status 2 "--profile with $o"
    expect_err_has "its table the report: no ${o%% *}" "names ${o%% *}"
done
# what the profile does instead of a method's options it refuses (not
# advice to use --method, which it refuses too)
run specdec -m x.gguf --profile p.jsonl --greedy-drafts
expect_status 2 "--profile with --greedy-drafts"
expect_err_has "--profile drafts greedily already" "says it drafts greedily"
expect_err_lacks "--method" "and sends nobody to --method"
run specdec -m x.gguf --profile p.jsonl --heads h.kvp --branches 2
expect_status 2 "--profile with --branches"
expect_err_has "--profile runs --heads as a chain" "says it runs heads as a chain"
expect_err_lacks "--method" "and sends nobody to --method"
run specdec -m x.gguf --profile p.jsonl kv.kvp
expect_status 2 "--profile with a KV stream"
expect_err_has "no KV stream" "names it"
run specdec -m x.gguf --profile p.jsonl --profile-reps 0
expect_status 2 "--profile-reps 0"
run specdec --help
expect_out_has "--profile FILE" "--help lists --profile"

need_model

run specdec -m "$M" -t $THREADS --profile "$T/missing.jsonl" --draft-len 1
expect_status 1 "a missing prompts file"
expect_err_has "missing.jsonl" "names it"
printf '{"prompt":"Count: one two three"}\n{"prompt": oops}\n' >"$T/bad.jsonl"
run specdec -m "$M" -t $THREADS -n 4 --profile "$T/bad.jsonl" --draft-len 1
expect_status 1 "a bad record"
expect_err_has "bad.jsonl:2:" "names the file and line"
: >"$T/empty.jsonl"
run specdec -m "$M" -t $THREADS --profile "$T/empty.jsonl" --draft-len 1
expect_status 1 "no prompts"
expect_err_has "empty.jsonl: no prompt in the file: nothing to profile" "a profile of nothing is refused, saying why"

# A pipe gives its bytes once, yet every run reads the prompts from their
# start: they are read once, and a pipe profiles as the file does.
printf '%s\n' '{"id":"a","prompt":"Count: one two three four five"}' '{"id":"b","prompt":"Once upon a time"}' \
    >"$T/two.jsonl"
run_sh "cat '$T/two.jsonl' | specdec -m '$M' -t $THREADS -n 8 --profile - --draft-len 1 --json"
expect_status 0 "--profile - on a pipe"
expect_out_has '"method":"plain","requests":2,' "both of its requests profiled"
n=$(grep -c '"same":2,"differ":0' "$OUT")
expect_true "ngram and layerskip ran both, with plain decoding's texts ($n)" test "$n" -eq 2
run_sh "cat '$T/two.jsonl' | specdec -m '$M' -t $THREADS -n 8 --profile /dev/stdin --draft-len 1"
expect_status 0 "--profile /dev/stdin on a pipe"
expect_out_has "profile: /dev/stdin, 2 requests" "the table names the file as given"
run_sh "printf '{\"prompt\":\"a b\"}\\n{\"prompt\": oops}\\n' | specdec -m '$M' -t $THREADS -n 4 --profile - --draft-len 1"
expect_status 1 "a bad record on a pipe"
expect_err_has "specdec: -:2:" "names the file as given (not the copy) and the line"
run_sh "printf '\\n  \\n' | specdec -m '$M' -t $THREADS --profile - --draft-len 1"
expect_status 1 "blank lines alone on a pipe"
expect_err_has "-: no prompt in the file" "no prompt"
run_sh "head -c 70000000 /dev/zero | specdec -m '$M' -t $THREADS --profile - --draft-len 1"
expect_status 1 "prompts over 64 MiB"
expect_err_has "-: over 64 MiB of prompts" "are refused, naming the file"

# -n 2: a request's only decode step is its token budget's last, so no
# drafter is called (calls 0) and none is fed a prompt: every row costs
# plain decoding's steps, predicted 1.00x, the draft model's prime (a
# long prompt fed on a first call) charged to no one
awk 'BEGIN { s = "Count:"; for (i = 0; i < 60; i++) s = s " one two"; printf "{\"prompt\":\"%s\"}\n", s }' \
    >"$T/long.jsonl"
# (the draft model by a path of over 600 bytes with a space and a quote:
# each row's options, which the recommendation prints, quote it for a
# shell, whole)
a=$(printf '%0250d' 0 | tr 0 a)
dd="$T/$a/$(echo "$a" | tr a b)/$(printf '%0100d' 0 | tr 0 c)"
mkdir -p "$dd"
ln -s "$M" "$dd/it's a draft.gguf"
run specdec -m "$M" -t $THREADS -n 2 --profile "$T/long.jsonl" --draft "$dd/it's a draft.gguf" --draft-len 2 --json
expect_status 0 "--profile -n 2: nothing drafted"
opts=$(sed -n 's/.*"method":"draft",.*"options":"\(.*\)"}$/\1/p' "$OUT" | sed 's/\\\\/\\/g')
eval "set -- $opts"
expect_true "the draft row's options run it: --draft's path one shell word, whole, then --draft-len ($#: $opts)" \
    test "$#" -eq 6 -a "${3-}" = "--draft" -a "${4-}" = "$dd/it's a draft.gguf" -a "${5-}" = "--draft-len" -a "${6-}" = 2
n=$(grep -c '"calls":0,"verify_steps":0,' "$OUT")
expect_true "no row called its drafter ($n of 3)" test "$n" -eq 3
n=$(grep -c '"predicted_speedup":1.0000,' "$OUT")
expect_true "every row predicted 1.00x: no prime charged to a request that never drafted ($n of 3)" test "$n" -eq 3
n=$(grep -c '"acceptance":null,"mean_accepted":null,' "$OUT")
expect_true "nothing drafted: acceptance and mean kept null, as --stats says ($n of 3)" test "$n" -eq 3

spec_prompts "$T/p.jsonl"

# ngram, the model drafting for itself (every draft kept: acceptance 1, no
# step kept none; a step near the token budget gets fewer than K drafts)
# and layerskip's default half, at K 2 and 4
run specdec -m "$M" -t $THREADS -n 32 --profile "$T/p.jsonl" --draft "$M" --draft-len 2,4 --json
expect_status 0 "--profile --json"
cp "$OUT" "$T/prof.jl"
n=$(grep -c '"method":"plain"' "$T/prof.jl")
expect_true "one plain decoding line ($n)" test "$n" -eq 1
n=$(grep -c '"draft_len":[24],"steps"' "$T/prof.jl")
expect_true "a line for each of 3 methods at 2 lengths ($n)" test "$n" -eq 6
for m in ngram draft layerskip; do
    expect_out_has "\"method\":\"$m\",\"draft_len\":4," "a $m row"
done

# the invariants, row by row; a failing one prints the row
check_rows='
function num(k,   i, s) { i = index($0, "\"" k "\":"); if (!i) return "x"; s = substr($0, i + length(k) + 3)
                           match(s, /^-?[0-9.eE+-]+/); return substr(s, 1, RLENGTH) + 0 }
function list(k, a,   i, s) { i = index($0, "\"" k "\":["); s = substr($0, i + length(k) + 4)
                              s = substr(s, 1, index(s, "]") - 1); return split(s, a, ",") }
/"draft_len":[0-9]*,"steps"/ {
    k = num("draft_len"); nh = list("histogram", h); sum = 0; kept = 0
    for (m = 1; m <= nh; m++) { sum += h[m]; kept += (m - 1) * h[m] }
    if (nh != k + 1) bad = bad "histogram of " nh " for K " k "; "
    if (sum != num("verify_steps")) bad = bad "histogram sums to " sum " not verify_steps; "
    if (kept != num("accepted")) bad = bad "histogram mean is not accepted; "
    a = num("acceptance"); if (a < 0 || a > 1) bad = bad "acceptance " a "; "
    if (num("verify_steps") > num("steps") || num("calls") > num("steps")) bad = bad "more verify steps than steps; "
    p = num("predicted_speedup"); if (!(p > 0 && p < 100)) bad = bad "predicted " p "; "
    if (!(num("measured_speedup") > 0)) bad = bad "measured not positive; "
    if (num("same") != 8 || num("differ") != 0) bad = bad "texts differ from plain decoding; "
    if (index($0, "\"method\":\"draft\"") && (a != 1 || h[1] != 0)) bad = bad "the model drafting for itself lost some; "
}
END { if (bad != "") { print bad; exit 1 } }'
expect_true "every row: histogram, acceptance, speedups, same texts" awk "$check_rows" "$T/prof.jl"

# the recommendation: the best predicted row above 1.05, or plain
best=$(awk '/"draft_len":[0-9]*,"steps"/ {
    p = $0; sub(/.*"predicted_speedup":/, "", p); p += 0
    m = $0; sub(/.*"method":"/, "", m); sub(/".*/, "", m)
    k = $0; sub(/.*"draft_len":/, "", k); sub(/,.*/, "", k)
    if (p > 1.05 && p > bp) { bp = p; b = m " " k }
} END { print b == "" ? "plain" : b }' "$T/prof.jl")
rec=$(sed -n 's/.*"recommendation":"\([a-z]*\)"\(,"draft_len":\([0-9]*\)\)\{0,1\}.*/\1 \3/p' "$T/prof.jl" | sed 's/ $//')
expect_true "the recommendation ($rec) is the best predicted row ($best)" test "$rec" = "$best"
# its options run what was profiled: the draft length with the method's
case $rec in
plain) ;;
*) expect_true "the recommended options carry --draft-len ${rec#* }" \
    sh -c "grep '\"recommendation\"' '$T/prof.jl' | grep -q '\"options\":\"[^\"]* --draft-len ${rec#* }\"'" ;;
esac

# predicted against measured: within 50% here (scripts/check-profile: 25%);
# not in a sanitizer's build, whose instrumented loop around the engine
# is a cost the model leaves out
case ${KVP_CFLAGS:-} in
*sanitize*) echo "specprofile: skipped: predicted against measured (a sanitizer build's timings)" ;;
*)
    far_rows() {
        awk '/"draft_len":[0-9]*,"steps"/ {
            p = $0; sub(/.*"predicted_speedup":/, "", p); p += 0
            q = $0; sub(/.*"measured_speedup":/, "", q); q += 0
            if (q <= 0 || p / q > 1.5 || q / p > 1.5) print substr($0, 1, 40) " predicted " p " measured " q
        }' "$1"
    }
    far=$(far_rows "$T/prof.jl")
    if [ -n "$far" ]; then
        # a timing on a shared host: a busy moment slows the runs of one
        # row and not the costs it is predicted from; a second profile
        # (three runs a request, the fastest kept) must hold, so a model
        # that is wrong still fails
        echo "specprofile: far on the first profile, profiled again:"
        echo "$far"
        specdec -m "$M" -t $THREADS -n 32 --profile "$T/p.jsonl" --draft "$M" --draft-len 2,4 --profile-reps 3 \
            --json >"$T/prof2.jl" 2>/dev/null
        far=$(far_rows "$T/prof2.jl")
        [ -n "$far" ] && echo "$far"
    fi
    expect_true "predicted within 50% of measured on every row" test -z "$far"
    ;;
esac

# the text table: a row for each, the histogram last, the recommendation;
# Medusa heads (trained in a few seconds: they guess poorly, and need not)
run specdec -m "$M" -t $THREADS --train-heads "$T/p.jsonl" -n 16 --epochs 1 --n-heads 2 -o "$T/h.kvp"
expect_status 0 "--train-heads, for --profile --heads"
run specdec -m "$M" -t $THREADS -n 16 --profile "$T/p.jsonl" --draft-len 3 --draft-layers 30 --heads "$T/h.kvp"
expect_status 0 "--profile, text"
expect_out_has "plain decode: " "plain decoding's line"
n=$(grep -Ec '^(ngram|layerskip|heads) +3 .* 8/8 ' "$OUT")
expect_true "a row for each method, each with decode's texts ($n)" test "$n" -eq 3
expect_true "2 heads guess 2 tokens at most: no verify step kept 3" grep -Eq '^heads +3 .* 0$' "$OUT"
expect_true "every layer drafting keeps every draft" grep -Eq '^layerskip +3 +[0-9]+ +[0-9]+ +1\.000 ' "$OUT"
expect_out_has "recommendation: " "a recommendation"

done_testing
