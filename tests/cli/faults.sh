# Faults, part 1: bad command lines and bad inputs for every program.
#
# The convention checked here, for kvdump, kvcalc, quantize, prefill, decode:
#   usage error  -> exit 2, stderr exactly two lines: "prog: what is wrong"
#                   and "Try 'prog --help' for more information."
#   runtime error (empty file, directory, missing file) -> exit 1, stderr
#                   exactly one line "prog: ..."
#   never a crash: no exit status of 128 or more.
# Output faults, kills, truncated pipes and memory limits: faults_io.sh.
. "$KVP_TESTS/cli/lib.sh"
. "$KVP_TESTS/cli/faults.lib"

mkdir "$T/dir"
: >"$T/empty"
: >"$T/empty.gguf"
printf 'G' >"$T/one.gguf"
"$KVP_UNIT_DIR/test_stream" --write-sample "$T/s.kvp" || { status=1; fail "could not write the sample stream"; }
head -c 7 "$T/s.kvp" >"$T/seven.kvp"
"$KVP_UNIT_DIR/test_convert" --write-gguf "$T/tiny.gguf" || { status=1; fail "could not write the tiny GGUF"; }

# ---- kvdump ----
usage_case kvdump "unknown option" "unknown option '--bogus'" kvdump --bogus
usage_case kvdump "unknown short option" "unknown option '-q'" kvdump -q "$T/s.kvp"
usage_case kvdump "an unknown option in a cluster" "unknown option '-q'" kvdump --json -cq "$T/s.kvp"
usage_case kvdump "an unknown abbreviation" "unknown option '--bog'" kvdump --bog=1 "$T/s.kvp"
# a prefix of two options is ambiguous, not unknown (getopt says '?' for both)
usage_case decode "an ambiguous abbreviation" "option '--top' is ambiguous: --top-k, --top-p" decode -m x.gguf --top 5 -p hi
usage_case kvcalc "an ambiguous abbreviation with a value" "option '--he' is ambiguous: --help, --heads, --head-dim" kvcalc --he=3
usage_case kvdump "--extract without its value" "option '--extract' needs a value" kvdump --extract
usage_case kvdump "-x without its value" "option '-x' needs a value" kvdump -x
usage_case kvdump "--check=3" "option '--check' takes no value" kvdump --check=3 "$T/s.kvp"
usage_case kvdump "--check with --summary" "exclusive" kvdump --check --summary "$T/s.kvp"
usage_case kvdump "--check with --extract" "exclusive" kvdump -c -x t "$T/s.kvp"
usage_case kvdump "two inputs" "one input" kvdump "$T/s.kvp" "$T/s.kvp"
usage_case kvdump "an empty INPUT name" "INPUT: an empty file name" kvdump ''
usage_case kvdump "an empty INPUT name with --check" "INPUT: an empty file name" kvdump --check ''
runtime_case kvdump "no arguments, empty stdin" "empty input" kvdump
runtime_case kvdump "an empty file" "empty input" kvdump "$T/empty"
runtime_case kvdump "a directory" "is a directory" kvdump "$T/dir"
runtime_case kvdump "a missing file" "No such file" kvdump "$T/missing.kvp"
LAST_CMD="kvdump < DIR"
kvdump <"$T/dir" >"$OUT" 2>"$ERR"
status=$?
_why=$(check_err_lines kvdump 1 "<stdin>: is a directory")
if [ "$status" -eq 1 ] && [ -z "$_why" ]; then pass "kvdump: a directory on stdin: runtime error"; else
    fail "kvdump: a directory on stdin ${_why:-(wanted exit 1)}"; fi
runtime_case kvdump "a GGUF file" "not a KVP stream" kvdump "$T/tiny.gguf"

