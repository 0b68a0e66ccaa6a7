# prefill reads a prompts file a line at a time (prefill(1), INPUT): on a
# pipe, decode after it answers the first prompts before the rest are
# written; a bad line in the middle fails the job with its file and line
# and leaves no output file; a line's own parameters travel in its
# sequence record to decode; cache_salt keeps tenants apart in prefill's
# prefix cache.
. "$KVP_TESTS/cli/lib.sh"

need_model

# A pipe: prefill must not wait for the rest of its input to start, nor
# decode after it for the end of prefill's stream.
fifo_two_parts "prefill -m '$M' -t 1 -f - | decode -m '$M' -t 1 -n 2 --json" "prefill -f - | decode"

# The same prompts from a file give the same stream as before streaming:
# decode's answers equal decode's own on the file.
printf '{"id":"f1","prompt":"One"}\n{"id":"f2","prompt":"Two"}\n{"id":"f3","prompt":"Three"}\n{"id":"f4","prompt":"Four"}\n' \
    >"$T/four.jsonl"
run decode -m "$M" -t 1 -n 2 -f "$T/four.jsonl" --max-num-seqs 1
sort "$OUT" | sed 's/,"ttft_ms".*//' >"$T/alone"
sort "$T/inc.out" | sed 's/,"ttft_ms".*//' >"$T/piped"
if cmp -s "$T/alone" "$T/piped"; then pass "the streamed prompts' answers are decode's own"
else fail "differ: $(diff "$T/alone" "$T/piped" | head -4)"; fi

# A bad line (3 of 5): the job fails naming the file and line; a file
# output never appears; through a pipe, decode answers what came whole and
# reports the stream cut short.
printf '{"id":"b1","prompt":"a"}\n{"id":"b2","prompt":"b"}\n{"id":"b3","prompt":"c","top_p":"x"}\n{"id":"b4","prompt":"d"}\n' \
    >"$T/bad.jsonl"
run prefill -m "$M" -t 1 -f "$T/bad.jsonl" -o "$T/bad.kvp"
expect_status 1 "a bad line in the middle fails prefill"
expect_err_has "$T/bad.jsonl:3: \"top_p\" must be a number" "the error names the file and line"
expect_err_one_line "one line on stderr"
expect_true "no output file is left" test ! -e "$T/bad.kvp"
run_sh "prefill -m '$M' -t 1 -f '$T/bad.jsonl' | decode -m '$M' -t 1 -n 1"
expect_status 1 "prefill | decode fails on the cut stream"
expect_out_has '"id":"b2"' "the sequences written before the bad line are answered"
expect_out_lacks '"id":"b4"' "nothing after it is"
printf '{"id":"e1","prompt":"a"}\n\n{"id":"e","prompt":""}\n' >"$T/empty.jsonl"
run prefill -m "$M" -t 1 -f "$T/empty.jsonl" -o "$T/empty.kvp"
expect_status 1 "an empty prompt fails prefill"
expect_err_has "empty.jsonl:3: prompt e is empty" "named with its file, line and id"
printf '{"id":"h","prompt":"%s"}\n' "$(printf 'hello %.0s' $(seq 1 9000))" >"$T/huge.jsonl"
run prefill -m "$M" -t 1 -f "$T/huge.jsonl" -o "$T/huge.kvp"
expect_status 1 "a prompt past the model's context fails prefill"
expect_err_has "huge.jsonl:1: prompt h: 9001 tokens are more than the model's context of 8192" "said plainly"

# A line's max_tokens, temperature, seed, stop strings and cache salt travel
# in its sequence record: decode generates what it gives the file alone,
# and its command line, as there, does not override a line's own field.
printf '%s\n' '{"id":"m2","prompt":"Once upon a time","max_tokens":2}' \
    '{"id":"m5","prompt":"Once upon a time","max_tokens":5}' \
    '{"id":"s1","prompt":"Tell me","max_tokens":6,"temperature":0.9,"seed":7}' \
    '{"id":"s2","prompt":"Tell me","max_tokens":6,"temperature":0.9,"seed":7}' \
    '{"id":"st","prompt":"Once upon a time","max_tokens":60,"stop":[".","!"],"cache_salt":"t1"}' >"$T/params.jsonl"
run_sh "prefill -m '$M' -t 1 -f '$T/params.jsonl' | decode -m '$M' -t 1"
expect_status 0 "prefill | decode with per-line parameters"
expect_true "max_tokens 2 gives 2 tokens" grep -q '"id":"m2".*"tokens":2,' "$OUT"
expect_true "max_tokens 5 gives 5 tokens" grep -q '"id":"m5".*"tokens":5,' "$OUT"
sort "$OUT" | sed 's/,"ttft_ms".*//' >"$T/piped"
run decode -m "$M" -t 1 -f "$T/params.jsonl"
sort "$OUT" | sed 's/,"ttft_ms".*//' >"$T/alone"
if cmp -s "$T/alone" "$T/piped"; then pass "every line's text (two sampled at its own seed) is decode's own"
else fail "differ: $(diff "$T/alone" "$T/piped" | head -4)"; fi
expect_true "the stop strings stopped it" grep -q '"id":"st".*"finish_reason":"stop_string"' "$OUT"
run_sh "prefill -m '$M' -t 1 -f '$T/params.jsonl' | decode -m '$M' -t 1 -n 3"
expect_true "decode's -n leaves a line's own max_tokens (2)" grep -q '"id":"m2".*"tokens":2,' "$OUT"
expect_true "decode's -n leaves a line's own max_tokens (5)" grep -q '"id":"m5".*"tokens":5,' "$OUT"
run_sh "prefill -m '$M' -t 1 -f '$T/params.jsonl' | decode -m '$M' -t 1 --stop zzzz"
expect_true "decode's --stop leaves a line's own stop strings" grep -q '"id":"st".*"finish_reason":"stop_string"' "$OUT"
run_sh "prefill -m '$M' -t 1 -f '$T/params.jsonl' | kvdump --json -"
expect_out_has '"label":"st","tokens":' "kvdump shows the record"
expect_true "with its stop strings and salt" grep -q '"label":"st".*"cache_salt":"[0-9a-f]*","stop":\[".","!"\]' "$OUT"
run_sh "prefill -m '$M' -t 1 -f '$T/params.jsonl' | quantize --kv fp8 | decode -m '$M' -t 1"
expect_true "quantize --kv keeps them" grep -q '"id":"st".*"finish_reason":"stop_string"' "$OUT"
# Sampling options given to decode alone: prefill drew each first token
# greedily, so decode draws it again with its own options (and the
# generator seeded as decode -f seeds it); the same seed given to both
# keeps prefill's draw; a line's own seed (c) is the line's everywhere.
printf '%s\n' '{"id":"a","prompt":"Tell me a story"}' '{"id":"b","prompt":"Once upon a time"}' \
    '{"id":"c","prompt":"Hi","seed":4}' >"$T/samp.jsonl"
