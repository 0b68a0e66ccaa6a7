# decode reads a prompts file as its queue drains (decode(1), INPUT): every
# line of a long file is answered exactly once; on a pipe the first answers
# come before the rest of the prompts is written; a bad line in the middle
# is reported with the file and line (exit 1) after every request read
# before it has been answered (so is a KV stream cut short), and --resume
# then finishes the job.  Ids are keys compared as text, as --resume compares
# them: two requests with one key are such a bad line, naming both lines; a
# byte order mark opening the file is skipped.
. "$KVP_TESTS/cli/lib.sh"

need_model

# 2,000 one-token requests through a small cache: each id once, no other.
awk 'BEGIN { for (i = 0; i < 2000; i++) printf "{\"id\":\"s%d\",\"prompt\":\"%d\",\"max_tokens\":1}\n", i, i }' \
    >"$T/many.jsonl"
run decode -m "$M" -t 2 -f "$T/many.jsonl" --kv-mem 8MiB
expect_status 0 "2,000 requests complete"
sed -n 's/^{"id":"\([^"]*\)".*/\1/p' "$OUT" | sort >"$T/got"
sed -n 's/^{"id":"\([^"]*\)".*/\1/p' "$T/many.jsonl" | sort >"$T/want"
if [ "$(wc -l <"$OUT")" -eq 2000 ] && cmp -s "$T/got" "$T/want"; then pass "every id exactly once"
else fail "ids: $(wc -l <"$OUT") lines, $(sort -u "$T/got" | wc -l) distinct"; fi

# A pipe: decode must not wait for the rest of the input to start.
fifo_two_parts "decode -m '$M' -t 2 -f - -n 2 --json" "decode -f -"
# A first line, and the second 3 s later: the first request starts at once,
# so its TTFT (from its arrival) leaves the wait out; and one line on a pipe,
# then its end, is answered as plain text, as one request is.
cat >"$T/late.sh" <<'EOS'
printf '{"id":"w1","prompt":"One"}\n'
sleep "$1"
[ "$2" = two ] && printf '{"id":"w2","prompt":"Two"}\n'
exit 0
EOS
run_sh "sh '$T/late.sh' 3 two | decode -m '$M' -t 2 -f - -n 2 --json"
expect_status 0 "a pipe whose second line comes late"
ttft=$(sed -n 's/^{"id":"w1".*"ttft_ms":\([0-9]*\).*/\1/p' "$OUT")
expect_true "the first request's TTFT leaves out the wait for the second ($ttft ms)" test "${ttft:-9999}" -lt 2500
run_sh "sh '$T/late.sh' 1 one | decode -m '$M' -t 2 -f - -n 2"
expect_status 0 "one line on a pipe, then its end"
expect_out_lacks '"id"' "is answered as plain text, as one request is"

# A bad line (30 of 40): the 29 read before it are answered and written, the
# error names the file and line, nothing after it is started.
awk 'BEGIN { for (i = 1; i <= 40; i++)
    if (i == 30) print "{\"id\":\"b30\",\"prompt\":\"x\",\"top_p\":0}"; else printf "{\"id\":\"b%d\",\"prompt\":\"%d\"}\n", i, i }' \
    >"$T/bad.jsonl"
for how in file pipe; do
    rm -f "$T/res.jsonl"
    if [ $how = file ]; then
        run decode -m "$M" -t 2 -f "$T/bad.jsonl" -n 1 --max-num-seqs 2 --resume "$T/res.jsonl"
        where="$T/bad.jsonl:30:"
    else
        run_sh "cat '$T/bad.jsonl' | decode -m '$M' -t 2 -f - -n 1 --max-num-seqs 2 --resume '$T/res.jsonl'"
        where="-:30:"
    fi
    expect_status 1 "$how: a bad line in the middle fails the job"
    expect_err_has "$where \"top_p\" must be a number" "$how: the error names the file and line"
    expect_err_one_line "$how: one line on stderr"
    sed -n 's/^{"id":"\([^"]*\)".*/\1/p' "$T/res.jsonl" | sort >"$T/got"
    awk 'BEGIN { for (i = 1; i < 30; i++) printf "b%d\n", i }' | sort >"$T/want"
    if cmp -s "$T/got" "$T/want"; then pass "$how: the 29 requests before it were answered, none after"
    else fail "$how: answered $(tr '\n' ' ' <"$T/got")"; fi