# ---- kvcalc ----
usage_case kvcalc "no arguments" "give --model" kvcalc
usage_case kvcalc "unknown option" "unknown option '--frobnicate'" kvcalc -m llama-3-8b --frobnicate
usage_case kvcalc "-m without its value" "option '-m' needs a value" kvcalc -m
usage_case kvcalc "-m - with --lengths -" "both read standard input" kvcalc -m - --lengths - -g h200
usage_case kvcalc "-m - with --check -" "both read standard input" kvcalc -m - --check -
usage_case kvcalc "--model without its value" "option '--model' needs a value" kvcalc --model
usage_case kvcalc "--json=1" "takes no value" kvcalc -m llama-3-8b --json=1
usage_case kvcalc "--check ''" "--check: an empty file name" kvcalc --check ''
usage_case kvcalc "--json with --tsv" "choose one" kvcalc -m llama-3-8b --json --tsv
usage_case kvcalc "--block-size 0" "--block-size" kvcalc -m llama-3-8b --block-size 0
usage_case kvcalc "--block-size 24 (not a power of two)" "--block-size" kvcalc -m llama-3-8b --block-size 24
usage_case kvcalc "negative --block-size" "--block-size" kvcalc -m llama-3-8b --block-size -16
usage_case kvcalc "--tp 0" "--tp" kvcalc -m llama-3-8b --tp 0
usage_case kvcalc "negative --batch" "--batch" kvcalc -m llama-3-8b --batch -1
usage_case kvcalc "--seq-len 0" "--seq-len" kvcalc -m llama-3-8b --seq-len 0
usage_case kvcalc "negative --gpu-mem" "--gpu-mem" kvcalc -m llama-3-8b --gpu-mem -5G
usage_case kvcalc "an overflowing size" "--gpu-mem" kvcalc -m llama-3-8b --gpu-mem 99999999999999999999999T
usage_case kvcalc "--gpu-util 2" "--gpu-util" kvcalc -m llama-3-8b --gpu h100 --gpu-util 2
usage_case kvcalc "a sweep too large" "points" kvcalc -m llama-3-8b --seq-len 1:1000000000:1
usage_case kvcalc "an extra argument" "unexpected argument" kvcalc -m llama-3-8b extra
usage_case kvcalc "an unknown preset" "neither a preset" kvcalc -m no-such-model
runtime_case kvcalc "an empty model file" "empty.gguf" kvcalc -m "$T/empty.gguf"
runtime_case kvcalc "a folder without config.json" "config.json" kvcalc -m "$T/dir"
runtime_case kvcalc "a missing model file" "No such file" kvcalc -m "$T/missing.gguf"
runtime_case kvcalc "an empty --lengths file" "no lengths" kvcalc -m llama-3-8b --gpu h100 --lengths "$T/empty"
runtime_case kvcalc "a directory as --lengths" "is a directory" kvcalc -m llama-3-8b --gpu h100 --lengths "$T/dir"

# ---- quantize ----
usage_case quantize "no arguments" "no INPUT" quantize
usage_case quantize "unknown option" "unknown option '--bogus'" quantize --bogus
usage_case quantize "-o without its value" "option '-o' needs a value" quantize "$T/tiny.gguf" -o
usage_case quantize "--to without its value" "option '--to' needs a value" quantize "$T/tiny.gguf" --to
usage_case quantize "--threads 0" "--threads" quantize --threads 0 "$T/tiny.gguf" -o "$T/u.kvp"
usage_case quantize "negative --threads" "--threads" quantize --threads -2 "$T/tiny.gguf" -o "$T/u.kvp"
usage_case quantize "--group 0" "--group" quantize --to int4 --group 0 "$T/tiny.gguf" -o "$T/u.kvp"
usage_case quantize "negative --group" "--group" quantize --to int4 --group -4 "$T/tiny.gguf" -o "$T/u.kvp"
usage_case quantize "--zstd=0" "--zstd" quantize --zstd=0 "$T/tiny.gguf" -o "$T/u.kvp"
usage_case quantize "--zstd=20" "--zstd" quantize --zstd=20 "$T/tiny.gguf" -o "$T/u.kvp"
usage_case quantize "--kv with --to" "--kv converts KV blocks only" quantize --kv fp8 --to int8 "$T/s.kvp"
usage_case quantize "--kv keep" "--kv: KV blocks convert to f32, f16, bf16, fp8 or int8 (not keep)" \
    quantize --kv keep -o "$T/x.kvp" "$T/s.kvp"
