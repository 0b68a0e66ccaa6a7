# kvdump: listing, --json, --check, --summary, --extract, and corrupt input.
. "$KVP_TESTS/cli/lib.sh"
mk="$KVP_UNIT_DIR/test_stream"
"$mk" --write-sample "$T/s.kvp" || { status=1; fail "could not write the sample stream"; }
"$mk" --write-sample "$T/z.kvp" 3 || { status=1; fail "could not write the zstd sample"; }

run kvdump "$T/s.kvp"
expect_status 0 "lists a valid stream"
expect_out_has "OFFSET  KIND" "table header"
expect_out_has "version 1.0, producer \"test_stream\"" "stream header line"
expect_out_has "f32 [6, 8] scale channel/f16" "tensor dtype, shape and scheme"
expect_out_has "tokens 37 (prompt 36) next 42" "sequence fields"
expect_out_has "tokens 16/16 layers 0-1 3x16 i8 hash" "KV block fields"
expect_out_has "kind 100 skipped" "unknown record kinds are skipped"
expect_out_has "7 records, 4418 payload bytes" "end record counts"
expect_err_empty "no stderr on success"
cp "$T/s.kvp" "$T/self.kvp"
run_sh "kvdump '$T/self.kvp' >> '$T/self.kvp'"
expect_status 2 "a listing appended to the stream it lists is a usage error"
expect_err_has "standard output is $T/self.kvp, the input" "says which file"
expect_true "the stream is as it was" cmp -s "$T/s.kvp" "$T/self.kvp"

run kvdump --json "$T/s.kvp"
expect_status 0 "--json"
n=$(grep -c '^{.*}$' "$OUT")
if [ "$n" -eq 9 ]; then pass "--json prints one object per record and the header"; else fail "--json line count $n"; fi
expect_out_has '"kind":"kv_block"' "--json names kinds"
expect_out_has '"shape":[6,8]' "--json shape"
# A sequence's token ids: all 37 in JSON; the first 8 and last 4 in the listing.
ids=$(sed -n 's/.*"kind":"sequence".*"token_ids":\[\([0-9,]*\)\].*/\1/p' "$OUT")
n=$(printf '%s' "$ids" | tr ',' '\n' | grep -c .)
if [ "$n" -eq 37 ]; then pass "--json gives all 37 token ids"; else fail "--json token_ids has $n ids"; fi
short="$(printf '%s' "$ids" | cut -d, -f1-8 | tr ',' ' ') ... $(printf '%s' "$ids" | cut -d, -f34-37 | tr ',' ' ')"
run kvdump "$T/s.kvp"
expect_out_has "next 42 ids [$short]" "the listing shows the first 8 and the last 4 ids"

# An integer id (a prompts line's {"id":7}) shows bare, a string id quoted.
"$mk" --write-int-id "$T/intid.kvp" || { status=1; fail "could not write the integer-id sample"; }
run kvdump --json "$T/intid.kvp"
expect_status 0 "--json of integer ids"
expect_out_has '"seq_id":0,"label":7,' "--json prints an integer id as an integer"
expect_out_has '"label":-9223372036854775808,' "--json prints the least int64 id bare"
expect_out_has '"label":7,"tokens":2,"prompt_tokens":2,"next_token":-1,"state":1,"arrival_ns":0,"first_token_ns":0,"max_tokens":0,"flags":1,' "--json gives a sequence's max_tokens and flags"
expect_out_has '"max_tokens":64,"flags":3,' "--json: its own max_tokens (flag bit 1) beside the integer id's bit 0"
run kvdump "$T/intid.kvp"
expect_out_has 'seq 0 "7" tokens 2' "the listing quotes an integer id too (a label beside numbers)"
run kvdump "$T/s.kvp"
expect_out_has 'seq 3469464161541295809 "req-360" tokens' "the listing quotes a string id"

run kvdump -s "$T/z.kvp"
expect_status 0 "--summary on a zstd stream"
expect_out_has "(7 records compressed)" "zstd records counted"
expect_out_has "kv_block   1" "counts by kind"
run kvdump --summary --json "$T/s.kvp"
expect_out_has '"records":8' "summary JSON record count"
expect_out_has '"compression_ratio":1.0000' "uncompressed ratio"