done
# The same when the bad line is the second: the first is answered, as JSON
# (the input did not end after one request).
printf '{"id":"a1","prompt":"Hi"}\n{"id":"a2","prompt":"Yo","top_p":"x"}\n' >"$T/bad2.jsonl"
run decode -m "$M" -t 2 -f "$T/bad2.jsonl" -n 1
expect_status 1 "a bad second line fails the job"
expect_err_has "$T/bad2.jsonl:2: \"top_p\" must be a number" "the error names the second line"
expect_out_has '{"id":"a1",' "the first request is answered (as JSON: the file held more)"

# A KV stream of two sequences cut after the first one's blocks, or inside
# the second's: the first is answered, the cut reported (exit 1).
printf '{"id":"k1","prompt":"Once upon a time"}\n{"id":"k2","prompt":"The capital of France is"}\n' >"$T/two.jsonl"
prefill -m "$M" -t 2 -f "$T/two.jsonl" -o "$T/two.kvp" 2>/dev/null
second=$(kvdump --json "$T/two.kvp" | sed -n 's/.*"kind":"sequence","index":2,"offset":\([0-9]*\).*/\1/p')
for n in "$second" $((second + 400)); do
    head -c "$n" "$T/two.kvp" >"$T/cut.kvp"
    run decode -m "$M" -t 2 -n 1 "$T/cut.kvp"
    expect_status 1 "a stream cut at byte $n of two sequences fails the job"
    expect_err_has "truncated" "the cut at byte $n is reported"
    expect_out_has '{"id":"k1",' "the first sequence, whole before byte $n, is answered"
    expect_out_lacks '"id":"k2"' "the cut one is not"
done

sed 's/"top_p":0/"top_p":1/' "$T/bad.jsonl" >"$T/fixed.jsonl"
run decode -m "$M" -t 2 -f "$T/fixed.jsonl" -n 1 --max-num-seqs 2 --resume "$T/res.jsonl"
expect_status 0 "the line fixed, --resume finishes the job"
n=$(sed -n 's/^{"id":"\([^"]*\)".*/\1/p' "$T/res.jsonl" | sort -u | wc -l)
if [ "$(wc -l <"$T/res.jsonl")" -eq 40 ] && [ "$n" -eq 40 ]; then pass "each of the 40 once"
else fail "$(wc -l <"$T/res.jsonl") lines, $n ids after resuming"; fi

# A prompt that tokenizes to nothing, on line 3: named with its line.
printf '{"prompt":"a"}\n\n{"id":"e","prompt":""}\n' >"$T/empty.jsonl"
run decode -m "$M" -t 2 -f "$T/empty.jsonl" -n 1
expect_status 1 "an empty prompt fails the job"
expect_err_has "empty.jsonl:3: prompt e is empty" "named with its file, line and id (not a count read as the index)"
expect_out_has '"id":0' "the prompt before it is answered"

# prefill's output given with -f (decode reads a stream as its input file)
# or a binary file as a text prompt: said so, before any model work.
printf '{"id":"k","prompt":"Hi"}\n' >"$T/one.jsonl"
run prefill -m "$M" -t 2 -f "$T/one.jsonl" -o "$T/one.kvp"
expect_status 0 "prefill writes a stream"
run decode -m "$M" -t 2 -f "$T/one.kvp" -n 1
expect_status 1 "decode -f STREAM fails"
expect_err_has "one.kvp: starts with byte 0x89 \"KVP\": a KVP stream, not a prompts file" "the error says it is a KVP stream"
expect_err_one_line "one line on stderr"
run_sh "decode -m '$M' -t 2 -f - -n 1 <'$T/one.kvp'"
expect_status 1 "a stream on standard input with -f - fails too"
expect_err_has "-: starts with byte 0x89" "named as standard input"
run decode -m "$M" -t 2 "$T/one.kvp" -n 1
expect_status 0 "the same stream as the input file is decoded"
printf 'GGUF\003\000\000\000 weights' >"$T/bin.txt"
run decode -m "$M" -t 2 -f "$T/bin.txt" -n 1
expect_status 1 "a binary file as a text prompt fails"
expect_err_has "bin.txt: byte 5 is NUL: a binary file, not a text prompt" "the error names the NUL's offset"
# ... at once, not after reading a gigabyte of it (/dev/zero has no end)
run timeout 60 prefill -m "$M" -t 2 -f /dev/zero -o "$T/z.kvp"
expect_status 1 "/dev/zero as the prompts fails"
expect_err_has "/dev/zero: byte 0 is NUL: a binary file, not a text prompt" "at its first NUL, not at the 1 GiB ceiling"