same_as_file() { # DESC PIPELINE DECODE_OPTS: the pipeline's texts are decode -f's with DECODE_OPTS
    run_sh "$2"
    sort "$OUT" | sed 's/,"ttft_ms".*//' >"$T/piped"
    run decode -m "$M" -t 1 -f "$T/samp.jsonl" -n 10 --json $3
    sort "$OUT" | sed 's/,"ttft_ms".*//' >"$T/alone"
    if cmp -s "$T/alone" "$T/piped" && [ "$(wc -l <"$T/alone")" -eq 3 ]; then pass "$1"
    else fail "$1: $(diff "$T/alone" "$T/piped" | head -4)"; fi
}
same_as_file "decode's --temperature and --seed over a greedy prefill: decode -f's texts" \
    "prefill -m '$M' -t 1 -f '$T/samp.jsonl' | decode -m '$M' -t 1 -n 10 --temperature 0.9 --seed 3" \
    "--temperature 0.9 --seed 3"
same_as_file "decode's --temperature alone (the default seed): decode -f's texts" \
    "prefill -m '$M' -t 1 -f '$T/samp.jsonl' | decode -m '$M' -t 1 -n 10 --temperature 0.7" "--temperature 0.7"
same_as_file "prefill's sampled draw kept when decode gives the same seed" \
    "prefill -m '$M' -t 1 -f '$T/samp.jsonl' --temperature 0.9 --seed 2 | decode -m '$M' -t 1 -n 10 --seed 2" \
    "--temperature 0.9 --seed 2"
# a saved sampled sequence continued with its own --seed goes on as one run
run decode -m "$M" -t 1 -p "Once upon a time" -n 16 --temperature 0.9 --seed 5
whole=$(cat "$OUT")
run decode -m "$M" -t 1 -p "Once upon a time" -n 8 --temperature 0.9 --seed 5 --kv-out "$T/s5.kvp"
first=$(cat "$OUT")
run decode -m "$M" -t 1 -n 8 --seed 5 "$T/s5.kvp"
if [ "$first$(cat "$OUT")" = "$whole" ]; then pass "a saved sequence continued with its --seed: one run's text"
else fail "continued with its seed: '$first$(cat "$OUT")' against '$whole'"; fi
# max_tokens 0 through the stream: no token, as decode -f; --kv-out keeps
# the sequence as prefill wrote it (its first token still pending)
printf '%s\n' '{"id":"z","prompt":"Hello there","max_tokens":0}' '{"id":"y","prompt":"Hello there","max_tokens":2}' \
    >"$T/zero.jsonl"
run_sh "prefill -m '$M' -t 1 -f '$T/zero.jsonl' | decode -m '$M' -t 1 --kv-out '$T/zero.kvp'"
expect_true "max_tokens 0 through a stream: no token" grep -q '"id":"z","text":"","tokens":0,"finish_reason":"length"' "$OUT"
run_sh "prefill -m '$M' -t 1 -f '$T/zero.jsonl' | kvdump -"
grep '"z"' "$OUT" | sed 's/^ *[0-9]* *//' >"$T/zero.want"
run kvdump "$T/zero.kvp"
grep '"z"' "$OUT" | sed 's/^ *[0-9]* *//' >"$T/zero.got"
if cmp -s "$T/zero.want" "$T/zero.got" && [ -s "$T/zero.want" ]; then pass "--kv-out keeps it as prefill wrote it"
else fail "zero: $(cat "$T/zero.want") against $(cat "$T/zero.got")"; fi

# kvdump's listing escapes a label as JSON does: a newline or a terminal
# escape in an id stays inside its record's line
printf '{"id":"a\\nb\\u001b[31m","prompt":"hi"}\n' >"$T/label.jsonl"
run prefill -m "$M" -t 1 -f "$T/label.jsonl" -o "$T/label.kvp"
run kvdump "$T/label.kvp"
expect_out_has 'seq 0 "a\nb\u001b[31m" tokens' "the label escaped"
expect_true "on one line" test "$(grep -c 'sequence' "$OUT")" = 1

# prefill --resume extends each saved sequence by a turn and keeps its
# record's stop strings and salt.
printf '%s\n' '{"id":"st","prompt":"Once upon a time","max_tokens":60,"stop":[".","!"],"cache_salt":"t1"}' \
    >"$T/st.jsonl"
run prefill -m "$M" -t 1 -f "$T/st.jsonl" -o "$T/st.kvp"
run prefill -m "$M" -t 1 --resume "$T/st.kvp" -p " there was" -o "$T/st2.kvp"
expect_status 0 "prefill --resume extends the saved sequence"
run kvdump --json "$T/st2.kvp"
expect_true "the next turn keeps its stop strings and salt" \
    grep -q '"label":"st".*"cache_salt":"[0-9a-f]*","stop":\[".","!"\]' "$OUT"
got=$(grep -o '"token_ids":\[[0-9,]*\]' "$OUT" | sed 's/"token_ids"://')
# ... and is the prompt and the turn alone: prefill's own sample, pending
# and never shown, is not fed (it read "Once upon a time, there was")
run prefill --tokenize --json -m "$M" -p "Once upon a time there was"
want=$(grep -o '"ids":\[[0-9,]*\]' "$OUT" | sed 's/"ids"://')
expect_true "a prefilled sequence resumed: its unshown pending token left out ($got)" test -n "$want" -a "$got" = "$want"
run decode -m "$M" -t 1 --json "$T/st2.kvp"
expect_true "decode of the extended sequence stops at them" grep -q '"id":"st".*"finish_reason":"stop_string"' "$OUT"
# a turn that ended on a stop string is saved as shown: the next turn
# sees the text without the stop string (cache and pending token), the ids
# of the whole conversation written out with the answer as shown
run decode -m "$M" -t 1 --chat -p "Name a prime." -n 64 --stop " is" --kv-out "$T/sp.kvp" --json
expect_out_has '"finish_reason":"stop_string"' "the answer stopped on the stop string"
shown=$(sed -n 's/.*"text":"\([^"]*\)".*/\1/p' "$OUT")
run prefill -m "$M" -t 1 --resume "$T/sp.kvp" --chat -p "And another?" -o "$T/sp2.kvp"
expect_status 0 "prefill --resume after a stop string"
run kvdump --json "$T/sp2.kvp"
got=$(grep -o '"token_ids":\[[0-9,]*\]' "$OUT" | sed 's/"token_ids"://')
printf '{"messages":[{"role":"user","content":"Name a prime."},{"role":"assistant","content":"%s"},{"role":"user","content":"And another?"}]}\n' \
    "$shown" >"$T/conv.jsonl"
run prefill --tokenize --json -m "$M" -f "$T/conv.jsonl"
want=$(grep -o '"ids":\[[0-9,]*\]' "$OUT" | sed 's/"ids"://')
expect_true "the resumed turn's ids are the whole conversation's, as shown ('$shown')" test -n "$want" -a "$got" = "$want"

# --resume --chat closes the assistant's open turn: a sequence that holds
# none (a plain text, a closed turn, the user's turn) is refused, naming
# the file and the sequence, before any of the stream is out (a stray
# <|im_end|> after a plain text made a conversation no one had)
run prefill -m "$M" -t 1 -p "Once upon a time" -o "$T/plain.kvp"
run prefill -m "$M" -t 1 --resume "$T/plain.kvp" --chat -p "Hi" -o "$T/plain2.kvp"
expect_status 1 "--resume --chat of a plain prefill stream"
expect_err_has "prefill: $T/plain.kvp: sequence 0: --chat continues the assistant's open turn, but it holds no ChatML turn (<|im_start|>); without --chat the text goes in as it is" \
    "naming the file, the sequence and what it holds"
