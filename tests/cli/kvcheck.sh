# kvcheck.sh - kvcalc --check: kvcalc's model of the KV pool beside what
# decode --stats=FILE measured.  The real-model part runs decode under
# several pool sizings and checks each run; doctored and broken stats files
# must be refused with the field or the file named.
. "$KVP_TESTS/cli/lib.sh"

# ---- without the model: a preset and hand-made stats ----
# SmolLM2-135M: 30 layers x 16 tokens x 2 x 3 KV heads x 64 x 2 B = 368,640 B
# a block; a 2 MiB pool holds 5 of them.
cat >"$T/s.json" <<'EOF'
{"requests":10,"kv_memory":0,"output_tokens":240,"prompt_tokens":150,"preemptions":4,"peak_kv_blocks":5,
 "kv_blocks":5,"block_size":16,"max_num_seqs":64,"static":false,"model":"",
 "model_fingerprint":"1d9ba74afb3032449c2bb4394c0ac691","input":"prompts","kv_dtype":"f16",
 "kv_block_bytes":368640,"kv_pool_bytes":1843200,"kv_pool_sized_by":"kv-mem","kv_mem":2097152,
 "kv_out":false,"stopped":false,"peak_running":3,"mean_prompt_tokens":15.00,"mean_output_tokens":24.00,
 "max_seq_len":41}
EOF
run kvcalc --check "$T/s.json" -m smollm2-135m
expect_status 0 "a preset's pool agrees with hand-made stats"
expect_out_has "verdict: agree" "the verdict line says so"
expect_out_has "30 x 12,288 B = 368,640 B" "one block holds all 30 layers of 12,288 B"
expect_out_has "not checked: a preset has no fingerprint" "a preset's fingerprint is not checked"
expect_err_empty "nothing on stderr when they agree"
run kvcalc --check "$T/s.json" -m smollm2-135m --json
expect_status 0 "--json"
expect_out_has '"agree":true' "--json: agree"
expect_out_has '{"quantity":"kv_blocks","field":"kv_blocks","kvcalc":5,"decode":5,"ratio":1,"rule":"equal","ok":true}' \
    "--json: the kv_blocks row"
expect_out_has '{"quantity":"seqs of 40 tok (longest)","field":"peak_running","kvcalc":1,"decode":3,"ratio":3,"rule":"reported"' \
    "--json: the longest request (41 tokens, its KV 40): 1 fits, 3 ran"
run kvcalc --check "$T/s.json"
expect_status 1 "stats naming no model, and no -m: exit 1 naming the file and field"
expect_err_has "$T/s.json: model: empty" "names the file and the field"
expect_err_one_line "in one line"
expect_err_has "give -m MODEL" "says to give the model"

# the command line wins over the run's options, and then they differ
run kvcalc --check "$T/s.json" -m smollm2-135m --kv-dtype f32
expect_status 1 "--kv-dtype f32 against an f16 run"
expect_err_has "kv_block_bytes (kvcalc 737280, decode 368640)" "names kv_block_bytes with both values"
expect_err_one_line "one line on stderr"
expect_out_has "verdict: DISAGREE on kv_block_bytes, kv_blocks, kv_pool_bytes" "the verdict names the fields"
run kvcalc --check "$T/s.json" -m smollm2-135m --kv-mem 4MiB
expect_status 1 "--kv-mem 4MiB predicts 11 blocks, not the run's 5"
expect_err_has "kv_blocks (kvcalc 11, decode 5)" "names kv_blocks"
run kvcalc --check "$T/s.json" -m smollm2-135m --kv-heads 1
expect_status 1 "a wrong model shape (1 KV head) disagrees"
run kvcalc --check "$T/s.json" -m smollm2-135m --kv-heads 8
expect_status 2 "a shape the loader refuses (9 heads over 8 KV heads) is a usage error"
expect_err_has "config: 9 heads are not a multiple of 8 KV heads" "in the loader's words"