usage_case quantize "an unknown type" "unknown type" quantize --to int3 "$T/tiny.gguf" -o "$T/u.kvp"
usage_case quantize "no output" "no output" quantize --to int8 "$T/tiny.gguf"
usage_case quantize "-o - with --report -" "both write" quantize "$T/tiny.gguf" -o - --report -
# a GGUF may come on standard input ("-"); a KVP model, read twice, may not
LAST_CMD="quantize --to int8 --drop weird - -o u.kvp < tiny.gguf"
quantize --to int8 --drop weird - -o "$T/u.kvp" <"$T/tiny.gguf" >"$OUT" 2>"$ERR"
status=$?
if [ "$status" -eq 0 ] && [ -s "$T/u.kvp" ]; then pass "quantize: a GGUF on standard input (-)"; else
    fail "quantize: a GGUF on standard input (-): exit $status, $(cat "$ERR")"; fi
# a KVP model cut short on standard input: named once, as <stdin>
head -c $(($(wc -c <"$T/u.kvp") / 2)) "$T/u.kvp" >"$T/ucut.kvp"
run_sh "decode -m - -p a < '$T/ucut.kvp'"
expect_status 1 "a KVP model cut short on standard input"
expect_err_has "decode: <stdin>: record " "names standard input once"
expect_err_lacks "-: <stdin>" "not as '-' and '<stdin>' both"
rm -f "$T/u.kvp"
LAST_CMD="quantize --to int8 - -o u.kvp < s.kvp"
quantize --to int8 - -o "$T/u.kvp" <"$T/s.kvp" >"$OUT" 2>"$ERR"
status=$?
_why=$(check_err_lines quantize 1 "-: not a regular file: a KVP model is read twice")
if [ "$status" -eq 1 ] && [ -z "$_why" ] && [ ! -e "$T/u.kvp" ]; then pass "quantize: a KVP stream on standard input: refused"
else fail "quantize: a KVP stream on standard input ${_why:-(wanted exit 1)}"; fi
usage_case quantize "two inputs" "one input" quantize "$T/tiny.gguf" "$T/tiny.gguf" -o "$T/u.kvp"
usage_case quantize "an empty INPUT name" "INPUT: an empty file name" quantize --to f16 '' -o "$T/u.kvp"
usage_case quantize "an empty INPUT name with --kv" "INPUT: an empty file name" quantize --kv fp8 '' -o "$T/u.kvp"
usage_case quantize "an empty --eval name" "--eval: an empty file name" quantize --to f16 "$T/tiny.gguf" -o "$T/u.kvp" --eval ''
# an empty or 1-byte file is named as no model, not as a safetensors file
# whose header length is cut short (the reader a file of neither magic meets)
runtime_case quantize "an empty GGUF" "$T/empty.gguf: the file is empty, not a model (GGUF, KVP or safetensors)" \
    quantize --to int8 "$T/empty.gguf" -o "$T/u.kvp"
runtime_case quantize "a 1-byte model" "$T/one.gguf: 1 byte, too short to be a model (GGUF, KVP or safetensors)" \
    quantize --to int8 "$T/one.gguf" -o "$T/u.kvp"
runtime_case quantize "a folder without a model" "dir" quantize --to int8 "$T/dir" -o "$T/u.kvp"
runtime_case quantize "a missing input" "missing.gguf" quantize --to int8 "$T/missing.gguf" -o "$T/u.kvp"
runtime_case quantize "a directory as -o" "is a directory" quantize --to f32 --drop weird "$T/tiny.gguf" -o "$T/dir"
runtime_case quantize "a directory as -o with --force" "is a directory" quantize -f --to f32 --drop weird "$T/tiny.gguf" -o "$T/dir"
runtime_case quantize "a directory as --report" "dir" quantize --to f32 --drop weird "$T/tiny.gguf" -o "$T/r.kvp" --report "$T/dir"
expect_true "a failed --report leaves no model" test ! -e "$T/r.kvp"
runtime_case quantize "--kv on an empty file" "empty input" quantize --kv fp8 "$T/empty" -o "$T/u.kvp"
runtime_case quantize "--kv on a directory" "is a directory" quantize --kv fp8 "$T/dir" -o "$T/u.kvp"
runtime_case quantize "--kv with no input: empty stdin" "empty input" quantize --kv fp8 -o "$T/u.kvp"
expect_true "no output after any of the errors" test ! -e "$T/u.kvp"
left=$(ls "$T" | grep -c '\.tmp\.')
if [ "$left" -eq 0 ]; then pass "no temporary file left by the errors"; else fail "temporary files left: $(ls "$T" | grep '\.tmp\.')"; fi