# --check verifies a KV stream's sequences and blocks as decode needs them
# (test_stream --write-kv: two sequences, the second's first block a
# reference to the first's); the sample above is a stream of records, not
# of whole sequences (its sequence's block 1 comes alone).
"$mk" --write-kv "$T/kv.kvp" || { status=1; fail "could not write the KV stream"; }
"$mk" --write-kv "$T/kvz.kvp" zstd || { status=1; fail "could not write the zstd KV stream"; }
run kvdump --check "$T/kvz.kvp"
expect_status 0 "--check accepts a valid stream"
expect_out_empty "--check prints nothing on success"

run_sh "cat '$T/kv.kvp' | kvdump --check -"
expect_status 0 "--check reads a pipe"

bad_kv() { # FLAW WANT WHAT
    if "$mk" --write-kv "$T/bad.kvp" "$1"; then
        run kvdump "$T/bad.kvp"
        expect_status 0 "the listing shows its records as they are ($3)"
        run kvdump --check "$T/bad.kvp"
        expect_status 1 "--check refuses $3"
        expect_err_has "$T/bad.kvp: $2" "names the file, the record and what is wrong ($3)"
    else
        status=1; fail "could not write the stream with $3"
    fi
}
bad_kv noseq "record 0: a KV block with no sequence before it" "a block before its sequence"
bad_kv dupid "record 4: sequence 7 appears twice" "a sequence id twice"
bad_kv skip "record 2: block 2 of sequence 7 (5 tokens) where block 1 of sequence 7 (16 tokens) belongs" \
    "a block left out"
bad_kv ntok "record 5: block 0 of sequence 8 (3 tokens) where block 0 of sequence 8 (16 tokens) belongs" \
    "a reference of the wrong token count"
bad_kv hash "record 2: block 1 of sequence 7 names parent hash " "a block chained from another parent"
expect_err_has ", where the hash of its block before is " "says which parent it should name"
bad_kv refhash "record 5: block 0 of sequence 8: its hash does not match the sequence's tokens" \
    "a reference whose hash is another block's"
# a reference's parent hash was never checked (its own hash right)
bad_kv parent "record 5: block 0 of sequence 8 names parent hash 0000000000001234, where block 0's is \
0000000000000000" "a reference naming another parent"
bad_kv tokens "record 2: block 1's tokens differ from its sequence's" "a block's tokens"
bad_kv owed "sequence 8: the stream carries KV for 1 of its 2 blocks" "a sequence's last block missing at the end"
bad_kv dangling "record 5: refers to block" "a reference to a block no record holds"
expect_err_has "which no earlier record holds" "says so"
"$mk" --rewrite "$T/kv.kvp" "$T/bad.kvp" seq-u32@20=0 || { status=1; fail "could not rewrite the KV stream"; }
run kvdump "$T/bad.kvp"
expect_status 1 "a sequence of block size 0 is refused, listed too"
expect_err_has "record 0 (sequence) at offset 64: block size 0" "names the record and the field"
# quantize --kv copies the record after decoding it: the same fault, named
# with its file (a pipeline's stages each read another)
run quantize --kv fp8 "$T/bad.kvp" -o "$T/bad8.kvp"
expect_status 1 "quantize --kv of a sequence of block size 0 is refused"
expect_err_has "quantize: $T/bad.kvp: record 0 (sequence) at offset 64: block size 0" "names the file, the record and the field"
expect_true "no output left" test ! -e "$T/bad8.kvp"
run_sh "quantize --kv fp8 - < '$T/bad.kvp' > '$T/bad8.kvp'"
expect_err_has "quantize: <stdin>: record 0 (sequence)" "standard input named as such"