# a --tp/--pp run: the stats hold rank 0's pool, and say the split.
# tp 3: 30 layers x 16 x 2 x 1 KV head x 64 x 2 B = 122,880 B a block, 17 in 2 MiB
split_stats() { # TP PP BLOCK-BYTES BLOCKS: s.json as that run's rank 0 wrote it
    sed -e "s/\"max_seq_len\":41}/\"max_seq_len\":41,\"tp\":$1,\"pp\":$2}/" \
        -e "s/\"kv_block_bytes\":368640/\"kv_block_bytes\":$3/" -e "s/\"kv_blocks\":5,/\"kv_blocks\":$4,/" \
        -e "s/\"kv_pool_bytes\":1843200/\"kv_pool_bytes\":$(($3 * $4))/" "$T/s.json" >"$T/split.json"
}
split_stats 3 1 122880 17
run kvcalc --check "$T/split.json" -m smollm2-135m
expect_status 0 "a tp 3 run's stats agree, checked per rank"
expect_out_has "tp 3 x pp 1: the pool is rank 0's, 30 of 30 layers and 1 of 3 KV heads" "says whose pool it is"
expect_out_has "30 x 4,096 B = 122,880 B" "rank 0's block"
run kvcalc --check "$T/split.json" -m smollm2-135m --json
expect_out_has '"tp":3,"pp":1,"n_layer":30,"n_head_kv":1,' "--json: the split and rank 0's share"
# pp 4 over 30 layers: stage 0 holds 8 (decode's split: the earlier stages one more)
split_stats 1 4 98304 21
run kvcalc --check "$T/split.json" -m smollm2-135m
expect_status 0 "a pp 4 run's stats agree: stage 0's 8 layers"
split_stats 3 1 368640 5
run kvcalc --check "$T/split.json" -m smollm2-135m
expect_status 1 "a whole-model pool labelled tp 3 disagrees"
split_stats 2 1 122880 17
run kvcalc --check "$T/split.json" -m smollm2-135m
expect_status 1 "tp 2 does not split 9 heads: the stats are not of this model, exit 1"
expect_err_has "$T/split.json: tp: 2: tensor parallelism over 2 ranks: 9 query heads do not split evenly" \
    "names the file, the field and why"
expect_err_one_line "in one line"
split_stats 1 31 122880 17
run kvcalc --check "$T/split.json" -m smollm2-135m
expect_status 1 "pp 31 over 30 layers: exit 1"
expect_err_has "$T/split.json: pp: 31 stages for a model of 30 layers" "names the file and the field"
split_stats 0 1 122880 17
run kvcalc --check "$T/split.json" -m smollm2-135m
expect_status 1 "tp 0: exit 1"
expect_err_has "tp: 0 is out of range" "names the field"

# doctored and broken stats: the field or the file named, exit 1
# doctored SED-EXPRESSION WHAT STDERR-TEXT: the run's stats edited, refused
doctored() {
    sed "$1" "$T/s.json" >"$T/bad.json"
    run kvcalc --check "$T/bad.json" -m smollm2-135m
    expect_status 1 "$2"
    expect_err_has "$3" "$2: names it"
}
doctored 's/"kv_block_bytes":368640/"kv_block_bytes":368000/' "wrong block bytes" "kv_block_bytes"
run kvcalc --check "$T/bad.json" -m smollm2-135m --json
expect_out_has '"agree":false,"failed":["kv_block_bytes"]' "--json lists the field that disagrees"
doctored 's/"peak_kv_blocks":5/"peak_kv_blocks":6/' "more blocks in use than the pool has" \
    "peak_kv_blocks (kvcalc at most 5, decode 6)"
doctored 's/"block_size":16/"block_size":"16"/' "a string for a number" \
    "$T/bad.json: block_size: not a non-negative integer"
doctored 's/"kv_blocks":5/"kv_blocks":99999999999999/' "a count out of range" \
    "kv_blocks: 99999999999999 is out of range"