# ---- prefill and decode: usage is checked before the model is read ----
for p in prefill decode; do
    usage_case $p "no arguments" "no model" $p
    usage_case $p "unknown option" "unknown option" $p --bogus
    usage_case $p "-m without its value" "" $p -m
    usage_case $p "-p with -f" "give one of" $p -m "$T/x.gguf" -p a -f "$T/p.txt"
    usage_case $p "--threads 0" "--threads" $p -m "$T/x.gguf" -p a --threads 0
    usage_case $p "--block-size 0" "--block-size" $p -m "$T/x.gguf" -p a --block-size 0
    usage_case $p "--top-p 2" "--top-p" $p -m "$T/x.gguf" -p a --top-p 2
    usage_case $p "negative --top-p" "--top-p" $p -m "$T/x.gguf" -p a --top-p -0.5
    usage_case $p "negative --temperature" "--temperature" $p -m "$T/x.gguf" -p a --temperature -1
    usage_case $p "negative --kv-mem" "--kv-mem" $p -m "$T/x.gguf" -p a --kv-mem -1G
    usage_case $p "--kv-blocks 0" "--kv-blocks" $p -m "$T/x.gguf" -p a --kv-blocks 0
    usage_case $p "negative --max-tokens" "--max-tokens" $p -m "$T/x.gguf" -p a -n -1
    usage_case $p "--chunk 0" "--chunk" $p -m "$T/x.gguf" -p a --chunk 0
    usage_case $p "--kv-dtype q4_0" "--kv-dtype" $p -m "$T/x.gguf" -p a --kv-dtype q4_0
    # issue 6: a block size that is not a power of two is a usage error (kvcalc's rule)
    run $p -m "$T/missing.gguf" -p a --block-size 24
    expect_true "$p --block-size 24 (not a power of two) is a usage error" test "$status" -eq 2
    expect_err_has "--block-size: 24 is not a power of two" "$p names the bad block size"
    runtime_case $p "an empty model file" "$T/empty.gguf: the file is empty, not a model (GGUF, KVP or safetensors)" \
        $p -m "$T/empty.gguf" -p a
    runtime_case $p "a 1-byte model file" "$T/one.gguf: 1 byte, too short to be a model (GGUF, KVP or safetensors)" \
        $p -m "$T/one.gguf" -p a
    runtime_case $p "a 7-byte model file" "$T/seven.kvp: 7 bytes, too short to be a model" $p -m "$T/seven.kvp" -p a
    runtime_case $p "a directory as the model" "dir" $p -m "$T/dir" -p a
    runtime_case $p "a missing model" "missing.gguf" $p -m "$T/missing.gguf" -p a
    printf '{"id":"a","prompt":"hi"}\n' >"$T/prompts-as-model.jsonl"
    runtime_case $p "a prompts file as the model" "not a model file: neither GGUF, KVP nor safetensors" \
        $p -m "$T/prompts-as-model.jsonl" -p a
    runtime_case $p "a KVP stream as the model" "s.kvp" $p -m "$T/s.kvp" -p a
done
usage_case prefill "an extra argument" "unexpected argument" prefill -m "$T/x.gguf" -p a extra
usage_case prefill "--json without --stats" "--json gives --stats' lines" prefill -m "$T/x.gguf" -p a --json -o o.kvp
usage_case prefill "--perplexity with --tokenize" "--perplexity scores a text file: not with --tokenize" \
    prefill -m "$T/x.gguf" --perplexity t.txt --tokenize
usage_case prefill "--perplexity with --resume" "--perplexity scores a text file: not with --resume" \
    prefill -m "$T/x.gguf" --perplexity t.txt --resume r.kvp
usage_case prefill "--resume with --system" "whose system turn came with its first turn" \
    prefill -m "$T/x.gguf" --resume r.kvp --chat --system s -p q -o o.kvp
usage_case decode "two KV streams" "more than one" decode -m "$T/x.gguf" a.kvp b.kvp
usage_case decode "a KV stream with prompts" "at once" decode -m "$T/x.gguf" -p a "$T/s.kvp"
# options that render prompts have none to render in a KV stream (they were
# ignored: exit 0 as if given)
for p in decode specdec; do
    for opt in --chat "--system=Be terse." --no-special; do
        usage_case $p "$opt with a KV stream" "${opt%%=*} renders prompts, and a KV stream's were rendered by prefill" \
            $p -m "$T/x.gguf" "$opt" "$T/s.kvp"
    done