expect_err_one_line "one line"
expect_true "nothing written" test ! -e "$T/plain2.kvp"
run prefill -m "$M" -t 1 -p "$(printf '<|im_start|>user\nHi<|im_end|>\n')" -o "$T/closed.kvp"
run prefill -m "$M" -t 1 --resume "$T/closed.kvp" --chat -p "And?" -o "$T/closed2.kvp"
expect_status 1 "--resume --chat of a stream whose last turn is closed"
expect_err_has "sequence 0: --chat continues the assistant's open turn, but its last turn (role \"user\") is closed by <|im_end|>" \
    "says which turn and how it was closed"
run prefill -m "$M" -t 1 -p "$(printf '<|im_start|>user\nHi')" -o "$T/user.kvp"
run prefill -m "$M" -t 1 --resume "$T/user.kvp" --chat -p "And?" -o "$T/user2.kvp"
expect_status 1 "--resume --chat of a stream ending in the user's open turn"
expect_err_has "its last turn's role is \"user\", not \"assistant\"" "says whose turn it is"
# the second of two sequences has no turn: the job fails before the first
# is written, standard output included
printf '%s\n' '{"messages":[{"role":"user","content":"Hi"}]}' '{"prompt":"Once upon a time"}' >"$T/mixed.jsonl"
run prefill -m "$M" -t 1 -f "$T/mixed.jsonl" -o "$T/mixed.kvp"
run_sh "'$KVP_BIN/prefill' -m '$M' -t 1 --resume '$T/mixed.kvp' --chat -p 'And?' > '$T/mixed2.kvp'"
expect_status 1 "--resume --chat of a stream whose second sequence is plain"
expect_err_has "mixed.kvp: sequence 1: --chat continues the assistant's open turn, but it holds no ChatML turn" \
    "names that sequence"
expect_true "nothing on standard output" test ! -s "$T/mixed2.kvp"
# a chat prefill opened the assistant's turn (nothing said in it yet): open
run prefill -m "$M" -t 1 --chat -p "Name a prime." -o "$T/pc.kvp"
run prefill -m "$M" -t 1 --resume "$T/pc.kvp" --chat -p "And another?" -o "$T/pc2.kvp"
expect_status 0 "--resume --chat of a chat prefill stream"

# the same prompt for two tenants: the stream sends its blocks once (a
# salted sequence's block_refs to the other's); read back whole, the
# salted one gets copies of its own, not shared ones and not "no room"
S="You are a careful assistant. Answer briefly and precisely, with one sentence only. Question:"
printf '{"id":"a","prompt":"%s Q?"}\n{"id":"d","prompt":"%s Q?","cache_salt":"t1"}\n' "$S" "$S" >"$T/salts.jsonl"
run prefill -m "$M" -t 1 -f "$T/salts.jsonl" -o "$T/salts.kvp"
run kvdump "$T/salts.kvp"
expect_out_has "block_ref" "the salted sequence's blocks are references to the other's"
run prefill -m "$M" -t 1 --resume "$T/salts.kvp" -p " ok" -o "$T/salts2.kvp"
expect_status 0 "prefill --resume of a stream whose salted sequence refers to another salt's blocks"
run decode -m "$M" -t 1 -n 6 --json "$T/salts2.kvp"
expect_status 0 "decode of it"
a=$(sed -n 's/.*"id":"a","text":\("[^"]*"\).*/\1/p' "$OUT") d=$(sed -n 's/.*"id":"d","text":\("[^"]*"\).*/\1/p' "$OUT")
expect_true "both tenants' sequences give the same text ($a, $d)" test -n "$a" -a "$a" = "$d"

# --progress: a line on stderr as prompts finish, the last one with the
# job done; --resume counts the stream's sequences.
run prefill -m "$M" -t 1 -f "$T/four.jsonl" -o "$T/four.kvp" --progress=0.001
expect_status 0 "prefill --progress"
case $(tail -n 1 "$ERR") in "prefill: 4 of 4 prompts (100.0%); "*" tok/s prompt; "*" elapsed") pass "the last line has all 4" ;;
*) fail "last progress line: $(tail -n 1 "$ERR")" ;; esac
if [ "$(grep -c '^prefill: [0-9] of 4 prompts' "$ERR")" -ge 2 ]; then pass "a line as prompts finish"
else fail "progress lines: $(cat "$ERR")"; fi
run prefill -m "$M" -t 1 --resume "$T/four.kvp" -p " and" -o "$T/four2.kvp" --progress
case $(tail -n 1 "$ERR") in "prefill: 4 of 4 prompts (100.0%)"*) pass "--resume: the stream's 4 sequences" ;;
*) fail "resume progress: $(tail -n 1 "$ERR")" ;; esac
run_sh "prefill -m '$M' -t 1 -f - --progress < '$T/four.jsonl' > /dev/null"
case $(tail -n 1 "$ERR") in "prefill: 4 prompts; "*) pass "standard input: no total" ;;
*) fail "stdin progress: $(tail -n 1 "$ERR")" ;; esac
run prefill -m "$M" --tokenize -p hi --progress
expect_status 2 "--progress with --tokenize is a usage error"
# options a mode would ignore are usage errors, as --progress is
run prefill -m "$M" --tokenize -p hi -o "$T/tk.out"
expect_status 2 "--tokenize with -o (the ids went to standard output, no file)"
expect_true "no file written" test ! -e "$T/tk.out"
run prefill -m "$M" --tokenize -p hi --stats="$T/tk.json"
expect_status 2 "--tokenize with --stats"
run prefill -m "$M" --tokenize -p hi --system Sys
expect_status 2 "--tokenize: --system without --chat, as a prefill job"
for prog in prefill decode specdec; do
    run $prog -m "$M" --chat --tokens 26843
    expect_status 2 "$prog: --chat with --tokens (ids are not rendered)"
    expect_err_has "--chat renders a text in the chat template" "$prog says why"
done
run prefill -m "$M" -p hi --ctx 5
expect_status 2 "--ctx in a prefill job (a --perplexity window)"
expect_err_has "--ctx and --chunks set --perplexity's windows" "says whose"
run prefill -m "$M" -p hi --chunks 2
expect_status 2 "--chunks in a prefill job"
run prefill -m "$M" --perplexity - --kld -
expect_status 2 "--perplexity - with --kld -"
run prefill -m "$M" --perplexity "$T/four.jsonl" --system Sys
expect_status 2 "--system with --perplexity (ignored before)"
run prefill -m "$M" --resume "$T/none.kvp"
expect_status 2 "--resume without its next turn"
expect_err_has "--resume continues with its next turn: give one of -p TEXT and --tokens IDS" "says which inputs"

# cache_salt: prefill's prefix cache gives a tenant's prompt the blocks of
# the same tenant's earlier one, never another tenant's (the stream itself
# still sends equal blocks once: their K/V are the same computation).
long="$(printf 'word %.0s' $(seq 1 48))"
printf '{"id":"t1","prompt":"%s","cache_salt":"a"}\n{"id":"t2","prompt":"%s","cache_salt":"%s"}\n' \
    "$long" "$long" a >"$T/same.jsonl"
printf '{"id":"t1","prompt":"%s","cache_salt":"a"}\n{"id":"t2","prompt":"%s","cache_salt":"%s"}\n' \
    "$long" "$long" b >"$T/other.jsonl"