grep -v '"kv_block_bytes"' "$T/s.json" >"$T/bad.json"
run kvcalc --check "$T/bad.json" -m smollm2-135m
expect_status 1 "a stats file without kv_block_bytes (an older decode's)"
expect_err_has "missing" "says the field is missing"
head -c 200 "$T/s.json" >"$T/cut.json"
run kvcalc --check "$T/cut.json" -m smollm2-135m
expect_status 1 "a stats file cut short"
expect_err_has "$T/cut.json:" "names the file"
expect_err_one_line "one line"
printf '\001\002garbage' >"$T/bad.json"
run kvcalc --check "$T/bad.json" -m smollm2-135m
expect_status 1 "garbage"
expect_err_has "$T/bad.json:" "names the file"
printf '[1,2]' >"$T/bad.json"
run kvcalc --check "$T/bad.json" -m smollm2-135m
expect_status 1 "JSON that is not an object"
run kvcalc --check "$T/absent.json" -m smollm2-135m
expect_status 1 "a stats file that is not there"
expect_err_has "$T/absent.json" "names it"

# usage errors
run kvcalc --check "$T/s.json" -m smollm2-135m --gpu h200
expect_status 2 "--gpu does not go with --check"
expect_err_has "--gpu does not apply" "says why"
run kvcalc --check "$T/s.json" -m smollm2-135m --tp 2
expect_status 2 "--tp does not go with --check"
run kvcalc --check "$T/s.json" -m smollm2-135m --block-size 16:64:x2
expect_status 2 "no sweeps with --check"
run kvcalc --check "$T/s.json" -m smollm2-135m --tsv
expect_status 2 "--tsv does not go with --check"
run kvcalc -m smollm2-135m --kv-mem 1GiB
expect_status 2 "--kv-mem without --check"
run kvcalc --check "$T/s.json" -m smollm2-135m --kv-dtype q9
expect_status 2 "an unknown --kv-dtype"

# ---- with the model: decode's own stats ----
need_model
: >"$T/p.jsonl"
for q in "Name a fruit." "Name a color." "Say hello." "Count to three." "Name a planet." "Name a city."; do
    printf '{"messages":[{"role":"user","content":"%s"}]}\n' "$q" >>"$T/p.jsonl"
done

# a 2 MiB pool: 5 blocks, sequences preempted
run decode -m "$M" -t "$THREADS" -f "$T/p.jsonl" -n 16 --kv-mem 2MiB --stats="$T/run.json"
expect_status 0 "decode writes its stats"
for k in '"kv_block_bytes":368640' '"kv_pool_bytes":1843200' '"kv_pool_sized_by":"kv-mem"' '"kv_mem":2097152' \
    '"kv_dtype":"f16"' '"input":"prompts"' '"peak_running":' '"max_seq_len":' '"model_fingerprint":"' \
    '"mean_prompt_tokens":' '"kv_blocks":5,"block_size":16' '"tp":1,"pp":1'; do
    if grep -qF "$k" "$T/run.json"; then pass "stats have $k"; else fail "stats lack $k: $(cat "$T/run.json")"; fi
done
run kvcalc --check "$T/run.json"
expect_status 0 "kvcalc agrees with decode's run (the model the run names)"
expect_out_has "verdict: agree" "verdict: agree"
expect_out_has ": the run's" "the model file's fingerprint is the run's"
run kvcalc -m "$M" --check "$T/run.json" --json
expect_status 0 "-m MODEL --json"
expect_out_has '"fingerprint_ok":true' "--json: the fingerprint matches"
expect_out_has '"agree":true' "--json: agree"

# 16 prompt tokens and 17 out fill exactly two blocks (the last token is
# never cached): kvcalc sizes the request so, 1 fits, as decode ran it
run decode -m "$M" -t "$THREADS" --tokens 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16 -n 17 --ignore-eos --kv-blocks 2 \
    --json --stats="$T/two.json"
expect_status 0 "16 + 17 tokens run in two blocks"
run kvcalc --check "$T/two.json" --json
expect_status 0 "kvcalc agrees on two blocks"
expect_out_has '{"quantity":"seqs of 32 tok (longest)","field":"peak_running","kvcalc":1,"decode":1' \
    "the request's KV is 32 tokens: one fits (33 said none)"