done
# getopt takes "--stats FILE" as --stats and an operand: the error says so
usage_case decode "--stats FILE with prompts" \
    "at once ('$T/st.json' follows --stats, whose value is given as --stats=VALUE)" \
    decode -m "$T/x.gguf" -p a --stats "$T/st.json"
usage_case decode "--stats FILE after a KV stream" "more than one KV stream ('$T/st.json' follows --stats" \
    decode -m "$T/x.gguf" "$T/s.kvp" --stats "$T/st.json"
# ... and as the one operand, the KV stream (`prefill | decode --stats FILE`):
# it was opened as the stream ("No such file", or "not a KVP stream")
for p in decode specdec; do
    usage_case $p "--stats FILE as the KV stream" \
        "'$T/st.json' is taken for the KV stream ('$T/st.json' follows --stats, whose value is given as --stats=VALUE)" \
        $p -m "$T/x.gguf" -n 4 --stats "$T/st.json"
    usage_case $p "--progress FILE as the KV stream" "'$T/p.kvp' is taken for the KV stream ('$T/p.kvp' follows --progress" \
        $p -m "$T/x.gguf" -n 4 --progress "$T/p.kvp"
done
echo '{"requests":1}' >"$T/st-old.json"
usage_case decode "--stats FILE, an old statistics file, as the KV stream" \
    "'$T/st-old.json' is taken for the KV stream" decode -m "$T/x.gguf" --stats "$T/st-old.json"
run decode -m "$T/x.gguf" "$T/s.kvp" --stats
expect_status 1 "a KV stream before --stats is the stream (the model is missing: exit 1)"
expect_err_lacks "follows" "decode: no hint for a stream before --stats"
usage_case prefill "--stats FILE" "unexpected argument '$T/st.json' ('$T/st.json' follows --stats" \
    prefill -m "$T/x.gguf" -p a --stats "$T/st.json"
usage_case quantize "--zstd LEVEL" "one input at a time (got 2) ('19' follows --zstd" \
    quantize --zstd 19 "$T/tiny.gguf" -o "$T/u.kvp"
# --eval reads INPUT and the text twice (a run with each model): a pipe for
# either is refused before the conversion (it failed after it, the second
# read finding the pipe empty)
printf 'a b c d\n' >"$T/ev.txt"
usage_case quantize "--eval - from a pipe" "--eval - is read twice (scored by the input and by the output model)" \
    quantize --to q8_0 "$T/tiny.gguf" -o "$T/ev.kvp" --eval -
run_sh "cat '$T/tiny.gguf' | quantize --to q8_0 - -o '$T/ev.kvp' --eval '$T/ev.txt'"
expect_status 2 "--eval with INPUT from a pipe: a usage error"
expect_err_has "--eval reads INPUT - again to score the text with it: give a file, not a pipe" "says why"
run_sh "quantize --to q8_0 - -o '$T/ev.kvp' --eval - < '$T/tiny.gguf'"
expect_status 2 "INPUT - and --eval -: a usage error"
expect_err_has "INPUT - and --eval - both read standard input" "says why"
run_sh "quantize --to q8_0 - -o '$T/ev.kvp' --eval /dev/stdin < '$T/tiny.gguf'"
expect_status 2 "INPUT - and --eval /dev/stdin: a usage error too (standard input by another name)"
expect_err_has "INPUT - and --eval /dev/stdin both read standard input" "naming both"
expect_true "nothing written" test ! -e "$T/ev.kvp"
# srun's tasks of a job step, like mpirun's ranks, each run the whole job
# without --tp/--pp: refused, said by task 0 alone; a batch script's own
# commands (no step) run as one process
usage_case decode "2 srun tasks without --tp or --pp" "started as one of 2 ranks (srun -n 2), but without --tp or --pp" \
    env SLURM_STEP_ID=0 SLURM_NTASKS=2 SLURM_PROCID=0 decode -m "$T/x.gguf" -p hi