# kvp(5): fp8_e4m3 and i8 KV elements carry f32 scales, f32, f16 and bf16
# none.  The sample's i8 block without its scales passed --check, and
# quantize --kv f16 turned its codes into values (exit 0); an f16 block
# with a scale dtype was refused naming scales_bytes.
"$mk" --rewrite "$T/s.kvp" "$T/nosc.kvp" noscales@5 || { status=1; fail "could not drop the KV block's scales"; }
run kvdump --check "$T/nosc.kvp"
expect_status 1 "--check refuses an i8 KV block without scales"
expect_err_has "kvdump: $T/nosc.kvp: record 5 (kv_block) at offset 1728: scales_bytes 0: i8 elements need their f32 \
scales, 48 bytes (one a head) or 768 (one a slot)" "names the file, the record and the field"
run quantize --kv f16 "$T/nosc.kvp" -o "$T/nosc16.kvp"
expect_status 1 "quantize --kv f16 refuses it"
expect_err_has "quantize: $T/nosc.kvp: record 5 (kv_block) at offset 1728: scales_bytes 0" "names the field"
expect_true "no output left" test ! -e "$T/nosc16.kvp"
"$mk" --rewrite "$T/kv.kvp" "$T/sd7.kvp" kv-u32@40=7 || { status=1; fail "could not set the scale dtype"; }
run kvdump --check "$T/sd7.kvp"
expect_status 1 "--check refuses an f16 KV block with a scale dtype"
expect_err_has "$T/sd7.kvp: record 1 (kv_block) at offset 448: scale dtype 7 (i8) on a f16 block, which carries no \
scales (want 0)" "names the scale dtype, not scales_bytes"
run quantize --kv fp8 "$T/sd7.kvp" -o "$T/sd7-8.kvp"
expect_status 1 "quantize --kv refuses it"
expect_err_has "$T/sd7.kvp: record 1 (kv_block) at offset 448: scale dtype 7 (i8)" "naming the scale dtype"

# kvp(5), End: 16 kind counters (fewer is a damaged record), or more from a
# later version (each checked); a fault in it names the file.
"$mk" --rewrite "$T/s.kvp" "$T/end15.kvp" end-counters@15 || { status=1; fail "could not write 15 counters"; }
run kvdump "$T/end15.kvp"
expect_status 1 "an end record of 15 counters is refused"
expect_err_has "kvdump: $T/end15.kvp: record 7 (end) at offset 5248: " "names the file and the record"
expect_err_has ": 15 kind counters (kvp(5): 16, one for each of kinds 0..15" "and what is wrong"
"$mk" --rewrite "$T/s.kvp" "$T/end17.kvp" end-counters@17 || { status=1; fail "could not write 17 counters"; }
run kvdump "$T/end17.kvp"
expect_status 0 "a later version's 17 counters are read"
"$mk" --rewrite "$T/s.kvp" "$T/end21.kvp" unknown@4 || { status=1; fail "could not insert a record"; }
"$mk" --rewrite "$T/end21.kvp" "$T/end21b.kvp" end-counters@21 || { status=1; fail "could not write 21 counters"; }
run kvdump --summary "$T/end21b.kvp"
expect_status 0 "a counter for kind 20, one record of it"
expect_out_has "9 records" "--summary counts every record"
expect_out_has "unknown    2 (skipped)" "the unknown kinds among them"

name=$(kvdump --json "$T/s.kvp" | sed -n 's/.*"kind":"tensor".*"name":"\([^"]*\)".*/\1/p')
run_sh "kvdump --extract '$name' '$T/s.kvp' > '$T/x.bin'"
expect_status 0 "--extract a tensor"
size=$(wc -c <"$T/x.bin")
if [ "$size" -eq 192 ]; then pass "--extract writes the 192 data bytes"; else fail "--extract wrote $size bytes"; fi
run_sh "kvdump -x '$name' -x other '$T/s.kvp' > /dev/null"
expect_status 2 "two --extract names: a usage error (their bytes would run together)"
expect_err_has "--extract: one tensor at a time (got '$name' and 'other')" "naming both"
run_sh "kvdump --extract nosuch '$T/s.kvp' > /dev/null"
expect_status 1 "--extract of a missing tensor fails"
expect_err_has "no tensor named 'nosuch'" "names the missing tensor"

# Truncated through a pipe: exit 1 with the offset.
run_sh "head -c 3000 '$T/s.kvp' | kvdump --check"
expect_status 1 "truncated pipe input"
expect_err_has "payload cut short at offset 3000" "truncation names the offset"
expect_err_one_line "one line of error"

head -c 5248 "$T/s.kvp" >"$T/noend.kvp"
run kvdump "$T/noend.kvp"
expect_status 1 "stream without its end record"
expect_err_has "without an end record (truncated)" "missing end record is reported"