# doctored: another model's fingerprint, wrong block bytes, a model not there
sed 's/"model_fingerprint":"[0-9a-f]*"/"model_fingerprint":"00000000000000000000000000000000"/' "$T/run.json" >"$T/bad.json"
run kvcalc --check "$T/bad.json"
expect_status 1 "another model's fingerprint"
expect_err_has "model_fingerprint" "names model_fingerprint"
sed 's/"kv_block_bytes":368640/"kv_block_bytes":737280/' "$T/run.json" >"$T/bad.json"
run kvcalc --check "$T/bad.json"
expect_status 1 "doctored block bytes"
expect_err_has "kv_block_bytes (kvcalc 368640, decode 737280)" "names kv_block_bytes"
sed 's#"model":"[^"]*"#"model":"/nonexistent/m.gguf"#' "$T/run.json" >"$T/bad.json"
run kvcalc --check "$T/bad.json"
expect_status 1 "the run's model is not here"
expect_err_has "model: '/nonexistent/m.gguf' is not here" "says so"
run kvcalc --check "$T/bad.json" -m "$M"
expect_status 0 "... and -m MODEL stands in for it"

# the other sizings: --kv-blocks with f32 and blocks of 32; the context;
# a large pool where every sequence fits, so no preemption may happen
run decode -m "$M" -t "$THREADS" -f "$T/p.jsonl" -n 8 --kv-blocks 7 --block-size 32 --kv-dtype f32 \
    --stats="$T/run2.json"
expect_status 0 "decode --kv-blocks 7 --block-size 32 --kv-dtype f32"
run kvcalc --check "$T/run2.json"
expect_status 0 "kvcalc agrees: 7 blocks of 1,474,560 B"
expect_out_has "1,474,560" "f32 blocks of 32 tokens: 30 x 49,152 B"
run decode -m "$M" -t "$THREADS" -f "$T/p.jsonl" -n 8 --stats="$T/run3.json"
expect_status 0 "decode with the default pool (the model's context)"
run kvcalc --check "$T/run3.json"
expect_status 0 "kvcalc agrees: 8192 tokens of context, 512 blocks"
expect_out_has "context, 8192 tokens: 512 blocks" "the pool from the model's context"
run decode -m "$M" -t "$THREADS" -f "$T/p.jsonl" -n 16 --kv-mem 64MiB --stats="$T/run4.json"
run kvcalc --check "$T/run4.json" --json
expect_status 0 "a 64 MiB pool agrees"
expect_out_has '"field":"preemptions","kvcalc":0,"decode":0,"ratio":null,"rule":"at most","ok":true' \
    "every sequence fits at its longest: no preemption, and it is checked"

# a KV stream's run: the preemption rule does not apply
run_sh "prefill -m '$M' -t $THREADS -f '$T/p.jsonl' | decode -m '$M' -t $THREADS -n 4 --kv-mem 8MiB --stats='$T/run5.json' >/dev/null"
expect_status 0 "prefill | decode --stats"
run kvcalc --check "$T/run5.json"
expect_status 0 "kvcalc agrees with a KV stream's run"
expect_out_has "a KV stream's sequences hold blocks while they wait" "says why preemptions are not checked"
# a stream's own KV dtype (int8 here) is the run's, whatever --kv-dtype
# says: the stats name the pool's and kvcalc agrees with them
run_sh "prefill -m '$M' -t $THREADS -f '$T/p.jsonl' --kv-dtype int8 | decode -m '$M' -t $THREADS -n 4 --kv-mem 8MiB --stats='$T/run6.json' >/dev/null"
expect_status 0 "prefill --kv-dtype int8 | decode --stats"
expect_true "the stats name the stream's KV dtype" grep -q '"kv_dtype":"i8","kv_block_bytes":195840' "$T/run6.json"
run kvcalc --check "$T/run6.json"
expect_status 0 "kvcalc agrees with an int8 stream's run"

done_testing