run env SLURM_STEP_ID=0 SLURM_NTASKS=2 SLURM_PROCID=1 decode -m "$T/x.gguf" -p hi
expect_status 2 "srun task 1 of 2 without --tp or --pp: a usage error too"
expect_err_empty "said by task 0 alone"
run env SLURM_NTASKS=2 SLURM_PROCID=0 decode -m "$T/x.gguf" -p hi
expect_err_lacks "started as one of" "a batch script's command (a job's task count, no step) is one process"
usage_case quantize "-z LEVEL" "one input at a time (got 2) ('19' follows -z, whose value is given as -zVALUE or --zstd=VALUE)" \
    quantize -z 19 "$T/tiny.gguf" -o "$T/u.kvp"
usage_case decode "an operand not after --stats" "at once" decode -m "$T/x.gguf" --stats -p a b.kvp
expect_err_lacks "follows" "decode: no hint for an operand that did not follow --stats"
usage_case decode "an empty model name" "-m: an empty file name" decode -m '' -p a
usage_case prefill "an empty model name" "-m: an empty file name" prefill -m '' -p a
usage_case decode "an empty prompts file name" "-f: an empty file name" decode -m "$T/x.gguf" -f ''
usage_case specdec "an empty model name" "-m: an empty file name" specdec -m '' -p a
usage_case specdec "an empty draft model name" "--draft: an empty file name" specdec -m "$T/x.gguf" --method draft --draft '' -p a
usage_case specdec "an empty heads file name" "--heads: an empty file name" specdec -m "$T/x.gguf" --method heads --heads '' -p a
# an empty output name is refused before any work (before the model loads:
# x.gguf here is not even read)
usage_case prefill "an empty -o name" "-o: an empty file name" prefill -m "$T/x.gguf" -p a -o ''
usage_case decode "an empty --kv-out name" "--kv-out: an empty file name" decode -m "$T/x.gguf" -p a --kv-out ''
usage_case decode "--system without --chat" "give --chat too" decode -m "$T/x.gguf" -p a --system "Be brief."
usage_case prefill "--system without --chat" "give --chat too" prefill -m "$T/x.gguf" -p a --system "Be brief."
printf '{"id":"a","prompt":"hi"}\n' >"$T/th.jsonl"
usage_case specdec "an empty heads output name" "-o: an empty file name" specdec -m "$T/x.gguf" --train-heads "$T/th.jsonl" -o ''
usage_case specdec "heads written over their prompts" "is the prompts file" \
    specdec -m "$T/x.gguf" --train-heads "$T/th.jsonl" -o "$T/th.jsonl"
usage_case specdec "--profile with --stats" "--stats" specdec -m "$T/x.gguf" --profile "$T/th.jsonl" --stats="$T/pf.json"
# two outputs in one file, existing or not yet
usage_case decode "--stats into the --resume results" "is the --resume results file" \
    decode -m "$T/x.gguf" -f "$T/th.jsonl" --resume "$T/res.jsonl" --stats="$T/res.jsonl"
usage_case decode "--stats into the --kv-out stream" "is the --kv-out stream" \
    decode -m "$T/x.gguf" -f "$T/th.jsonl" --kv-out "$T/ko.kvp" --stats="$T/./ko.kvp"

M="$KVP_MODEL"
if [ ! -f "$M" ]; then
    echo "note: $M absent (scripts/fetch-model): prefill/decode input errors on the model skipped"
    done_testing
    exit $?