# A flipped bit in the KV block payload.
cp "$T/s.kvp" "$T/flip.kvp"
printf '\377' | dd of="$T/flip.kvp" bs=1 seek=2000 conv=notrunc 2>/dev/null
run kvdump --check "$T/flip.kvp"
expect_status 1 "corrupted payload"
expect_err_has "record 5 (kv_block) at offset 1728: payload checksum mismatch" "checksum error names record and offset"
# The tensor comes before the damage: --extract must still write nothing.
run_sh "kvdump --extract '$name' '$T/flip.kvp' > '$T/x2.bin'"
expect_status 1 "--extract from a stream damaged after the tensor"
expect_err_has "payload checksum mismatch" "--extract names the damage"
if [ -f "$T/x2.bin" ] && [ ! -s "$T/x2.bin" ]; then pass "--extract wrote nothing from a damaged stream"; else
    fail "--extract wrote $(wc -c <"$T/x2.bin") bytes from a damaged stream"; fi
run_sh "kvdump --extract '$name' '$T/noend.kvp' > '$T/x3.bin'"
expect_status 1 "--extract from a truncated stream"
if [ ! -s "$T/x3.bin" ]; then pass "--extract wrote nothing from a truncated stream"; else
    fail "--extract wrote $(wc -c <"$T/x3.bin") bytes from a truncated stream"; fi

printf 'GGUF\003\000\000\000' >"$T/notkvp"
run kvdump "$T/notkvp"
expect_status 1 "not a KVP file"
expect_err_has "not a KVP stream (bad magic at offset 0)" "bad magic message"

: >"$T/empty"
run kvdump "$T/empty"
expect_status 1 "empty file"
expect_err_has "empty input" "empty input message"

run kvdump "$T"
expect_status 1 "a directory"
expect_err_has "is a directory" "directory message"

run kvdump "$T/missing.kvp"
expect_status 1 "missing file"
expect_err_has "No such file or directory" "missing file message"

run kvdump --bogus
expect_status 2 "unknown option"
expect_err_has "Try 'kvdump --help'" "usage hint"
run kvdump --check --summary "$T/s.kvp"
expect_status 2 "conflicting options"
run kvdump a b
expect_status 2 "two inputs"
run kvdump --help
expect_status 0 "--help"
expect_out_has "Usage: kvdump" "--help prints usage"
run kvdump --version
expect_status 0 "--version"
expect_out_has "kvpipe" "--version names the project"

# Saved next-token distributions (prefill --save-logits): SCORES and LOGPROBS.
lp="$KVP_UNIT_DIR/test_logprobs"
"$lp" --write-sample "$T/lp.kvp" || { status=1; fail "could not write the logprobs sample"; }
"$lp" --write-sample "$T/lpfull.kvp" full || { status=1; fail "could not write the full-row sample"; }
mkdir "$T/seeds" && "$lp" --write-seeds "$T/seeds" || { status=1; fail "could not write the damaged logprobs files"; }
run kvdump "$T/lp.kvp"
expect_status 0 "lists a saved-distributions file"
expect_out_has "scores             57         57  ok       tokens 41 hash 2ccfd8f13da911bc ctx 12 first 5 windows 3 vocab 40 k 5 bos 1 text \"wiki.test.raw\"" "scores fields"
expect_out_has "logprobs          440        440  ok       window 1 positions 6 k 5 mean lp_tok -2.7007 (ppl 14.8894)" "logprobs fields"
expect_out_has "4 records, 1377 payload bytes" "end record of a saved-distributions file"
run kvdump "$T/lpfull.kvp"
expect_out_has "windows 3 vocab 40 k full bos 1" "full rows are k full"
expect_out_has "window 2 positions 6 k full mean lp_tok" "a full-row window"
run kvdump --json "$T/lp.kvp"
expect_out_has '"kind":"scores","index":0,"offset":64,"stored_bytes":57,"raw_bytes":57,"zstd":false,"checksum":"ok","tokens_hash":"2ccfd8f13da911bc","n_tokens":41,"ctx":12,"first":5,"windows":3,"n_vocab":40,"top_k":5,"bos":1,"text":"wiki.test.raw"}' "--json scores"
expect_out_has '"window":1,"positions":6,"top_k":5,"n_vocab":40,"mean_lp_tok":-2.700' "--json logprobs"
run kvdump --json "$T/seeds/unknown-kinds.kvp"
expect_out_has '"mean_lp_tok":null' "--json: a mean of -inf is null"
run kvdump --summary "$T/lpfull.kvp"
expect_out_has "logprobs   3" "--summary counts windows"
expect_out_has "scored:  18 positions in windows" "--summary counts positions"
run kvdump --check "$T/lp.kvp"
expect_status 0 "--check accepts a saved-distributions file"
expect_out_empty "--check prints nothing"
run kvdump --check "$T/seeds/bad-dup-ids.kvp"
expect_status 1 "a window with a repeated id"
expect_err_has "bad-dup-ids.kvp: record 2 (logprobs) at offset 704: window 1: row 2: id 35 appears twice" "names the record, window, row and id"
expect_err_one_line "one line of error"
run kvdump --check "$T/seeds/bad-short-data.kvp"
expect_status 1 "a window one byte short"
expect_err_has "data part holds 1023 bytes, n_pos 6, top_k 0 and n_vocab 40 need 1024" "names both sizes"
run kvdump --check "$T/seeds/bad-fewer-windows.kvp"
expect_status 1 "fewer windows than announced"
expect_err_has "record 3 (end) at offset 1216: the scores record announces 3 windows, 2 came" "names the counts"
run kvdump --check "$T/seeds/bad-cut.kvp"
expect_status 1 "a cut saved-distributions file"
expect_err_has "record 2 (logprobs) at offset 704 declares 440 payload bytes (448 with padding) but only 232 remain (truncated)" "names the cut"
# one byte short: the padded size is what must remain, and the message says both
head -c $(($(wc -c <"$T/lp.kvp") - 1)) "$T/lp.kvp" >"$T/lp-1.kvp"
run kvdump --check "$T/lp-1.kvp"
expect_status 1 "a stream one byte short"
expect_err_has "payload bytes (" "names the padded size"
pad=$(sed -n 's/.*declares \([0-9]*\) payload bytes (\([0-9]*\) with padding) but only \([0-9]*\) remain.*/\2 \3/p' "$ERR")
if [ -n "$pad" ] && [ $((${pad% *} - 1)) -eq "${pad#* }" ]; then pass "one byte short of the padded size"; else
    fail "one byte short of the padded size (got '$pad')"; fi