# Plain text must be UTF-8, as a JSON prompt's strings are: a bad byte is
# refused (it used to vanish in the tokenizer), in a text prompts file with
# its line, in -p and --system as a usage error naming the option.
printf 'fine\nbad \377 utf8\n' >"$T/bad8.txt"
run decode -m "$M" -t 2 -f "$T/bad8.txt" -n 1
expect_status 1 "invalid UTF-8 in a text prompts file fails"
expect_err_has "bad8.txt:2: invalid UTF-8 at byte offset 4 of the line (0xff)" "naming the file, line and offset"
expect_err_one_line "one line on stderr"
run decode -m "$M" -t 2 -p "$(printf 'x\377y')" -n 1
expect_status 2 "invalid UTF-8 in -p is a usage error"
expect_err_has "decode: -p: invalid UTF-8 at byte offset 1 (0xff)" "naming the option and offset"
run decode -m "$M" -t 2 --chat -p hi --system "$(printf '\377')" -n 1
expect_status 2 "invalid UTF-8 in --system is a usage error"
expect_err_has "decode: --system: invalid UTF-8 at byte offset 0 (0xff)" "naming --system"
run prefill -m "$M" --tokenize -p "$(printf 'bad \377 utf8')"
expect_status 2 "prefill --tokenize -p refuses it too"


# Ids: 1, the index 1 of a line without "id", "1" and "x" twice (the audit's
# file).  --resume keys 1 and "1" alike, so the second line would be skipped
# as done once the first was: the second line is the bad one, named with the
# id and the line that had it first; the first request is answered.
printf '{"id":1,"prompt":"a"}\n{"prompt":"b"}\n{"id":"1","prompt":"c"}\n{"id":"x","prompt":"d"}\n{"id":"x","prompt":"e"}\n' \
    >"$T/dup.jsonl"
run decode -m "$M" -t 2 -f "$T/dup.jsonl" -n 1
expect_status 1 "a repeated id (an index meeting an integer id) fails the job"
expect_err_has "dup.jsonl:2: id 1 (this line's index: it has no \"id\") was already on line 1 (as the integer 1)" \
    "the error names the id and both lines"
expect_err_one_line "one line on stderr for a repeated id"
expect_out_has '{"id":1,' "the request before it is answered (an integer id prints as the integer)"
if [ "$(wc -l <"$OUT")" -eq 1 ]; then pass "nothing after the repeated id is started"; else fail "$(wc -l <"$OUT") lines"; fi
# The same id in two forms, or twice, in the middle: the requests before it
# are answered into --resume's file; fixed, --resume finishes with each once.
for form in '"id":"3"' '"id":"b2"'; do
    awk -v f="$form" 'BEGIN { for (i = 1; i <= 8; i++)
        if (i == 6) printf "{%s,\"prompt\":\"x\"}\n", f; else if (i == 3) print "{\"id\":3,\"prompt\":\"3\"}";
        else printf "{\"id\":\"b%d\",\"prompt\":\"%d\"}\n", i, i }' >"$T/dup2.jsonl"
    rm -f "$T/res.jsonl"
    run decode -m "$M" -t 2 -f "$T/dup2.jsonl" -n 1 --max-num-seqs 2 --resume "$T/res.jsonl"
    expect_status 1 "$form on line 6 fails the job"
    case $form in
    *3*) expect_err_has "dup2.jsonl:6: id \"3\" was already on line 3 (as the integer 3): each request needs its own id" \
        "\"3\" after 3: both lines named" ;;
    *) expect_err_has "dup2.jsonl:6: id \"b2\" was already on line 2: each request needs its own id" \
        "\"b2\" twice: both lines named" ;;
    esac
    if [ "$(wc -l <"$T/res.jsonl")" -eq 5 ]; then pass "$form: the 5 requests before it were answered"
    else fail "$form: $(wc -l <"$T/res.jsonl") lines answered"; fi
    sed 's/^{"id":"[b0-9]*","prompt":"x"}$/{"id":"b6","prompt":"x"}/' "$T/dup2.jsonl" >"$T/fixed2.jsonl"
    run decode -m "$M" -t 2 -f "$T/fixed2.jsonl" -n 1 --max-num-seqs 2 --resume "$T/res.jsonl"
    expect_status 0 "$form: fixed, --resume finishes the job"
    n=$(sed -n 's/^{"id":\("[^"]*"\|-\{0,1\}[0-9]*\),.*/\1/p' "$T/res.jsonl" | sort -u | wc -l)
    if [ "$(wc -l <"$T/res.jsonl")" -eq 8 ] && [ "$n" -eq 8 ]; then pass "$form: each of the 8 once"
    else fail "$form: $(wc -l <"$T/res.jsonl") lines, $n ids after resuming"; fi