fi
long=$(awk 'BEGIN { for (i = 0; i < 9000; i++) printf "word "; }')
for p in prefill decode; do
    want="(8192: the model's trained context)"
    [ $p = decode ] || want="more than the model's context of 8192"
    runtime_case $p "a prompt past the model's context" "$want" $p -m "$M" -t 2 -p "$long"
    # no prompt is no request: a batch job with nothing to do (batch.sh)
    run $p -m "$M" -t 2 -f "$T/empty" </dev/null
    expect_status 0 "$p: an empty prompts file: no request, exit 0"
    expect_err_has "$p: note: $T/empty: no prompt in the file" "$p: an empty prompts file: a note says so"
    runtime_case $p "a directory as the prompts file" "is a directory" $p -m "$M" -t 2 -f "$T/dir"
    runtime_case $p "a missing prompts file" "missing.jsonl" $p -m "$M" -t 2 -f "$T/missing.jsonl"
    # the command line's own prompt is checked before the model loads: a
    # usage error (only an id past the vocabulary needs the model)
    usage_case $p "an empty prompt" "empty" $p -m "$M" -t 2 -p ""
    usage_case $p "an empty --tokens" "item 1" $p -m "$M" -t 2 --tokens ""
    runtime_case $p "KV memory too small for a block" "holds no block" $p -m "$M" -t 2 -p hi --kv-mem 1K
    runtime_case $p "a token id past the vocabulary" "--tokens" $p -m "$M" -t 2 --tokens 99999999
    runtime_case $p "a token id past 2^64" "item 1" $p -m "$M" -t 2 --tokens 99999999999999999999999
    usage_case $p "an empty --tokens item" "item 2" $p -m "$M" -t 2 --tokens 1,,2
    usage_case $p "a trailing comma in --tokens" "item 3" $p -m "$M" -t 2 --tokens "1, 2,"
    usage_case $p "a signed --tokens item" "item 1" $p -m "$M" -t 2 --tokens +5
    usage_case $p "two ids without a comma" "item 1" $p -m "$M" -t 2 --tokens "1 2"
done
# --system on a file's plain prompts: an error naming the line, not a
# system message silently left out
printf '{"id":"a","messages":[{"role":"user","content":"hi"}]}\n{"id":"b","prompt":"hi"}\n' >"$T/sys.jsonl"
printf 'Say hi.\n' >"$T/sys.txt"
for p in decode prefill; do
    runtime_case $p "--system with a \"prompt\" line" "$T/sys.jsonl:2: a \"prompt\" string has no system turn" \
        $p -m "$M" -t 2 -n 1 -f "$T/sys.jsonl" --system "Be brief."
    runtime_case $p "--system with a plain-text file" "$T/sys.txt: a plain-text prompt has no system turn" \
        $p -m "$M" -t 2 -n 1 -f "$T/sys.txt" --system "Be brief."
done
run decode -m "$M" -t 2 -n 1 -f "$T/sys.txt" --system "Be brief." --chat
expect_status 0 "decode: --system with --chat on a plain-text file"
# binary output onto a terminal (script(1) gives the program one): refused
if script -qec true /dev/null >/dev/null 2>&1; then
    on_tty() { # NAME WANT CMD...: exit 2 and WANT in what the terminal showed
        _n=$1 _w=$2
        shift 2
        script -qec "$*" /dev/null >"$OUT" 2>&1
        _s=$?
        if [ "$_s" -eq 2 ] && grep -qF -- "$_w" "$OUT"; then pass "$_n: refused onto a terminal"; else
            fail "$_n onto a terminal: exit $_s, $(head -c 300 "$OUT")"; fi
    }
    on_tty prefill "the KV stream is binary" prefill -m "$M" -t 2 -p hi
    on_tty quantize "the output is binary" quantize "$T/tiny.gguf" --to int8 -o -
    on_tty kvdump "writes binary data" kvdump -x token_embd.weight "$T/tiny.gguf"
    script -qec "prefill -m $M -t 2 --tokenize -p hi" /dev/null >"$OUT" 2>&1
    expect_status 0 "prefill --tokenize onto a terminal (text)"
else
    echo "skip: no script(1) (bsdutils): binary output onto a terminal not checked"
fi
runtime_case prefill "a directory as -o" "is a directory" prefill -m "$M" -t 2 -p hi -o "$T/dir"
runtime_case decode "a directory as --kv-out" "is a directory" decode -m "$M" -t 2 -p hi -n 1 --kv-out "$T/dir"
runtime_case decode "an empty KV stream" "empty input" decode -m "$M" -t 2 "$T/empty"
runtime_case decode "a directory as the KV stream" "is a directory" decode -m "$M" -t 2 "$T/dir"
runtime_case decode "no KV stream: empty stdin" "empty input" decode -m "$M" -t 2
runtime_case decode "another model's KV stream" "another model" decode -m "$M" -t 2 "$T/s.kvp"
runtime_case decode "a GGUF as the KV stream" "not a KVP stream" decode -m "$M" -t 2 "$T/tiny.gguf"
left=$(ls "$T" "$T/dir" | grep -c '\.tmp\.')
if [ "$left" -eq 0 ]; then pass "no temporary file left by prefill/decode errors"; else fail "temporary files left"; fi

done_testing