# kvp(5)'s sequence fields: a state, finish reason or sampling parameter it
# does not define is refused by --check, naming the file, record and field;
# so is a second tensor of one name.  (test_stream --rewrite edits a copy.)
bad_seq() { # EDIT WANT WHAT
    if "$mk" --rewrite "$T/s.kvp" "$T/e.kvp" "$1"; then
        run kvdump --check "$T/e.kvp"
        expect_status 1 "--check refuses $3"
        expect_err_has "$T/e.kvp: record 4 (sequence) at offset 1344: $2" "names the file, record and field ($3)"
    else
        status=1; fail "could not write the stream with $3"
    fi
    rm -f "$T/e.kvp"
}
bad_seq seq-u32@0=9 "state 9 is not 1 (prefilled), 2 (running) or 3 (finished)" "an undefined state"
bad_seq seq-u32@0=0 "state 0 is not" "state 0"
bad_seq seq-u32@4=9 "finish reason 9 is not 0..4" "an undefined finish reason"
bad_seq seq-f32@24=nan "temperature nan" "a NaN temperature"
bad_seq seq-f32@32=2 "top-p 2" "a top-p above 1"
"$mk" --rewrite "$T/kv.kvp" "$T/e.kvp" seq-u32@4=4 || { status=1; fail "could not rewrite the KV stream"; }
run kvdump --check "$T/e.kvp"
expect_status 0 "finish reason 4 (KV memory) is defined"
"$mk" --rewrite "$T/s.kvp" "$T/dup.kvp" dup@2 || { status=1; fail "could not write the stream with a tensor twice"; }
run kvdump --check "$T/dup.kvp"
expect_status 1 "--check refuses a second tensor of one name"
expect_err_has "$T/dup.kvp: record 3 (tensor blk." "names the file and the second record"
expect_err_has "a second tensor of that name (the first is record 2)" "and the first"
run kvdump --summary "$T/dup.kvp"
expect_status 1 "so does --summary"

# A closed stdout ends kvdump quietly (like head).
run_sh "{ kvdump --json '$T/s.kvp'; echo \$? >'$T/rc'; } | head -c 1 >/dev/null"
rc=$(cat "$T/rc")
if [ "$rc" -eq 0 ] || [ "$rc" -eq 141 ]; then pass "closed pipe ends kvdump quietly"; else fail "closed pipe: exit $rc"; fi
expect_err_empty "no error on a closed pipe"
run_sh "kvdump '$T/s.kvp' > /dev/full"
expect_status 1 "full disk on stdout"
expect_err_has "write error" "full disk reported"

done_testing