done
# An id is printed as it was given: an integer as the integer, a string of
# digits as that string, a line without one as its index; --resume reads
# each back as the same request: a second run has nothing left to do.
printf '{"id":5,"prompt":"a"}\n{"prompt":"b"}\n{"id":-3,"prompt":"c"}\n{"id":"7","prompt":"d"}\n' >"$T/intid.jsonl"
rm -f "$T/res.jsonl"
run decode -m "$M" -t 2 -f "$T/intid.jsonl" -n 1 --resume "$T/res.jsonl"
expect_status 0 "integer ids, a string of digits and an index run"
ids=$(sed 's/,"text".*//' "$T/res.jsonl" | LC_ALL=C sort | tr '\n' ' ')
if [ "$ids" = '{"id":"7" {"id":-3 {"id":1 {"id":5 ' ]; then pass "5 prints as 5, -3 as -3, \"7\" as \"7\", the index as 1"
else fail "ids written: $ids"; fi
run decode -m "$M" -t 2 -f "$T/intid.jsonl" -n 1 --resume "$T/res.jsonl"
expect_status 0 "resumed when all are done"
if [ "$(wc -l <"$T/res.jsonl")" -eq 4 ]; then pass "resumed: every id read back as done, nothing run twice"
else fail "resumed: $(wc -l <"$T/res.jsonl") lines"; fi
# A results file from before, where 5 came back as "5", reads the same.
printf '{"id":"5","text":"x"}\n{"id":1,"text":"y"}\n' >"$T/res.jsonl"
run decode -m "$M" -t 2 -f "$T/intid.jsonl" -n 1 --resume "$T/res.jsonl"
expect_status 0 "resumed from an older results file"
ids=$(sed 's/,"text".*//' "$T/res.jsonl" | LC_ALL=C sort | tr '\n' ' ')
if [ "$ids" = '{"id":"5" {"id":"7" {"id":-3 {"id":1 ' ]; then pass "\"5\" of an older run is 5: only -3 and \"7\" run"
else fail "ids written: $ids"; fi
# -p with --json: the one request is known by its index.
run decode -m "$M" -t 2 -p "Hi" -n 1 --json
expect_out_has '{"id":0,' "a prompt without an id prints its index"

# The other bad ids and lines, each named with its line; the line before
# it answered.
bad_line() { # LINE WANT WHAT
    printf '{"id":"ok","prompt":"a"}\n%s\n' "$1" >"$T/badl.jsonl"
    run decode -m "$M" -t 2 -f "$T/badl.jsonl" -n 1
    expect_status 1 "$3 fails the job"
    expect_err_has "badl.jsonl:2: $2" "$3: named with the line"
    expect_out_has '{"id":"ok",' "$3: the line before it is answered"
}
bad_line '{"id":"","prompt":"b"}' '"id" is empty: leave it out to use the line'"'"'s index' "an empty id"
bad_line '{"id":9223372036854775808,"prompt":"b"}' \
    '"id" is an integer out of range [-9223372036854775808, 9223372036854775807]: write a bigger one as a string' \
    "an id past int64"
bad_line '{"id":"two","prompt":"b","messages":[{"role":"user","content":"c"}]}' \
    'both "prompt" and "messages": give one' "a line with \"prompt\" and \"messages\""
bad_line '{"id":"m","prompt":"b","max_tokens":-1}' '"max_tokens" must be an integer in [0, 16777216]' \
    "max_tokens out of range (written whole)"
bad_line '{"id":"s","prompt":"b","seed":-1}' '"seed" must be an integer in [0, 9223372036854775807]' \
    "seed out of range (written whole)"

# A byte order mark opening the file (Windows editors write one): a JSON
# Lines file is still one, a plain-text prompt does not start with U+FEFF.
printf '\357\273\277{"id":"a","prompt":"Hi"}\n{"id":"b","prompt":"Yo"}\n' >"$T/bom.jsonl"
run decode -m "$M" -t 2 -f "$T/bom.jsonl" -n 1
expect_status 0 "a JSON Lines file with a byte order mark runs"
expect_out_has '{"id":"a",' "its first line is a request"
expect_out_has '{"id":"b",' "its second line is a request"
run_sh "cat '$T/bom.jsonl' | decode -m '$M' -t 2 -f - -n 1"
expect_out_has '{"id":"b",' "the same on a pipe"
printf '\357\273\277Once upon a time' >"$T/bom.txt"
printf 'Once upon a time' >"$T/nobom.txt"
run prefill -m "$M" --tokenize -f "$T/nobom.txt"
cp "$OUT" "$T/nobom.ids"
run prefill -m "$M" --tokenize -f "$T/bom.txt"
expect_status 0 "a plain-text prompt with a byte order mark"
expect_out_file "$T/nobom.ids" "it has the tokens of the text without the mark"

done_testing