run prefill -m "$M" -t 1 -f "$T/same.jsonl" --stats -o "$T/same.kvp"
expect_status 0 "one salt"
expect_err_has "t2: 49 prompt tokens (1 computed)" "the same salt reuses the cached blocks"
run prefill -m "$M" -t 1 -f "$T/other.jsonl" --stats -o "$T/other.kvp"
expect_status 0 "two salts"
expect_err_has "t2: 49 prompt tokens (49 computed)" "another salt computes its own"

# decode caches a stream's blocks under their request's salt (the record's,
# else its --cache-salt) as they arrive: a salted request starts on the
# blocks prefill sent (its 3 full blocks and the 1-token partial one, all
# 49 tokens) instead of computing its prompt again, and a block the stream
# shares between two tenants is the first's, and copied for the second
# (a block of its own: tenants never share one), so both start on it.
cached() { sed -n 's/.*"cached_prompt_tokens":\([0-9]*\).*/\1/p' "$1"; }
texts() { sed 's/"ttft_ms".*//' "$1" | sort; }
printf '{"id":"t1","prompt":"%s","cache_salt":"a"}\n' "$long" >"$T/one-salted.jsonl"
prefill -m "$M" -t 1 -f "$T/one-salted.jsonl" -o "$T/one-salted.kvp" 2>/dev/null
run decode -m "$M" -t 1 -n 3 --stats="$T/st.json" "$T/one-salted.kvp"
expect_status 0 "decode of a salted request's stream"
expect_true "it starts on all 49 tokens the stream sent (got $(cached "$T/st.json"))" test "$(cached "$T/st.json")" = 49
printf '{"id":"t1","prompt":"%s"}\n' "$long" >"$T/one.jsonl"
prefill -m "$M" -t 1 -f "$T/one.jsonl" -o "$T/one.kvp" 2>/dev/null
run decode -m "$M" -t 1 -n 3 --cache-salt zz --stats="$T/st.json" "$T/one.kvp"
expect_true "with --cache-salt on an unsalted stream too (got $(cached "$T/st.json"))" test "$(cached "$T/st.json")" = 49
# --no-prefix-cache keeps requests from sharing; a stream's own blocks are
# its requests' own prompts, computed by prefill: still used
run decode -m "$M" -t 1 -n 3 --no-prefix-cache --stats="$T/st.json" "$T/one-salted.kvp"
expect_true "--no-prefix-cache still starts on the stream's blocks (got $(cached "$T/st.json"))" test "$(cached "$T/st.json")" = 49
# a request that ends straight from the stream (a budget of 0, or an end
# token prefill drew) never runs: its prompt came from the stream all the
# same (it counted none, so the hit rate moved with the answers)
run decode -m "$M" -t 1 -n 0 --stats="$T/st.json" "$T/one-salted.kvp"
expect_true "-n 0: the stream's 49 tokens counted as cached (got $(cached "$T/st.json"))" test "$(cached "$T/st.json")" = 49
peak() { sed -n 's/.*"peak_kv_blocks":\([0-9]*\).*/\1/p' "$1"; }
# (and a salted request's blocks copied for an unsalted one after it: it
# had computed its whole prompt again, 49 of 98 from the cache)
printf '{"id":"t1","prompt":"%s","cache_salt":"a"}\n{"id":"t2","prompt":"%s"}\n' "$long" "$long" >"$T/mixed.jsonl"
for pair in same:98 other:98 mixed:98; do
    f=$T/${pair%:*}.jsonl want=${pair#*:}
    prefill -m "$M" -t 1 -f "$f" -o "$T/pair.kvp" 2>/dev/null
    run decode -m "$M" -t 1 -n 3 --stats="$T/st.json" "$T/pair.kvp"
    expect_status 0 "decode of two requests with ${pair%:*} salts"
    expect_true "${pair%:*} salts: $want tokens from the cache (got $(cached "$T/st.json"))" test "$(cached "$T/st.json")" = "$want"
    eval "peak_${pair%:*}=\$(peak \"\$T/st.json\")"
    texts "$OUT" >"$T/got.txt"
    run decode -m "$M" -t 1 -n 3 -f "$f"
    texts "$OUT" >"$T/want.txt"
    expect_true "${pair%:*} salts: the texts decode -f gives" cmp -s "$T/got.txt" "$T/want.txt"
done
expect_true "other salts hold their own copies: more blocks at the peak ($peak_other) than one salt's shared ones ($peak_same)" \
    test "$peak_other" -gt "$peak_same"

# A prompt shorter than a block comes as one partial block: decode runs on
# it and computes none of the prompt again (only each request's 3 tokens
# after prefill's first, a step each under --max-batched-tokens 1), with
# decode -f's texts; with a cache too small for all, preempted requests
# compute theirs again and still give decode -f's texts.
stat_of() { sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p" "$2"; }
printf '{"id":"c%d","prompt":"%s"}\n' 1 'The capital of France is' 2 'Once upon a time' 3 '1, 2, 3, 4, 5,' \
    >"$T/short.jsonl"
prefill -m "$M" -t 1 -f "$T/short.jsonl" -o "$T/short.kvp" 2>/dev/null
run decode -m "$M" -t 1 -n 4 --max-batched-tokens 1 --stats="$T/st.json" "$T/short.kvp"
expect_status 0 "decode of short prompts' stream"
expect_true "every prompt token comes from the stream ($(cached "$T/st.json") of $(stat_of prompt_tokens "$T/st.json"))" \
    test "$(cached "$T/st.json")" = "$(stat_of prompt_tokens "$T/st.json")"
expect_true "9 steps, one a generated token (got $(stat_of steps "$T/st.json"))" test "$(stat_of steps "$T/st.json")" = 9
texts "$OUT" >"$T/got.txt"
run decode -m "$M" -t 1 -n 4 -f "$T/short.jsonl"
texts "$OUT" >"$T/want.txt"
expect_true "short prompts: the texts decode -f gives" cmp -s "$T/got.txt" "$T/want.txt"
run decode -m "$M" -t 1 -n 20 --kv-blocks 3 --stats="$T/st.json" "$T/short.kvp"
expect_status 0 "decode of the stream in 3 blocks"
expect_true "requests were preempted (got $(stat_of preemptions "$T/st.json"))" test "$(stat_of preemptions "$T/st.json")" -gt 0
texts "$OUT" >"$T/got.txt"
run decode -m "$M" -t 1 -n 20 -f "$T/short.jsonl"
texts "$OUT" >"$T/want.txt"
expect_true "preempted: the texts decode -f gives" cmp -s "$T/got.txt" "$T/want.txt"

# --stats --json: a line a prompt, its id escaped as JSON.
printf '{"id":"q\\"x","prompt":"Hi"}\n' >"$T/quote.jsonl"
run prefill -m "$M" -t 1 -f "$T/quote.jsonl" --stats --json -o "$T/quote.kvp"
expect_status 0 "an id with a quote"
expect_err_has '{"id":"q\"x","prompt_tokens":1,' "is escaped in the stats line"
# the text line, one a sequence, escapes it as --tokenize's "# ID" does: a
# newline in an id forged a line of its own ("prefill: sequence 9 forged")
printf '{"id":"a\\nprefill: sequence 9 forged","prompt":"hi"}\n' >"$T/nl.jsonl"
run prefill -m "$M" -t 1 -f "$T/nl.jsonl" --stats -o "$T/nl.kvp"
expect_status 0 "an id with a newline, --stats"
expect_err_has 'prefill: sequence 0 a\nprefill: sequence 9 forged: 1 prompt tokens' "the text stats line escapes it"
expect_true "no line of stderr starts with the forged one" sh -c '! grep -q "^prefill: sequence 9" "$1"' _ "$ERR"
printf '{"id":"a\\nb\\u001b[2J","prompt":""}\n' >"$T/nl-empty.jsonl"
run prefill -m "$M" -t 1 -f "$T/nl-empty.jsonl" -o "$T/nl-empty.kvp"
expect_status 1 "an empty prompt whose id holds a newline"
expect_err_one_line "its error is one line"
expect_err_has 'nl-empty.jsonl:1: prompt a\nb\x1b[2J is empty' "the id escaped in it"

# An id keeps its kind through the stream (the sequence record's LABEL_INT
# flag, kvp(5)): prefill | decode prints 7 as 7, "8" as "8" and a line
# without one as its index, as decode -f does; so do decode after decode
# --kv-out, and prefill's own --stats --json and --tokenize --json lines.
printf '{"id":7,"prompt":"Hi"}\n{"id":"8","prompt":"Yo"}\n{"prompt":"Hey"}\n{"id":-9223372036854775808,"prompt":"Ho"}\n' \
    >"$T/kinds.jsonl"
want='{"id":"8" {"id":-9223372036854775808 {"id":2 {"id":7 '
ids_of() { sed 's/,"text".*//' "$OUT" | LC_ALL=C sort | tr '\n' ' '; }
run_sh "prefill -m '$M' -t 1 -f '$T/kinds.jsonl' | decode -m '$M' -t 1 -n 1"
expect_status 0 "prefill | decode, ids of each kind"
expect_true "prefill | decode: 7 as 7, \"8\" as \"8\", the index as 2 (got $(ids_of))" test "$(ids_of)" = "$want"
run decode -m "$M" -t 1 -n 1 -f "$T/kinds.jsonl" --kv-out "$T/kinds-out.kvp"
expect_status 0 "decode -f, ids of each kind"
expect_true "decode -f: the same ids (got $(ids_of))" test "$(ids_of)" = "$want"
run decode -m "$M" -t 1 -n 1 "$T/kinds-out.kvp"
expect_status 0 "decode of decode's --kv-out"
expect_true "decode of --kv-out: the same ids (got $(ids_of))" test "$(ids_of)" = "$want"
run prefill -m "$M" -t 1 -f "$T/kinds.jsonl" --stats --json -o "$T/kinds.kvp"
expect_status 0 "prefill --stats --json, ids of each kind"
expect_err_has '{"id":7,"prompt_tokens":' "the stats line: 7 as 7"
expect_err_has '{"id":"8","prompt_tokens":' "\"8\" as \"8\""
expect_err_has '{"id":2,"prompt_tokens":' "a line without one as its index"
expect_err_has '{"id":-9223372036854775808,"prompt_tokens":' "the least int64 as itself"
run prefill -m "$M" --tokenize --json -f "$T/kinds.jsonl"
expect_status 0 "prefill --tokenize --json, ids of each kind"
expect_out_has '{"id":7,"ids":[' "--tokenize: 7 as 7"
expect_out_has '{"id":"8","ids":[' "\"8\" as \"8\""
expect_out_has '{"id":2,"ids":[' "a line without one as its index"

# A stop string longer than a record carries: that line fails, named.
awk 'BEGIN { s = ""; for (i = 0; i < 5000; i++) s = s "x"; printf "{\"id\":\"L\",\"prompt\":\"Hi\",\"stop\":[\"%s\"]}\n", s }' \
    >"$T/longstop.jsonl"
run prefill -m "$M" -t 1 -f "$T/longstop.jsonl" -o "$T/longstop.kvp"
expect_status 1 "a stop string over 4096 bytes fails prefill"
expect_err_has 'longstop.jsonl:1: "stop" entry 0 is 5000 bytes (at most 4096)' "named with its line, as the file is read"
expect_true "no output file is left" test ! -e "$T/longstop.kvp"

# A KVP file of tensors where the KV stream goes (a model, Medusa heads) or
# of saved distributions: each skipped record by record, it looked like a
# stream of no sequences (exit 0, no output).  Now an error that says what
# the file is and where it goes; a stream of sequences, and one of none
# but its END (decode --kv-out with nothing to answer), still read.
quantize "$M" -o "$T/model.kvp" >/dev/null 2>&1  # every tensor kept: M's fingerprint
for cmd in "decode -m '$M'" "decode -m '$T/model.kvp'" "specdec -m '$T/model.kvp'"; do
    run_sh "$cmd -t 1 -n 2 '$T/model.kvp'"
    expect_status 1 "a model file as the KV stream: $cmd"
    expect_err_has "model.kvp: a model file (tensors), not a KV stream: give it with -m" "says what it is: $cmd"
    expect_out_empty "no output: $cmd"
done
run_sh "decode -m '$M' -t 1 -n 2 <'$T/model.kvp'"
expect_status 1 "a model file on standard input"
expect_err_has "<stdin>: a model file (tensors), not a KV stream" "says what it is"
run prefill -m "$M" -t 1 --resume "$T/model.kvp" -p hi -o "$T/resumed.kvp"
expect_status 1 "a model file to prefill --resume"
expect_err_has "model.kvp: a model file (tensors), not a KV stream" "says what it is"
# another model's file (its fingerprint differs): what it is, not "KV made
# by another model"
quantize --to q8_0 "$M" -o "$T/small.kvp" >/dev/null 2>&1 # other tensors, another fingerprint
run decode -m "$M" -t 1 -n 2 "$T/small.kvp"
expect_status 1 "another model's file as the KV stream"
expect_err_has "small.kvp: a model file (tensors), not a KV stream: give it with -m" "says what it is"
# Medusa heads, trained in a second with tiny options
printf '%s\n' '{"prompt":"Count: one two three four five six"}' '{"prompt":"Once upon a time there was"}' \
    >"$T/heads.jsonl"
run specdec -m "$M" -t 1 --train-heads "$T/heads.jsonl" -n 8 --epochs 1 --n-heads 1 -o "$T/heads.kvp"
expect_status 0 "a heads file to try"
for prog in decode specdec; do
    run $prog -m "$M" -t 1 -n 2 "$T/heads.kvp"
    expect_status 1 "a heads file as $prog's KV stream"
    expect_err_has "heads.kvp: a Medusa heads file (tensors), not a KV stream: give it to specdec with --heads" \
        "says what it is ($prog)"
done
# saved distributions
awk 'BEGIN { for (i = 0; i < 20; i++) print "The quick brown fox jumps over the lazy dog " i "." }' >"$T/text.txt"
run prefill -m "$M" -t 1 --perplexity "$T/text.txt" --ctx 64 --chunks 1 --save-logits "$T/base.kvp" --save-top 4
expect_status 0 "saved distributions to try"
run decode -m "$M" -t 1 -n 2 "$T/base.kvp"
expect_status 1 "saved distributions as the KV stream"
expect_err_has "base.kvp: saved next-token distributions (prefill --save-logits), not a KV stream" "says what they are"
# the legitimate: a stream of none (header and END), and one of sequences
printf '{"id":"only","prompt":"Hi"}\n' >"$T/only.jsonl"
run decode -m "$M" -t 1 -n 1 -f "$T/only.jsonl" --shard 1/2 --kv-out "$T/none.kvp"
expect_status 0 "decode --kv-out with nothing to answer"
run decode -m "$M" -t 1 -n 2 "$T/none.kvp"
expect_status 0 "a stream of no sequences is still read"
expect_err_empty "and is no error"
run_sh "prefill -m '$M' -t 1 -f '$T/only.jsonl' | decode -m '$M' -t 1 -n 2 --json"
expect_status 0 "a stream of sequences is still read"
expect_out_has '"id":"only"' "and answered"

# decode's scheduler options would do nothing here (one prompt at a time),
# nor its --kv-out (prefill's stream is its output) and --ignore-eos (it
# generates nothing): refused, not ignored, and not in prefill's help.
for o in "--max-num-seqs 2" "--max-batched-tokens 64" "--static" "--kv-out $T/k.kvp" "--ignore-eos"; do
    run prefill -m "$M" -t 1 -p hi $o -o "$T/sched.kvp"
    expect_status 2 "prefill $o is a usage error"
    expect_err_has "${o%% *} is decode's" "says whose option ${o%% *} is"
    expect_true "and writes nothing" [ ! -e "$T/sched.kvp" ]
done
run prefill --help
expect_true "prefill --help leaves decode's scheduler options out" sh -c "! grep -q -- '--max-num-seqs' '$OUT'"
expect_true "nor --kv-out and --ignore-eos as options" sh -c "! grep -qE -- '^ +--(kv-out|ignore-eos) ' '$OUT'"

# Records of kinds decode does not know are skipped among a sequence's KV
# blocks too (kvp(5)), read directly or through quantize --kv; a sequence
# record whose sampling parameters a run refuses is refused naming the file
# and record (test_stream --rewrite edits a copy).
rw="$KVP_UNIT_DIR/test_stream"
printf '{"id":"u1","prompt":"The capital of France is a city"}\n' >"$T/u.jsonl"
run prefill -m "$M" -t 1 -f "$T/u.jsonl" -o "$T/u.kvp"
expect_status 0 "prefill for the unknown-kind stream"
run decode -m "$M" -t 1 -n 2 "$T/u.kvp"
sed 's/,"ttft_ms".*//' "$OUT" >"$T/u.want"
for k in 0 1; do
    "$rw" --rewrite "$T/u.kvp" "$T/u$k.kvp" "unknown@$k" || { status=1; fail "could not insert a record after $k"; }
    run decode -m "$M" -t 1 -n 2 "$T/u$k.kvp"
    expect_status 0 "decode skips an unknown kind after record $k"
    sed 's/,"ttft_ms".*//' "$OUT" >"$T/u.got"
    if cmp -s "$T/u.want" "$T/u.got"; then pass "the same answer as without it ($k)"; else fail "answers differ ($k)"; fi
done
run_sh "quantize --kv fp8 '$T/u0.kvp' | decode -m '$M' -t 1 -n 2"
expect_status 0 "quantize --kv | decode with an unknown kind among the blocks"
"$rw" --rewrite "$T/u.kvp" "$T/unan.kvp" seq-f32@24=nan || { status=1; fail "could not write a NaN temperature"; }
run decode -m "$M" -t 1 -n 2 "$T/unan.kvp"
expect_status 1 "decode refuses a NaN temperature in a sequence record"
expect_err_has "$T/unan.kvp: record 0 (sequence) at offset 64: temperature nan" "names the file and the record"
expect_err_one_line "in one line"
"$rw" --rewrite "$T/u.kvp" "$T/unext.kvp" seq-u32@16=1000000000 || { status=1; fail "could not write a next token"; }
run decode -m "$M" -t 1 -n 2 "$T/unext.kvp"
expect_status 1 "decode refuses a next token outside the vocabulary"
expect_err_has "$T/unext.kvp: sequence 0: next token 1000000000 is outside the vocabulary" "names the file and sequence"

# A line's own fields win over decode's options through a stream as in
# decode -f (the record says which values the line set); decode's options
# replace the rest: max_tokens, temperature with seed, and stop strings.
printf '%s\n' '{"id":"own","prompt":"Count: one two three","max_tokens":2}' \
    '{"id":"temp","prompt":"Once upon a time","temperature":0.9,"seed":3}' \
    '{"id":"stop","prompt":"Count: one two three","stop":["six"]}' '{"id":"def","prompt":"Count: one two"}' \
    >"$T/own.jsonl"
run decode -m "$M" -t 1 -f "$T/own.jsonl" -n 8 --temperature 0 --seed 9 --stop five --json
sed 's/,"ttft_ms".*//' "$OUT" | sort >"$T/own.direct"
run_sh "prefill -m '$M' -t 1 -f '$T/own.jsonl' | decode -m '$M' -t 1 -n 8 --temperature 0 --seed 9 --stop five --json"
expect_status 0 "prefill | decode with options over lines' own fields"
sed 's/,"ttft_ms".*//' "$OUT" | sort >"$T/own.piped"
if cmp -s "$T/own.direct" "$T/own.piped"; then pass "the lines' own fields win as in decode -f"
else fail "differ: $(diff "$T/own.direct" "$T/own.piped" | head -6)"; fi
expect_true "the line's max_tokens 2, not -n 8" grep -q '"id":"own".*"tokens":2,' "$T/own.piped"
expect_true "the line's stop string, not --stop" grep -q '"id":"stop","text":" four five ' "$T/own.piped"

# A saved sequence continued (decode --kv-out, then decode FILE) is a new
# request: -n given asks that many more tokens, over the max_tokens its
# line set (decode(1), -n); without -n the record's own goes on.
run decode -m "$M" -t 1 -f "$T/own.jsonl" -n 3 --ignore-eos --kv-out "$T/own-saved.kvp"
expect_true "the line's max_tokens 2 first" grep -q '"id":"own".*"tokens":2,' "$OUT"
run decode -m "$M" -t 1 -n 5 --ignore-eos --json "$T/own-saved.kvp" --kv-out "$T/own-saved2.kvp"
expect_status 0 "decode -n 5 continuing the saved sequences"
expect_true "-n 5 gives the continued line 5 more tokens, not its max_tokens 2" \
    grep -q '"id":"own".*"tokens":5,' "$OUT"
expect_true "and the line without max_tokens 5" grep -q '"id":"def".*"tokens":5,' "$OUT"
run decode -m "$M" -t 1 --ignore-eos --json "$T/own-saved.kvp"
expect_true "without -n the record's own max_tokens 2" grep -q '"id":"own".*"tokens":2,' "$OUT"
expect_true "and the other record's 3 (its run's -n)" grep -q '"id":"def".*"tokens":3,' "$OUT"
# saved again, its max_tokens is -n's, no longer the line's own (kvp(5)):
# the options of a next turn replace it
run_sh "prefill -m '$M' -t 1 --resume '$T/own-saved2.kvp' -p ' and' -n 4 | decode -m '$M' -t 1 --ignore-eos --json"
expect_status 0 "prefill --resume of the sequences saved again | decode"
expect_true "their max_tokens no longer the line's: prefill's -n 4" grep -q '"id":"own".*"tokens":4,' "$OUT"
# prefill --resume -n: the next turn of a saved sequence is a new request,
# as decode's continuation is: -n replaces the max_tokens its line set, and
# the record it writes holds -n's as a default (prefill(1), --resume)
run_sh "prefill -m '$M' -t 1 --resume '$T/own-saved.kvp' -p ' and' -n 4 | decode -m '$M' -t 1 --ignore-eos --json"
expect_status 0 "prefill --resume -n 4 of the sequences saved once | decode"
expect_true "prefill's -n 4 for the line's next turn, not its max_tokens 2" \
    grep -q '"id":"own".*"tokens":4,' "$OUT"
expect_true "and 4 for the line without one" grep -q '"id":"def".*"tokens":4,' "$OUT"
run_sh "prefill -m '$M' -t 1 --resume '$T/own-saved.kvp' -p ' and' -n 4 | decode -m '$M' -t 1 -n 6 --ignore-eos --json"
expect_true "then decode's -n 6 replaces it" grep -q '"id":"own".*"tokens":6,' "$OUT"
run_sh "prefill -m '$M' -t 1 --resume '$T/own-saved.kvp' -p ' and' | decode -m '$M' -t 1 --ignore-eos --json"
expect_true "without -n the record's own max_tokens 2 goes on" grep -q '"id":"own".*"tokens":2,' "$OUT"
# a prefilled sequence has not generated: its line's max_tokens wins, as
# through prefill | decode
run_sh "prefill -m '$M' -t 1 -f '$T/own.jsonl' -o '$T/own-pf.kvp' && prefill -m '$M' -t 1 --resume '$T/own-pf.kvp' -p ' and' -n 4 | decode -m '$M' -t 1 --ignore-eos --json"
expect_status 0 "prefill --resume -n 4 of a prefill's sequences | decode"
expect_true "a prefilled line keeps its max_tokens 2" grep -q '"id":"own".*"tokens":2,' "$OUT"
expect_true "the line without one gets -n 4" grep -q '"id":"def".*"tokens":4,' "$OUT"

# --stop: stored in every sequence record as its request's default stop
# strings, as -n and the sampling options are (prefill(1), OPTIONS): decode
# stops there unless given its own --stop, and a line's own stop strings win
# over both.  It was accepted and dropped: decode ran to -n.
printf '%s\n' '{"id":"a","prompt":"Count: one two three"}' '{"id":"b","prompt":"Count: one two three","stop":["six"]}' \
    >"$T/cnt.jsonl"
run_sh "prefill -m '$M' -t 1 -f '$T/cnt.jsonl' -n 8 --stop five | decode -m '$M' -t 1 --json"
expect_status 0 "prefill --stop | decode"
expect_true "prefill's --stop stops a line without its own" grep -q '"id":"a","text":" four ","tokens":2,"finish_reason":"stop_string"' "$OUT"
expect_true "a line's own stop strings win over it" grep -q '"id":"b","text":" four five ","tokens":3,"finish_reason":"stop_string"' "$OUT"
run_sh "prefill -m '$M' -t 1 -f '$T/cnt.jsonl' -n 8 --stop five | decode -m '$M' -t 1 --json --stop zzzz"
expect_true "decode's --stop replaces prefill's" grep -q '"id":"a".*"tokens":8,"finish_reason":"length"' "$OUT"
expect_true "but not a line's own" grep -q '"id":"b".*"finish_reason":"stop_string"' "$OUT"
run_sh "prefill -m '$M' -t 1 -p 'Count: one two three' -n 8 --stop five --stop four | kvdump --json -"
expect_true "-p: the record carries both (kvdump)" grep -q '"kind":"sequence".*"stop":\["five","four"\]' "$OUT"
run prefill -m "$M" -t 1 -f "$T/cnt.jsonl" -n 8 -o "$T/cnt.kvp"
run_sh "prefill -m '$M' -t 1 --resume '$T/cnt.kvp' -p ' four' --stop seven | decode -m '$M' -t 1 --json"
expect_status 0 "prefill --resume --stop | decode"
expect_true "--resume: --stop gives the next turn a default" grep -q '"id":"a","text":" five six ","tokens":3,"finish_reason":"stop_string"' "$OUT"
expect_true "and leaves a line's own" grep -q '"id":"b","text":" five ","tokens":2,"finish_reason":"stop_string"' "$OUT"
run prefill -m "$M" -t 1 -p hi --stop "$(printf 'x%.0s' $(seq 1 4097))" -o "$T/lstop.kvp"
expect_status 2 "a --stop longer than a record carries is a usage error"
expect_err_has "--stop: a stop string of 4097 bytes (a sequence record carries at most 4096)" "said before any work"
expect_true "and nothing is written" test ! -e "$T/lstop.kvp"
run_sh "prefill -m '$M' -t 1 -p hi $(printf -- '--stop s%d ' $(seq 1 65)) -o '$T/nstop.kvp'"
expect_status 2 "65 --stop strings are a usage error"
expect_err_has "--stop given 65 times (a sequence record carries at most 64)" "said so"

# SIGTERM (or SIGINT) stops prefill as it stops decode (prefill(1), SIGNALS):
# the prompt in progress is finished and written, the stream ends with its
# END record (a valid stream of what was done, never a half record), the
# message says what was left and the exit status is 143.  Before, prefill
# died at once: a stream on stdout cut anywhere, -o FILE not written.
rm -f "$T/fifo"
mkfifo "$T/fifo"
prefill -m "$M" -t 1 -f - --stats <"$T/fifo" >"$T/term.kvp" 2>"$T/term.err" &
pid=$!
exec 7>"$T/fifo"
printf '{"id":"p1","prompt":"One"}\n{"id":"p2","prompt":"Two"}\n' >&7
i=0
while ! grep -qs 'sequence 1 p2' "$T/term.err" && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
kill -TERM $pid
wait_exit $pid "prefill -f FIFO, SIGTERM while it waits for line 3"
exec 7>&-
rm -f "$T/fifo"
LAST_CMD="prefill -f - <FIFO >term.kvp, SIGTERM while it waits for the third line"
expect_status 143 "prefill: SIGTERM while waiting for input exits 143"
expect_true "says what it wrote and that input was left" grep -q \
    "^prefill: stopped by Terminated: 2 sequences written, 0 read and not finished, the rest of the input not read yet$" \
    "$T/term.err"
run kvdump --check "$T/term.kvp"
expect_status 0 "the stream on stdout is whole (kvdump --check)"
run kvdump --json "$T/term.kvp"
expect_true "with both sequences" test "$(grep -c '"kind":"sequence"' "$OUT")" = 2
# ... and says it was cut short (a STOP record before END, kvp(5)), which a
# decode down the pipe reports after answering what the stream holds,
# failing as prefill did; quantize --kv keeps the record
expect_out_has '"kind":"stop",' "a STOP record"
expect_out_has '"signal":15,"signal_text":"Terminated","written":2,"left":0,"input_left":true}' \
    "naming SIGTERM, 2 written, input left"
run kvdump "$T/term.kvp"
expect_out_has "producer stopped by Terminated: 2 sequences written, 0 read and not finished, its input not read to the end" \
    "kvdump says so"
run decode -m "$M" -t 1 -n 2 --json "$T/term.kvp"
expect_status 1 "decode of a stopped producer's stream exits 1"
expect_true "after answering both sequences" test "$(grep -c '"finish_reason"' "$OUT")" = 2
expect_err_has "term.kvp: the stream was cut short: its producer was stopped by Terminated after writing 2 sequences (0 read and not finished, the rest of its input not read)" \
    "and says why"
run_sh "quantize --kv fp8 <'$T/term.kvp' | decode -m '$M' -t 1 -n 2 --json"
expect_status 1 "through quantize --kv fp8 too"
expect_err_has "<stdin>: the stream was cut short" "the record kept by quantize --kv"
# a program continuing such a stream passes the record on: decode --kv-out
# and prefill --resume each write their stream with a STOP record of the
# producer's signal and their own count, fail as decode does above, and a
# decode of what they wrote says the input was cut short again
run decode -m "$M" -t 1 -n 2 --json "$T/term.kvp" --kv-out "$T/term-out.kvp"
expect_status 1 "decode --kv-out of a cut stream exits 1"
run kvdump --json "$T/term-out.kvp"
expect_out_has '"signal":15,"signal_text":"Terminated","written":2,"left":0,"input_left":true}' \
    "--kv-out's stream carries the STOP record"
run prefill -m "$M" -t 1 --resume "$T/term.kvp" -p " and" -o "$T/term-resumed.kvp"
expect_status 1 "prefill --resume of a cut stream exits 1"
expect_err_has "term.kvp: the stream was cut short: its producer was stopped by Terminated" "and says why"
run kvdump --json "$T/term-resumed.kvp"
expect_out_has '"signal":15,"signal_text":"Terminated","written":2,"left":0,"input_left":true}' \
    "prefill --resume's stream carries it"
run decode -m "$M" -t 1 -n 2 --json "$T/term-resumed.kvp"
expect_status 1 "decode of the resumed stream exits 1 too"
expect_true "after answering both sequences" test "$(grep -c '"finish_reason"' "$OUT")" = 2
run prefill -m "$M" -t 1 -p "Hi" -o "$T/whole.kvp"
run kvdump --json "$T/whole.kvp"
expect_true "a job that was not stopped writes no STOP record" sh -c "! grep -q '\"kind\":\"stop\"' '$OUT'"
# mid-computation, to -o FILE: the file appears whole, every prompt that
# finished in it, and no temporary file is left
awk 'BEGIN { for (i = 0; i < 2000; i++)
    printf "{\"id\":\"q%d\",\"prompt\":\"Tell me a long story about the number %d and all of its friends.\"}\n", i, i }' \
    >"$T/many.jsonl"
prefill -m "$M" -t 1 -f "$T/many.jsonl" --stats -o "$T/many.kvp" 2>"$T/many.err" &
pid=$!
i=0
while ! grep -qs 'sequence 0 q0' "$T/many.err" && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
kill -TERM $pid
wait_exit $pid "prefill -f FILE -o FILE, SIGTERM while it computes"
LAST_CMD="prefill -f many.jsonl -o many.kvp, SIGTERM after its first prompt"
expect_status 143 "prefill: SIGTERM mid-run exits 143"
n=$(sed -n 's/^prefill: stopped by Terminated: \([0-9]*\) sequences written, 0 read and not finished, the rest of the input not read yet$/\1/p' "$T/many.err")
expect_true "says how many it wrote (got '$n')" test -n "$n"
expect_true "one stats line each ($(grep -c '^prefill: sequence' "$T/many.err"))" \
    test "$(grep -c '^prefill: sequence' "$T/many.err")" = "$n"
run kvdump --check "$T/many.kvp"
expect_status 0 "-o FILE is written, whole (kvdump --check)"
run kvdump --json "$T/many.kvp"
expect_true "with the $n sequences" test "$(grep -c '"kind":"sequence"' "$OUT")" = "$n"
if ls "$T"/many.kvp.tmp.* >/dev/null 2>&1; then fail "a temporary file was left"; else pass "no temporary file left"; fi
# inside a long prompt: it stops at its next chunk (512 tokens), the prompt
# dropped and counted as read and not finished; before, the whole prompt
# (here some 8,000 tokens, seconds) was computed first
awk 'BEGIN { s = ""; for (i = 0; i < 4000; i++) s = s " green apple"; printf "{\"id\":\"long\",\"prompt\":\"%s\"}\n", s }' \
    >"$T/long.jsonl"
rm -f "$T/fifo"
mkfifo "$T/fifo"
prefill -m "$M" -t 1 -f - --stats -o "$T/long.kvp" <"$T/fifo" 2>"$T/long.err" &
pid=$!
exec 7>"$T/fifo"
printf '{"id":"short","prompt":"One"}\n' >&7
i=0
while ! grep -qs 'sequence 0 short' "$T/long.err" && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
cat "$T/long.jsonl" >&7
sleep 1
kill -TERM $pid
wait_exit $pid "prefill, SIGTERM inside a long prompt"
exec 7>&-
rm -f "$T/fifo"
LAST_CMD="prefill -f FIFO -o long.kvp, SIGTERM a second into an 8,000-token prompt"
expect_status 143 "prefill: SIGTERM inside a long prompt exits 143"
expect_true "the long prompt is dropped, not finished first" grep -q \
    "^prefill: stopped by Terminated: 1 sequences written, 1 read and not finished, the rest of the input not read yet$" \
    "$T/long.err"
run kvdump --json "$T/long.kvp"
expect_true "the stream holds the short prompt alone" test "$(grep -c '"kind":"sequence"' "$OUT")" = 1
expect_out_has '"written":1,"left":1,"input_left":true}' "and its STOP record says so"
# before any prompt (a FIFO no writer has opened yet): a stream of none
rm -f "$T/fifo"
mkfifo "$T/fifo"
prefill -m "$M" -t 1 -f "$T/fifo" -o "$T/none.kvp" 2>"$T/none.err" &
term_when_waiting $! "prefill -f FIFO, SIGTERM before a writer opened it"
rm -f "$T/fifo"
LAST_CMD="prefill -f FIFO -o none.kvp, SIGTERM before any writer opened the FIFO"
expect_status 143 "prefill: SIGTERM before the prompts opened exits 143"
expect_true "and says so" grep -q "^prefill: stopped by Terminated: 0 sequences written, 0 read and not finished" \
    "$T/none.err"
run kvdump --check "$T/none.kvp"
expect_status 0 "-o FILE holds a whole stream of no sequences"

# TTFT of a stream's request: through a pipe from the prefill's arrival (the
# stream records it), from a stored file as of the job's start (a file
# prefilled long ago is not a request that waited all that time)
run prefill -m "$M" -t 1 -p "Once upon a time" -o "$T/aged.kvp"
sleep 2
ttft() { sed -n 's/.*"ttft_ms":\([0-9.]*\).*/\1/p' "$OUT"; }
run decode -m "$M" -t 1 -n 2 --json "$T/aged.kvp"
t=$(ttft)
expect_true "a stored stream's TTFT is this job's ($t ms)" awk -v t="$t" 'BEGIN { exit !(t != "" && t < 1500) }'
run_sh "cat '$T/aged.kvp' | decode -m '$M' -t 1 -n 2 --json"
t=$(ttft)
expect_true "a piped stream's TTFT counts from its arrival in prefill ($t ms)" \
    awk -v t="$t" 'BEGIN { exit !(t != "" && t >= 2000) }'

done_testing
