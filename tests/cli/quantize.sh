# quantize: safetensors and GGUF conversion, reports, dry runs, usage and
# input errors, atomic output, --kv streams; and, when the real model is in
# the cache, SmolLM2-135M Q4_1 to every target with a sane SNR ordering.
. "$KVP_TESTS/cli/lib.sh"
mk="$KVP_UNIT_DIR/test_convert"
G="$KVP_TESTS/golden/tiny-st"
"$mk" --write-gguf "$T/tiny.gguf" || { status=1; fail "could not write the tiny GGUF"; }
"$mk" --write-kv-sample "$T/kv.kvp" || { status=1; fail "could not write the KV sample"; }

# ---- safetensors (the golden tiny checkpoint) ----

run quantize --to f16 --drop '^step$' "$G" -o "$T/st.kvp"
expect_status 0 "safetensors folder to f16"
expect_err_has "no tokenizer.json" "a missing tokenizer.json is noted"

# a tokenizer.json of another algorithm is kept as text with a note (the
# model converts, as other models the engine cannot run do); a malformed one
# is refused naming the file and what is wrong, and nothing is written
mkdir "$T/tokst" && cp "$G/config.json" "$G/model.safetensors" "$T/tokst/"
printf '{"model": {"type": "WordPiece", "vocab": {"a": 0}}}' >"$T/tokst/tokenizer.json"
run quantize --to f16 --drop '^step$' "$T/tokst" -o "$T/tokst.kvp"
expect_status 0 "a WordPiece tokenizer.json converts"
expect_err_has "model.type: \"WordPiece\" is not supported (BPE) (kept as text only)" "kept as text, saying why"
run kvdump --json "$T/tokst.kvp"
expect_out_has '"kind":"tokenizer","index":1' "a TOKENIZER record is written"
expect_true "holding the text (a record this small is stored as is)" grep -qaF '"WordPiece"' "$T/tokst.kvp"
printf '{"model": {"type": "BPE", "vocab": {"a": 0}\n' >"$T/tokst/tokenizer.json"
run quantize --to f16 --drop '^step$' "$T/tokst" -o "$T/tokst-bad.kvp"
expect_status 1 "a tokenizer.json that is not JSON is refused"
expect_err_has "tokst/tokenizer.json:1:11: unterminated object" "naming the file, the place and what is wrong"
expect_true "nothing written" test ! -e "$T/tokst-bad.kvp"
printf '{"pre_tokenizer": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": {"a": 0}, "merges": {"a": 1}}}' \
    >"$T/tokst/tokenizer.json"
run quantize --to f16 --drop '^step$' "$T/tokst" -o "$T/tokst-bad.kvp"
expect_status 1 "a BPE tokenizer.json whose merges are not a list is refused"
expect_err_has "tokenizer.json: model.merges: not an array" "naming the field"
expect_true "nothing written" test ! -e "$T/tokst-bad.kvp"
run kvdump --check "$T/st.kvp"
expect_status 0 "kvdump --check accepts the safetensors conversion"
run kvdump "$T/st.kvp"
expect_out_has 'producer "quantize 0.1.0"' "producer in the stream header"
expect_out_has "model.layers.0.self_attn.k_proj.weight" "HF tensor names are kept"

# k_proj is bf16 in the file, element i = ((i + 3) % 7 - 3) / 4: exact in f16
want=$(awk 'BEGIN { split("ba00 b800 b400 0000 3400 3800 3a00", h, " ");
    for (i = 0; i < 32; i++) printf "%s ", h[(i + 3) % 7 + 1]; print "" }')
kvdump --extract model.layers.0.self_attn.k_proj.weight "$T/st.kvp" >"$T/k.bin" 2>"$ERR"
got=$(od -An -v -tx2 "$T/k.bin" | tr -s ' \n' '  ' | sed 's/^ //')
if [ "$got" = "$want" ]; then pass "bf16 -> f16 values exact (kvdump --extract)"; else fail "f16 values: got '$got' want '$want'"; fi

run quantize --to int8 --drop '^step$' "$G/sharded/model.safetensors.index.json" -o "$T/st8.kvp" --report -
expect_status 0 "sharded safetensors (index.json) to int8 with --report -"
expect_out_has "name	shape	from	to	scheme	bytes_in	bytes_out	rmse	rel_err	snr_db	max_abs_err	clipped" "TSV report header"
expect_out_has "model.layers.0.mlp.down_proj.weight	8x16	BF16	i8	channel	256	160	" "TSV report row"
expect_out_has "TOTAL	12 tensors read: 11 written (7 converted), 1 dropped	-	-	-	" "TSV summary row: every count named"
# the byte columns of the rows (the dropped one's too) add up to the TOTAL row's
sums=$(awk -F'\t' 'NR > 1 && $1 != "TOTAL" { i += $6; o += $7 } $1 == "TOTAL" { ti = $6; to = $7 }
    END { print (i == ti && o == to) ? "ok" : i " " o " vs " ti " " to }' "$OUT")
if [ "$sums" = ok ]; then pass "report: the rows add up to TOTAL"; else fail "report sums: $sums"; fi
run kvdump --check "$T/st8.kvp"
expect_status 0 "int8 output passes kvdump --check"

run quantize --to f32 "$T/st8.kvp" -o "$T/st32.kvp" --json --report "$T/r.jsonl"
expect_status 0 "a KVP model as input (int8 back to f32)"
n=$(grep -c '^{"name":' "$T/r.jsonl")
if [ "$n" -eq 11 ]; then pass "--json report: one object per tensor"; else fail "--json rows: $n"; fi
if tail -n 1 "$T/r.jsonl" | grep -q '^{"summary":true,"read":11,"tensors":11,'; then pass "--json summary line"; else fail "--json summary: $(tail -n 1 "$T/r.jsonl")"; fi

run quantize --to int8 "$G" -o "$T/nostep.kvp"
expect_status 1 "an unsupported source type fails"
expect_err_has "tensor step: unsupported type I64" "the error names the tensor and its type"
expect_err_one_line "one error line"
expect_true "a failed conversion leaves no output" test ! -e "$T/nostep.kvp"

# A file of the model's folder that the conversion reads (the other shards,
# config.json) is not an output, whichever file of the folder names the
# input; another name in that folder is
cp -r "$G/sharded" "$T/shcopy"
for victim in model-00002-of-00002.safetensors config.json; do
    run quantize --to f16 --drop '^step$' "$T/shcopy/model.safetensors.index.json" -o "$T/shcopy/$victim" -f
    expect_status 2 "-o over the index's $victim"
    expect_err_has "would replace a file of the input folder" "says so ($victim)"
done
expect_true "the folder is intact" cmp -s "$G/sharded/config.json" "$T/shcopy/config.json"
run quantize --to f16 --drop '^step$' "$T/shcopy/model.safetensors.index.json" -o "$T/shcopy/out.kvp"
expect_status 0 "a new file in the folder is fine"
# config.json rules what the engine does: an untied head that is missing is
# refused (it was replaced by the embeddings), a RoPE scaling it does not
# run too, from the folder and from the converted file
cp -r "$G" "$T/untied"
sed 's/"tie_word_embeddings": true/"tie_word_embeddings": false/' "$G/config.json" >"$T/untied/config.json"
run quantize --to f16 --drop '^step$' "$T/untied" -o "$T/untied.kvp"
expect_status 1 "an untied head missing"
expect_err_has "tensor lm_head.weight is missing (config.json: tie_word_embeddings is false)" "says so"
cp -r "$G" "$T/yarn"
sed 's/"rope_theta": 10000.0,/"rope_theta": 10000.0, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},/' \
    "$G/config.json" >"$T/yarn/config.json"
run decode -m "$T/yarn" -p hi -n 1
expect_status 1 "decode of a yarn-scaled model"
expect_err_has 'RoPE scaling "yarn" is not supported' "says so"
run quantize --to f16 --drop '^step$' "$T/yarn" -o "$T/yarn.kvp"
expect_status 0 "quantize keeps yarn in the file (kvcalc plans such models)"
run decode -m "$T/yarn.kvp" -p hi -n 1
expect_status 1 "decode of the converted file refuses it too"
expect_err_has '"yarn" is not supported' "naming it"
sed 's/"rope_theta": 10000.0,/"rope_theta": 10000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0},/' \
    "$G/config.json" >"$T/yarn/config.json"
run quantize --to f16 --drop '^step$' "$T/yarn" -o "$T/l3.kvp"
expect_status 1 "llama3 scaling without its original context"
expect_err_has "llama3 scaling needs original_max_position_embeddings" "says so"

# ---- bare safetensors: tensors without config.json ----

# bare.safetensors, written here: "w16" f16 [2, 4], "w32" f32 [4, 8], "bias" f32 [3]
put_le() { # BYTES WORD...: each word as BYTES little-endian bytes
    _k=$1
    shift
    for _w in "$@"; do
        _i=0
        while [ "$_i" -lt "$_k" ]; do
            printf "$(printf '\\%03o' $(((_w >> (8 * _i)) & 255)))"
            _i=$((_i + 1))
        done
    done
}
hdr='{"__metadata__":{"format":"pt"},"w16":{"dtype":"F16","shape":[2,4],"data_offsets":[0,16]},"w32":{"dtype":"F32","shape":[4,8],"data_offsets":[16,144]},"bias":{"dtype":"F32","shape":[3],"data_offsets":[144,156]}}'
# f32 words: 1, 0.5, -1, 0.25, 2, -0.75, 0.125, -2 in turn
f32s="0x3f800000 0x3f000000 0xbf800000 0x3e800000 0x40000000 0xbf400000 0x3e000000 0xc0000000"
{
    put_le 8 ${#hdr}
    printf '%s' "$hdr"
    put_le 2 0x3c00 0xb800 0x4000 0x3555 0x0001 0x7bff 0x8400 0x0000
    put_le 4 $f32s $f32s $f32s $f32s
    put_le 4 0x3f800000 0x40400000 0xc0a00000
} >"$T/bare.safetensors"
run quantize --to f16 "$T/bare.safetensors" -o "$T/bare16.kvp"
expect_status 0 "a bare safetensors file converts"
expect_err_has "no config.json" "the missing config is noted"
run kvdump "$T/bare16.kvp"
expect_out_has "fingerprint 00000000000000000000000000000000" "no model: zero fingerprint"
expect_out_lacks " config " "no CONFIG record"
expect_out_lacks " tokenizer " "no TOKENIZER record"
expect_out_has "w32 f16 [4, 8]" "f32 weight cast to f16"
expect_out_has "bias f32 [3]" "1-D tensor kept f32"
run kvdump --check "$T/bare16.kvp"
expect_status 0 "kvdump --check accepts the tensor stream"
# round trip: kvdump --extract gives the tensors back
data=$((8 + ${#hdr}))
extract_cmp() { # NAME OFFSET BYTES KVP: extracted bytes equal the source's
    kvdump --extract "$1" "$4" >"$T/x.bin" 2>"$ERR"
    tail -c +$((data + $2 + 1)) "$T/bare.safetensors" | head -c "$3" >"$T/want.bin"
    if cmp -s "$T/x.bin" "$T/want.bin"; then pass "--extract $1: the source's bytes"; else fail "--extract $1 differs"; fi
}
extract_cmp w16 0 16 "$T/bare16.kvp"
extract_cmp bias 144 12 "$T/bare16.kvp"
kvdump --extract w32 "$T/bare16.kvp" >"$T/x.bin"
got=$(od -An -v -tx2 "$T/x.bin" | tr -s ' \n' '  ' | sed 's/^ //;s/ $//')
want=$(for i in 1 2 3 4; do printf '3c00 3800 bc00 3400 4000 ba00 3000 c000 '; done | sed 's/ $//')
if [ "$got" = "$want" ]; then pass "--extract w32: f32 values exact in f16"; else fail "w32 as f16: '$got'"; fi
# through int8 and back to f32: within the quantization error (a row's max / 254)
run quantize --to int8 "$T/bare.safetensors" -o "$T/bare8.kvp"
expect_status 0 "a bare safetensors file to int8"
run quantize --to f32 "$T/bare8.kvp" -o "$T/bare32.kvp"
expect_status 0 "the tensor stream converts again (int8 to f32)"
expect_err_has "no config record: tensors only" "noted again"
kvdump --extract w32 "$T/bare32.kvp" | od -An -v -tf4 >"$T/got.txt"
tail -c +$((data + 16 + 1)) "$T/bare.safetensors" | head -c 128 | od -An -v -tf4 >"$T/want.txt"
worst=$(paste -d ' ' "$T/got.txt" "$T/want.txt" | awk '{ h = NF / 2; for (i = 1; i <= h; i++) {
    d = $i - $(i + h); if (d < 0) d = -d; if (d > m) m = d } } END { print m + 0 }')
if awk -v w="$worst" 'BEGIN { exit !(w <= 2 / 254) }'; then pass "int8 round trip within 2/254 (worst $worst)"; else
    fail "int8 round trip error $worst"; fi
# per channel on a stacked [2 experts, 2 rows, 8] weight: one scale per row
# (4), not one per expert; each expert's second row is 1024 times smaller
# than its first, so a scale per expert would round it to zeros
hdr3='{"experts":{"dtype":"F32","shape":[2,2,8],"data_offsets":[0,128]}}'
small=$(for w in $f32s; do printf '0x%08x ' $((w - 0x05000000)); done)
{
    put_le 8 ${#hdr3}
    printf '%s' "$hdr3"
    put_le 4 $f32s $small $f32s $small
} >"$T/experts.safetensors"
run quantize --to int8 --scheme channel "$T/experts.safetensors" -o "$T/experts8.kvp"
expect_status 0 "a 3-D tensor to int8 per channel"
run kvdump --json "$T/experts8.kvp"
expect_out_has '"shape":[2,2,8],"scheme":"channel","group":0,"data_bytes":32,"scales_bytes":16' \
    "per channel on [2, 2, 8]: four f32 scales, one a row"
run quantize --to f32 "$T/experts8.kvp" -o "$T/experts32.kvp"
expect_status 0 "and back to f32"
kvdump --extract experts "$T/experts32.kvp" | od -An -v -tf4 | tr -s ' ' '\n' | grep . >"$T/got.txt"
tail -c 128 "$T/experts.safetensors" | od -An -v -tf4 | tr -s ' ' '\n' | grep . >"$T/want.txt"
worst=$(paste -d ' ' "$T/got.txt" "$T/want.txt" | awk '{ a = $2 < 0 ? -$2 : $2; d = $1 - $2; if (d < 0) d = -d
    if (a > m) m = a; if (d > e) e = d } NR % 8 == 0 { if (e / m > w) w = e / m; m = 0; e = 0 } END { print w + 0 }')
if awk -v w="$worst" 'BEGIN { exit !(w <= 1.001 / 254) }'; then pass "every row within its own max / 254 (worst $worst)"; else
    fail "3-D per channel round trip: a row's error is $worst of its max"; fi
run quantize -n --to int4 "$T/bare.safetensors"
expect_status 0 "--dry-run on a bare file"
size=$(sed -n 's/.*file \([0-9]*\) bytes$/\1/p' "$OUT")
run quantize --to int4 "$T/bare.safetensors" -o "$T/bare4.kvp"
real=$(wc -c <"$T/bare4.kvp" | tr -d ' ')
if [ -n "$size" ] && [ "$size" = "$real" ]; then pass "bare dry-run file size is exact ($real)"; else fail "dry-run size '$size' vs $real"; fi
run quantize -n --to int4 "$T/bare.safetensors" -r "$T/plan.tsv"
expect_status 2 "--report with --dry-run (it wrote nothing there)"
expect_err_has "--report with --dry-run: a dry run reads no values" "says why"
expect_true "no report file" test ! -e "$T/plan.tsv"
run quantize -n -t keep -s group "$T/bare.safetensors"
expect_status 2 "--scheme with --to keep"
expect_err_has "not --to keep" "names keep, not '?'"
# an nvfp4 tensor's values need its global scale: kvdump shows it
run quantize --to nvfp4 --drop '^step$' "$G" -o "$T/bare-nv.kvp"
expect_status 0 "--to nvfp4 on the golden checkpoint"
run kvdump --json "$T/bare-nv.kvp"
expect_true "kvdump --json gives each nvfp4 tensor's global scale" \
    grep -q '"dtype":"nvfp4",.*"global_scale":[0-9.e+-]*[},]' "$OUT"
run kvdump "$T/bare-nv.kvp"
expect_out_has " global scale " "and its listing"
# the golden checkpoint's file, copied away from its config.json
mkdir "$T/lone"
cp "$G/model.safetensors" "$T/lone/"
run quantize --to bf16 --drop '^step$' "$T/lone/model.safetensors" -o "$T/lone.kvp"
expect_status 0 "a checkpoint file without its config.json"
run kvdump --summary "$T/lone.kvp"
expect_out_has "tensor     11" "all its tensors"
# what needs a model says so
run quantize --kv fp8 "$T/bare.safetensors" -o "$T/kvbare.kvp"
expect_status 1 "--kv on a safetensors file"
expect_err_has "need the model's config" "the error says --kv needs a model"
expect_err_one_line "--kv on safetensors: one line"
expect_true "--kv on safetensors: no output" test ! -e "$T/kvbare.kvp"
run decode -m "$T/bare16.kvp" -p hi -n 1
expect_status 1 "decode refuses a tensor stream as a model"
expect_err_has "no CONFIG record" "decode: no config"

# non-finite weights are refused, naming the tensor and the first bad element
# (quantized, a NaN or an infinity becomes a 0 code or a NaN scale the error
# figures cannot see); copied tensors are checked as well
mk_st() { # FILE HEADER WORD...: a safetensors file with f32 data words
    _f=$1 _h=$2
    shift 2
    { put_le 8 ${#_h}; printf '%s' "$_h"; put_le 4 "$@"; } >"$_f"
}
ones=$(i=0; while [ $i -lt 62 ]; do printf '0x3f800000 '; i=$((i + 1)); done)
whdr='{"w":{"dtype":"F32","shape":[2,32],"data_offsets":[0,256]}}'
mk_st "$T/nan.safetensors" "$whdr" $ones 0x7fc00000 0x3f800000
mk_st "$T/inf.safetensors" "$whdr" 0x7f800000 $ones 0xff800000
for to in int8 q8_0 f16 keep; do
    run quantize --to $to "$T/nan.safetensors" -o "$T/nan.kvp" -r "$T/nan.tsv"
    expect_status 1 "a NaN weight refused (--to $to)"
    expect_err_has "nan.safetensors: tensor w: element 62 [1, 30] is NaN" "--to $to: the file, tensor and element named"
    expect_err_one_line "NaN, --to $to: one error line"
    expect_true "NaN, --to $to: no output, no report" test ! -e "$T/nan.kvp" -a ! -e "$T/nan.tsv"
done
run quantize --to q4_0 "$T/inf.safetensors" -o "$T/inf.kvp"
expect_status 1 "an infinite weight refused"
expect_err_has "tensor w: element 0 [0, 0] is +inf" "the first infinity named"
# finite weights a narrower type cannot hold (1e30 past f16's 65504, and
# past a q4_0 block scale's f16) are refused too, not written as infinities
mk_st "$T/e30.safetensors" "$whdr" $ones 0x7149f2ca 0x3f800000
for to in f16 q4_0; do
    run quantize --to $to "$T/e30.safetensors" -o "$T/wide.kvp" -r "$T/wide.tsv"
    expect_status 1 "a weight past $to's range refused"
    expect_err_has "e30.safetensors: tensor w: element 62 [1, 30] (1e+30) is beyond the range of $to" \
        "--to $to: the tensor, the element and the type named"
    expect_err_one_line "past $to's range: one error line"
    expect_true "past $to's range: no output, no report" test ! -e "$T/wide.kvp" -a ! -e "$T/wide.tsv"
done
run quantize --to bf16 "$T/e30.safetensors" -o "$T/wide.kvp"
expect_status 0 "bf16 holds 1e30"
# a row whose max is tiny (2^-123: its fp8 or int8 scale is below 2^-128,
# whose f32 reciprocal is inf) keeps its zeros and its sizes: 0 x inf was
# NaN, a false "beyond the range" refusal, and the others came back +-max
mk_st "$T/tiny.safetensors" "$whdr" $(i=0; while [ $i -lt 32 ]; do printf '0x3f800000 '; i=$((i + 1)); done) \
    0x02000000 0x81800000 0x01000000 $(i=0; while [ $i -lt 29 ]; do printf '0 '; i=$((i + 1)); done)
for to in "fp8 --scheme channel" "fp8-e5m2 --scheme channel" "int8 --scheme channel"; do
    run quantize -f --to $to "$T/tiny.safetensors" -o "$T/tiny.kvp"
    expect_status 0 "--to $to: a row of tiny values and zeros"
    run quantize -f --to f32 "$T/tiny.kvp" -o "$T/tiny32.kvp"
    got=$(kvdump --extract w "$T/tiny32.kvp" | tail -c 128 | od -An -v -tf4 | tr -s ' \n' '  ' | sed 's/^ //;s/ $//')
    # 2^-123, -2^-124, 2^-125 within an eighth of 2^-123, then 29 zeros
    if printf '%s\n' "$got" | awk '{ split("9.4039548e-38 -4.7019774e-38 2.3509887e-38", w, " ")
        for (i = 1; i <= 3; i++) { d = $i - w[i]; if (d < 0) d = -d; if (d > w[1] / 8) exit 1 }
        for (i = 4; i <= 32; i++) if ($i != 0) exit 1; exit NF != 32 }'; then
        pass "--to $to: the tiny row comes back near its values, zeros as zeros"
    else
        fail "--to $to: the tiny row came back as $got"
    fi
done
# a tensor KVP cannot hold: no elements (say so, not "unsupported type")
mk_st "$T/empty.safetensors" '{"w":{"dtype":"F32","shape":[2,0],"data_offsets":[0,0]},"v":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}' 0x3f800000
run quantize --to f16 "$T/empty.safetensors" -o "$T/empty.kvp"
expect_status 1 "a tensor with no elements"
expect_err_has "tensor w: shape [2, 0] has no elements (a KVP tensor holds at least one; --drop leaves it out)" "says it has no elements"
expect_err_one_line "no elements: one line"
run quantize --to f16 --drop '^w$' "$T/empty.safetensors" -o "$T/empty.kvp"
expect_status 0 "which --drop leaves out"
# more than 4 dimensions: the leading 1s are left out, and a note says so
mk_st "$T/d6.safetensors" '{"w":{"dtype":"F32","shape":[1,1,1,1,2,32],"data_offsets":[0,256]}}' $ones 0x3f800000 0x3f800000
run quantize --to f16 "$T/d6.safetensors" -o "$T/d6.kvp"
expect_status 0 "a tensor of 6 dimensions with leading 1s"
expect_err_has "tensor w: shape [1, 1, 1, 1, 2, 32] stored as [1, 1, 2, 32] (KVP holds at most 4 dimensions" "the squeezed shape is noted"
run kvdump "$T/d6.kvp"
expect_out_has "w f16 [1, 1, 2, 32]" "and stored so"

# ---- GGUF (a small one written by the unit test helper) ----

run quantize --to int4 "$T/tiny.gguf" -o "$T/g4.kvp"
expect_status 1 "GGUF with an iq2_xxs tensor"
expect_err_has "tensor blk.0.weird.weight: unsupported type iq2_xxs" "iq2_xxs named"
run quantize --to int4 --drop weird "$T/tiny.gguf" -o "$T/g4.kvp"
expect_status 0 "GGUF to int4 with --drop"
expect_err_has "took a fallback" "group fallback noted on stderr"
# the same again on its output: every tensor is already what was asked, so
# copied; no fallback was taken this time
run quantize --to int4 "$T/g4.kvp" -o "$T/g4b.kvp"
expect_status 0 "int4 again on an int4 file"
expect_err_lacks "took a fallback" "copied tensors take no fallback"
expect_true "and the file is the same" cmp -s "$T/g4.kvp" "$T/g4b.kvp"
run kvdump "$T/g4.kvp"
expect_out_has "blk.0.attn_q.weight" "GGUF names kept"
expect_out_has "i4 [8, 64] scale group/f32 group 64" "int4 group 64 on rows of 64, shape reversed"
expect_out_has "q8_0 [4, 64]" "embedding kept in its source type"
run kvdump --check "$T/g4.kvp"
expect_status 0 "GGUF conversion passes kvdump --check"
# a float --to widens quantized embeddings (a tied output head is the same
# tensor: kept as q8_0 it would run on 8-bit activations); keep keeps them
run quantize --to f16 --drop weird "$T/tiny.gguf" -o "$T/e16.kvp"
expect_status 0 "GGUF to f16"
run kvdump "$T/e16.kvp"
expect_out_has "token_embd.weight f16 [4, 64]" "--to f16 widens the q8_0 embeddings too"
run quantize --to f16 --embed keep --drop weird "$T/tiny.gguf" -o "$T/e16.kvp" -f
run kvdump "$T/e16.kvp"
expect_out_has "token_embd.weight q8_0 [4, 64]" "--embed keep keeps them q8_0"
expect_out_has "blk.0.attn_q.weight f16" "and converts the rest"
run quantize -n --to bf16 --drop weird "$T/tiny.gguf"
expect_out_has "token_embd.weight	4x64	q8_0	bf16" "--to bf16 widens them to bf16 (dry run)"

run quantize -n --to q8_0 --drop weird "$T/tiny.gguf"
expect_status 0 "--dry-run"
expect_out_has "blk.0.ffn_down.weight	64x48	f16	f16	-	6144	6144	f16: " "dry run shows the f16 fallback"
expect_out_has "TOTAL	12 tensors read: 11 written (6 converted), 1 dropped	-	-	-	" "dry run TOTAL row: every count named"
sums=$(awk -F'\t' 'NR > 1 && $1 != "TOTAL" { i += $6; o += $7 } $1 == "TOTAL" { ti = $6; to = $7 }
    END { print (i == ti && o == to) ? "ok" : i " " o " vs " ti " " to }' "$OUT")
if [ "$sums" = ok ]; then pass "dry run: the rows (the dropped one too) add up to the total"; else fail "dry-run sums: $sums"; fi
size=$(sed -n 's/.*file \([0-9]*\) bytes$/\1/p' "$OUT")
run quantize --to q8_0 --drop weird "$T/tiny.gguf" -o "$T/g8.kvp"
real=$(wc -c <"$T/g8.kvp" | tr -d ' ')
if [ -n "$size" ] && [ "$size" = "$real" ]; then pass "dry-run file size is exact ($real)"; else fail "dry-run size '$size' vs $real"; fi
run quantize -n --to q8_0 --drop weird "$T/tiny.gguf" -o "$T/dry.kvp"
expect_true "--dry-run writes nothing" test ! -e "$T/dry.kvp"
# every row of the plan in the header's 8 columns: the TOTAL row too (it
# was a line of free text), and a name holding a tab or a newline (a cell
# of its own, a row cut in two) with them as spaces, as in the report
mk_st "$T/odd.safetensors" '{"w\tab":{"dtype":"F32","shape":[2,32],"data_offsets":[0,256]},"nl\nx":{"dtype":"F32","shape":[2,32],"data_offsets":[256,512]}}' $ones 0 0 $ones 0 0
# fields_per_row: each line's field count, sorted and counted ("4 8": 4 rows of 8)
fields_per_row() { awk -F'\t' '{ print NF }' "$OUT" | sort | uniq -c | awk '{ printf "%s %s;", $1, $2 }'; }
run quantize -n --to int8 --drop weird "$T/tiny.gguf"
got=$(fields_per_row)
if [ "$got" = "14 8;" ]; then pass "dry run: header, 12 rows and TOTAL, 8 fields each"; else fail "dry-run fields: $got"; fi
run quantize -n --to f16 --drop . "$T/odd.safetensors"
expect_status 0 "a dry run lists dropped tensors of any name"
got=$(fields_per_row)
if [ "$got" = "4 8;" ]; then pass "dry run: a tab or newline in a name keeps its row whole"; else fail "odd-name fields: $got"; fi
expect_out_has "w ab	2x32	F32	dropped	" "the tab shown as a space"
expect_out_has "nl x	2x32	F32	dropped	" "the newline too"
# written, such a name is refused (kvp(5): a name is printable UTF-8): by the
# plan, so the dry run refuses what the conversion would, with one message
# naming the file and the tensor (it said "tensor name holds a control
# character", the dry run planned "2 written")
run quantize -n --to int8 "$T/odd.safetensors"
expect_status 1 "a dry run refuses a name with a tab"
expect_err_has "quantize: $T/odd.safetensors: tensor \"w\\tab\": the name holds a control character (KVP names are printable UTF-8; --drop leaves it out)" \
    "naming the file and the tensor, escaped"
expect_err_one_line "a bad name: one error line"
dry_err=$(cat "$ERR")
run quantize --to int8 "$T/odd.safetensors" -o "$T/odd.kvp"
expect_status 1 "so does the conversion"
expect_true "with the dry run's message" [ "$(cat "$ERR")" = "$dry_err" ]
expect_true "and writes nothing" test ! -e "$T/odd.kvp"
run quantize --to int8 --drop '^w' "$T/odd.safetensors" -o "$T/odd.kvp"
expect_status 1 "the other bad name"
expect_err_has "tensor \"nl\\nx\": the name holds" "named escaped: the message stays one line"
expect_err_one_line "one line"
run quantize --to int8 --drop '^w' --drop '^nl' "$T/odd.safetensors" -o "$T/odd.kvp"
expect_status 0 "both dropped: nothing left to refuse"

# ---- --eval's row in the report: its text's path is a cell as a name is
# (a tab in it added a column, a newline cut the row in two) ----
"$mk" --write-gguf "$T/ctx16.gguf" ctx || fail "could not write the GGUF of a context of 16"
ev=$(printf '%s/ev\tal\nx.txt' "$T")
awk 'BEGIN { for (i = 0; i < 600; i++) printf "abcd" }' >"$ev"
run quantize --to f16 --drop weird "$T/ctx16.gguf" -o "$T/ev16.kvp" --eval "$ev" -r -
expect_status 0 "--eval on a text whose path holds a tab and a newline"
got=$(fields_per_row)
if [ "$got" = "14 12;2 17;" ]; then pass "--eval: its header and row have 17 fields each"; else fail "--eval fields: $got"; fi
expect_true "the path's tab and newline as spaces" grep -q "^$T/ev al x.txt	2400	16	" "$OUT"
expect_err_has "quantize: $T/ev al x.txt: PPL " "and on standard error, one line"
# the TSV row has the JSON object's fields (ppl_ratio_err was JSON's alone),
# in its order: the header's names after "eval" are its keys after "text"
tsv_keys=$(grep '^eval	' "$OUT" | cut -f 2- | tr '\t' ' ')
run quantize --to f16 --drop weird "$T/ctx16.gguf" -o "$T/ev16.kvp" -f --eval "$ev" -r - --json
json_keys=$(tail -n 1 "$OUT" | grep -o '"[a-z_0-9]*":' | tr -d '":' | tail -n +3 | tr '\n' ' ')
if [ "$tsv_keys " = "$json_keys" ]; then pass "--eval: the TSV columns are the JSON fields"; else
    fail "--eval: TSV '$tsv_keys' vs JSON '$json_keys'"; fi
expect_true "the JSON keeps the path whole" grep -qF '{"eval":true,"text":"'"$T"'/ev\tal\nx.txt",' "$OUT"

# ---- the plan's JSON is the report's without the errors: the same fields
# of the same types (its shape was "8x64", a note always there, its summary
# without "fallback"), a scheme as kvdump --json spells it ----
run quantize -n --json --to int4 --asym --drop weird "$T/tiny.gguf"
expect_status 0 "--dry-run --json"
cp "$OUT" "$T/plan.jsonl"
run quantize --json --to int4 --asym --drop weird "$T/tiny.gguf" -o "$T/j4.kvp" -r -
expect_status 0 "--report - --json"
sed 's/,"rmse":[^,]*,"rel_err":[^,]*,"snr_db":[^,]*,"max_abs_err":[^,]*,"clipped":[^,}]*//' "$OUT" >"$T/report-less.jsonl"
expect_true "the report less its errors is the plan, line for line" cmp -s "$T/plan.jsonl" "$T/report-less.jsonl"
expect_true "a fallback's row" grep -qF '{"name":"blk.0.attn_q.weight","shape":[8,64],"from":"q4_1","to":"i4","scheme":"group","group":64,"asymmetric":true,"bytes_in":320,"bytes_out":320,"note":"smaller group: ' "$T/plan.jsonl"
expect_true "a plain tensor's: scheme none, no note" grep -qF '{"name":"blk.0.attn_norm.weight","shape":[64],"from":"f32","to":"f32","scheme":"none","group":0,"bytes_in":256,"bytes_out":256}' "$T/plan.jsonl"
expect_true "the summary counts the fallbacks" grep -q '^{"summary":true,"read":12,"tensors":11,"quantized":7,"fallback":[1-9][0-9]*,"dropped":1,' "$T/plan.jsonl"
# name, shape, scheme and group of every tensor written, as kvdump --json says them
nssg() { sed -n 's/^.*"name":"\([^"]*\)".*"shape":\(\[[0-9,]*\]\).*"scheme":"\([a-z]*\)","group":\([0-9]*\)[,}].*$/\1 \2 \3 \4/p' "$1" | sort; }
run kvdump --json "$T/j4.kvp"
grep '"kind":"tensor"' "$OUT" >"$T/dump.jsonl"
grep -v '"to":"dropped"' "$T/plan.jsonl" >"$T/written.jsonl"
if [ "$(nssg "$T/dump.jsonl")" = "$(nssg "$T/written.jsonl")" ] && [ "$(nssg "$T/dump.jsonl" | wc -l)" -eq 11 ]; then
    pass "quantize --json and kvdump --json: each tensor's shape, scheme and group alike"
else
    fail "quantize vs kvdump: $(nssg "$T/written.jsonl" | head -3) / $(nssg "$T/dump.jsonl" | head -3)"
fi
long=$(printf '%0256d' 0 | tr 0 a)
mk_st "$T/long.safetensors" '{"'"$long"'":{"dtype":"F32","shape":[2,32],"data_offsets":[0,256]}}' $ones 0 0
run quantize -n --to int8 "$T/long.safetensors"
expect_status 1 "a name of 256 bytes"
expect_err_has "long.safetensors: tensor \"aaaaaaaa" "named, quoted"
expect_err_has "...\": name of 256 bytes (KVP allows 1..255)" "cut short, with its length"

run_sh "quantize --to fp8 --zstd=5 --drop weird '$T/tiny.gguf' -o - | kvdump --check -"
expect_status 0 "-o - and --zstd into kvdump --check"

head -c 300 "$T/tiny.gguf" >"$T/trunc.gguf"
run quantize --to int8 "$T/trunc.gguf" -o "$T/t.kvp"
expect_status 1 "truncated GGUF"
expect_err_has "trunc.gguf" "the error names the file"
expect_err_one_line "truncated GGUF: one error line"
# a KVP model cut short: the reader's message (record, offset) with the file's name
head -c $(($(wc -c <"$T/e16.kvp") * 2 / 3)) "$T/e16.kvp" >"$T/e16cut.kvp"
run quantize --to int8 "$T/e16cut.kvp" -o "$T/cut8.kvp"
expect_status 1 "truncated KVP model"
expect_err_has "quantize: $T/e16cut.kvp: record " "the truncated KVP model's file named before its record"
printf 'this is not a model at all' >"$T/garbage.bin"
run quantize --to int8 "$T/garbage.bin" -o "$T/t.kvp"
expect_status 1 "garbage input"
expect_err_has "garbage.bin" "garbage: the error names the file"
expect_true "no output after input errors" test ! -e "$T/t.kvp"
run quantize --to int8 "$T/absent.gguf" -o "$T/t.kvp"
expect_status 1 "missing input"

# atomic output: the write fails part way (file size limit), nothing is left
run_sh "trap '' XFSZ; ulimit -f 2; exec quantize --to f32 --drop weird '$T/tiny.gguf' -o '$T/big.kvp'"
expect_status 1 "a write error fails the conversion"
left=$(ls "$T" | grep -c '^big\.kvp')
if [ "$left" -eq 0 ]; then pass "nothing left under the output name (nor a temporary)"; else fail "left: $(ls "$T" | grep big)"; fi

# ---- --eval on a model of a vocabulary smaller than the 32 saved ----
# (the tiny GGUF of 4 tokens, its context 16): its next-token distributions
# are saved whole, and the text scored with both models
"$mk" --write-gguf "$T/ctx16.gguf" ctx || { status=1; fail "could not write the tiny GGUF (ctx 16)"; }
printf 'abcdabcdbadcabcdacbdabcdddabcabdcabdcbadbcadbcabcda' >"$T/abcd.txt"
run quantize --to f16 --drop weird "$T/ctx16.gguf" -o "$T/ev4.kvp" --eval "$T/abcd.txt" -r "$T/ev4.tsv" \
    --threads $THREADS
expect_status 0 "--eval on a vocabulary of 4 tokens"
expect_err_lacks "full rows" "no advice quantize's user cannot follow"
expect_err_has "abcd.txt: PPL " "the evaluation line"
expect_true "the model is written" test -s "$T/ev4.kvp"
expect_true "the report has the eval row (3 windows of 16, 21 scored)" \
    grep -q "^$T/abcd.txt	51	16	3	21	" "$T/ev4.tsv"

# ---- quantize refuses what decode refuses, with decode's message ----

for fault in bos layers token-type layers2 vocab; do
    "$mk" --write-gguf "$T/bad-$fault.gguf" "$fault" || { status=1; fail "could not write bad-$fault.gguf"; }
    run quantize --to int8 --drop weird "$T/bad-$fault.gguf" -o "$T/bad.kvp"
    expect_status 1 "quantize refuses a GGUF with a bad $fault"
    expect_err_one_line "bad $fault: one error line"
    expect_err_has "bad-$fault.gguf" "bad $fault: the file is named"
    expect_true "bad $fault: no output file" test ! -e "$T/bad.kvp"
    q=$(sed 's/^quantize: //' "$ERR")
    run decode -m "$T/bad-$fault.gguf" -p hi -n 1
    expect_status 1 "decode refuses it too ($fault)"
    d=$(sed 's/^decode: //' "$ERR")
    if [ -n "$q" ] && [ "$q" = "$d" ]; then pass "bad $fault: quantize says what decode says"; else
        fail "bad $fault: quantize '$q', decode '$d'"; fi
done
run quantize --to int8 --drop weird "$T/bad-bos.gguf" -o "$T/bad.kvp"
expect_err_has "tokenizer.ggml.bos_token_id: 4 is outside the vocabulary of 4" "bad bos: the key and the value"
run quantize --to int8 --drop weird "$T/bad-layers.gguf" -o "$T/bad.kvp"
expect_err_has "config: 2147483648 layers (want 1..4096)" "bad layers: the count and the limit"
run quantize --to int8 --drop weird "$T/bad-token-type.gguf" -o "$T/bad.kvp"
expect_err_has "tokenizer.ggml.token_type: want arr[i32] of 4, got arr[i32] of 1" "bad token-type: both lengths"
# tensors that contradict the config: what the loader would refuse, before anything is written
run quantize --to int8 --drop weird "$T/bad-layers2.gguf" -o "$T/bad.kvp"
expect_err_has "tensor blk.1.attn_norm.weight is missing" "2 layers declared, 1 present: the first missing tensor"
run quantize -n --to int8 --drop weird "$T/bad-vocab.gguf"
expect_status 1 "a dry run refuses it too"
expect_err_has "tensor token_embd.weight: shape [64, 4] (2 dims), expected [64, 5]" "vocabulary 5, embedding of 4 rows"
run quantize --to int8 --drop 'weird|ffn_up' "$T/tiny.gguf" -o "$T/bad.kvp"
expect_status 1 "--drop leaving out a weight the loader needs"
expect_err_has "tensor blk.0.ffn_up.weight is missing (--drop left it out)" "says --drop left it out"
expect_true "--drop of a needed weight: no output file" test ! -e "$T/bad.kvp"
# well formed but not an architecture decode runs: converted (kvcalc, kvdump and re-quantizing read it)
"$mk" --write-gguf "$T/gemma2.gguf" gemma2 || { status=1; fail "could not write gemma2.gguf"; }
run quantize --to int8 --drop weird "$T/gemma2.gguf" -o "$T/gemma2.kvp"
expect_status 0 "quantize converts a well-formed model of another architecture"
run decode -m "$T/gemma2.kvp" -p hi -n 1
expect_status 1 "which decode refuses"
expect_err_has "architecture 'gemma2' is not supported" "decode names the architecture"

# ---- output safety ----

run quantize --to int8 --drop weird "$T/tiny.gguf" -o "$T/g4.kvp"
expect_status 1 "an existing output is refused"
expect_err_has "--force" "the refusal says how to overwrite"
run quantize --to int8 --drop weird -f "$T/tiny.gguf" -o "$T/g4.kvp"
expect_status 0 "--force overwrites"
run quantize --to int8 -f "$T/st8.kvp" -o "$T/st8.kvp"
expect_status 2 "the input is never overwritten"

# ---- usage errors ----

run quantize --to int3 "$T/tiny.gguf" -o "$T/u.kvp"
expect_status 2 "unknown --to"
expect_err_has "unknown type 'int3'" "unknown type named"
run quantize --to int4 --group 0 "$T/tiny.gguf" -o "$T/u.kvp"
expect_status 2 "--group 0"
run quantize --to int4 --group 33 "$T/tiny.gguf" -o "$T/u.kvp"
expect_status 2 "odd --group"
run quantize --to q8_0 --scheme channel "$T/tiny.gguf" -o "$T/u.kvp"
expect_status 2 "--scheme with a block type"
run quantize --to int8 --scheme tensor --group 64 "$T/tiny.gguf" -o "$T/u.kvp"
expect_status 2 "--group with --scheme tensor"
# int groups the CPU's int kernels cannot take: converted, with a note
# (a model in them generates about ten times slower)
run quantize -n --to int4 --group 16 --drop weird "$T/tiny.gguf"
expect_status 0 "int4 in groups of 16: converted"
expect_err_has "in groups that are not a multiple of 32 (first: " "a note says they run without the int kernels"
run quantize -n --to int4 --scheme channel --drop weird "$T/tiny.gguf"
expect_err_lacks "not a multiple of 32" "int4 channel scales: no note"
run quantize -n --to int4 --group 32 --drop weird "$T/tiny.gguf"
expect_err_has "(first: blk.0.ffn_down.weight, group 16)" "a group halved to fit a row of 48 counts too"
run quantize -n --to fp8 --group 16 --drop weird "$T/tiny.gguf"
expect_err_lacks "not a multiple of 32" "fp8 groups of 16 (an fp8 kernel takes any group): no note"
run quantize --to fp8 --asym "$T/tiny.gguf" -o "$T/u.kvp"
expect_status 2 "--asym on fp8"
run quantize --to int8 --include '([' "$T/tiny.gguf" -o "$T/u.kvp"
expect_status 2 "a bad regex"
run quantize --to int8 "$T/tiny.gguf"
expect_status 2 "missing -o"
run quantize --to int8
expect_status 2 "missing INPUT"
run quantize --to int8 "$T/tiny.gguf" -o - --report -
expect_status 2 "-o - with --report -"
run quantize --to int8 "$T/tiny.gguf" -o /dev/stdout --report -
expect_status 2 "-o /dev/stdout with --report -: both on standard output"
expect_true "usage errors write nothing" test ! -e "$T/u.kvp"
# the report is written like the model: nothing half-done under its name
run quantize --to f32 "$T/st8.kvp" -o /dev/full --report "$T/rep-new.tsv"
expect_status 1 "a full disk under -o"
expect_err_has "/dev/full" "the full disk named"
expect_true "a failed conversion leaves no report" test ! -e "$T/rep-new.tsv"
echo "the earlier report" >"$T/rep-old.tsv"
run quantize --to f32 "$T/st8.kvp" -o /dev/full --report "$T/rep-old.tsv"
expect_true "a failed conversion keeps the earlier report" grep -qx "the earlier report" "$T/rep-old.tsv"
expect_true "and no temporary report file" sh -c "! ls '$T'/rep-*.tmp.* 2>/dev/null | grep -q ."
run quantize --to f32 "$T/st8.kvp" -o "$T/rep.kvp" --report "$T/rep-old.tsv"
expect_status 0 "a conversion with --report over an earlier one"
expect_true "replaces the earlier report" grep -q "^name	shape" "$T/rep-old.tsv"
# the report and the output never replace the input, a file of the input
# folder or each other, --force or not
cp "$T/st8.kvp" "$T/in8.kvp"
run quantize --to f32 "$T/in8.kvp" -o "$T/o8.kvp" -r "$T/in8.kvp"
expect_status 2 "--report naming the input"
expect_err_has "the report would replace the input" "says why (the report)"
run quantize --to f32 "$T/in8.kvp" -o "$T/o8.kvp" -r "$T/o8.kvp" -f
expect_status 2 "--report naming the output"
expect_err_has "the report would replace the output" "says why"
run quantize --to f32 "$T/in8.kvp" -o "$T/o8.kvp" -r "$T/./o8.kvp"
expect_status 2 "--report naming the output by another path, neither written yet"
run kvdump --check "$T/in8.kvp"
expect_status 0 "the input is intact"
expect_true "and no output was written" test ! -e "$T/o8.kvp"
mkdir "$T/stdir" && cp "$G/config.json" "$G/model.safetensors" "$T/stdir/"
run quantize --to int8 --drop '^step$' "$T/stdir" -o "$T/stdir/model.safetensors" -f
expect_status 2 "-o naming a shard of the input folder"
expect_err_has "a file of the input folder" "says why"
expect_true "the shard is intact" cmp -s "$G/model.safetensors" "$T/stdir/model.safetensors"
run quantize --to int8 --drop '^step$' "$T/stdir" -o "$T/stdir/new.kvp"
expect_status 0 "a new file inside the input folder is fine"
# nor the text --eval scores (through a symlink or standard input too):
# renamed over it at the end, they destroyed it (tests/cli/perplexity.sh
# checks the text is kept, on a model whose --eval succeeds)
printf 'abcdabcdabcdabcdabcd\n' >"$T/ev.txt"
ln -s ev.txt "$T/ev-link.txt"
run quantize --to int8 --drop weird "$T/tiny.gguf" -o "$T/ev.kvp" --eval "$T/ev.txt" -r "$T/ev.txt"
expect_status 2 "--report naming the text --eval scores"
expect_err_has "--report $T/ev.txt is the text scored: write it to another file" "says why"
run quantize --to int8 --drop weird "$T/tiny.gguf" -o "$T/ev.kvp" --eval "$T/ev.txt" -r "$T/ev-link.txt"
expect_status 2 "--report naming it through a symlink"
run quantize --to int8 --drop weird -f "$T/tiny.gguf" -o "$T/ev.txt" --eval "$T/ev.txt"
expect_status 2 "-o naming the text --eval scores, --force or not"
expect_err_has "-o $T/ev.txt is the text scored" "says why (-o)"
run_sh "quantize --to int8 --drop weird -f '$T/tiny.gguf' -o '$T/ev-link.txt' --eval - <'$T/ev.txt'"
expect_status 2 "-o naming the text --eval reads from standard input"
run quantize --to int8 "$T/in8.kvp" -o ""
expect_status 2 "an empty -o"
expect_err_has "empty file name" "says so"
run quantize --to int8 "$T/in8.kvp" -o "$T/e8.kvp" -r ""
expect_status 2 "an empty --report"

# a group below 16 that divides the rows is used, not turned into channels
run quantize -n --to int4 -g 8 "$T/in8.kvp"
expect_status 0 "int4 with groups of 8"
expect_out_has "model.layers.0.mlp.down_proj.weight	8x16	i8	i4	group8	" "groups of 8 kept"
if grep -q "per channel" "$ERR" "$OUT"; then fail "no false fallback note"; else pass "no false fallback note"; fi
# --scheme group without --group: groups of 128 for fp8 and int8 (halved to fit)
run quantize -n --to fp8 -s group "$T/in8.kvp"
expect_status 0 "fp8 --scheme group without --group"
expect_out_has "model.layers.0.mlp.down_proj.weight	8x16	i8	fp8_e4m3	group16	" "a group, not per channel"
run quantize --help
expect_status 0 "--help"
expect_out_has "Usage: quantize" "--help usage line"
run quantize --version
expect_out_has "0.1.0" "--version"

# ---- --kv ----

run_sh "quantize --kv fp8 < '$T/kv.kvp' > '$T/kv8.kvp'"
expect_status 0 "--kv fp8 from stdin to stdout"
run kvdump "$T/kv8.kvp"
expect_out_has "3x8 fp8_e4m3" "KV blocks converted to fp8"
expect_out_lacks " f16 hash" "no f16 KV block left"
expect_out_has "fingerprint 5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a" "stream fingerprint kept"
expect_out_has "kind 77 skipped" "unknown record kinds pass through"
expect_out_has "seq 8 block 0 tokens 16 -> " "block references pass through"
expect_out_has "seq 7 tokens 40 (prompt 40) next 5" "sequences pass through"
run kvdump --check "$T/kv8.kvp"
expect_status 0 "--kv output passes kvdump --check"
run_sh "cat '$T/kv8.kvp' | quantize --kv int8 --report - -o '$T/kvi8.kvp'"
expect_status 0 "--kv int8 through a pipe with --report -"
expect_out_has "to	records	blocks	converted" "KV report header"
expect_out_has "i8	8	3	3	" "KV report row"
run_sh "quantize --kv f16 '$T/kvi8.kvp' | kvdump -"
expect_status 0 "--kv f16 back"
expect_out_has "3x8 f16 hash" "back to f16"
run quantize --kv q4_0 "$T/kv.kvp" -o "$T/kvq.kvp"
expect_status 2 "--kv to a type KV blocks do not take"
run quantize --kv fp8 --to int8 "$T/kv.kvp" -o "$T/kvq.kvp"
expect_status 2 "--kv with --to"
# standard output appended to the input would spoil it as it is read
cp "$T/kv.kvp" "$T/kvself.kvp"
run_sh "quantize --kv int8 '$T/kvself.kvp' -o - >> '$T/kvself.kvp'"
expect_status 2 "--kv -o - appended to its own input is a usage error"
expect_err_has "standard output is $T/kvself.kvp, the input" "says which file"
expect_true "the input is as it was" cmp -s "$T/kv.kvp" "$T/kvself.kvp"
head -c 5000 "$T/kv.kvp" >"$T/kvcut.kvp"
run quantize --kv fp8 "$T/kvcut.kvp" -o "$T/kvq.kvp"
expect_status 1 "--kv on a truncated stream"
expect_err_has "kvcut.kvp" "truncated stream named"
expect_true "--kv failure leaves no output" test ! -e "$T/kvq.kvp"
run quantize --kv fp8 "$T/tiny.gguf" -o "$T/kvq.kvp"
expect_status 1 "--kv on a GGUF file"
expect_err_has "a GGUF file, not a KVP stream: --kv converts the KV blocks" "--kv on GGUF: says what --kv converts"
run quantize --to int8 "$T/kv.kvp" -o "$T/kvq.kvp"
expect_status 1 "a KV stream is not a model"
expect_err_has "use --kv" "the error points at --kv"

# ---- the input on standard input, named again as an output: /dev/stdin,
# /proc/self/fd/0 or a symlink to its file were replaced (the report, or
# under --force the output, renamed over the file being read; exit 0) ----
cp "$T/tiny.gguf" "$T/sin.gguf"
ln -s sin.gguf "$T/sin-link.gguf"
for r in /dev/stdin "$T/sin-link.gguf"; do
    run_sh "quantize --to int8 --drop weird - -o '$T/sin.kvp' -r '$r' <'$T/sin.gguf'"
    expect_status 2 "a model from standard input, --report $r its file"
    expect_err_has "--report $r: the report would replace the input (standard input)" "says why ($r)"
done
for o in /dev/stdin /proc/self/fd/0; do
    [ -e "$o" ] || continue
    run_sh "quantize --to int8 --drop weird -f - -o '$o' <'$T/sin.gguf'"
    expect_status 2 "a model from standard input, -f -o $o its file"
    expect_err_has "-o $o: the output would replace the input (standard input)" "says why (-o $o)"
done
expect_true "the model read from standard input is intact" cmp -s "$T/tiny.gguf" "$T/sin.gguf"
expect_true "and nothing was written" test ! -e "$T/sin.kvp"
cp "$T/kv.kvp" "$T/kvin.kvp"
run_sh "quantize --kv fp8 - -o '$T/kvin8.kvp' -r /dev/stdin <'$T/kvin.kvp'"
expect_status 2 "--kv from standard input, --report /dev/stdin"
expect_err_has "the report would replace the input (standard input)" "says why (--kv --report)"
run_sh "quantize --kv fp8 -f -o /dev/stdin <'$T/kvin.kvp'"
expect_status 2 "--kv from standard input, -f -o /dev/stdin"
expect_err_has "the output would replace the input (standard input)" "says why (--kv -o)"
expect_true "the KV stream read from standard input is intact" cmp -s "$T/kv.kvp" "$T/kvin.kvp"
expect_true "and nothing was written (--kv)" test ! -e "$T/kvin8.kvp"
run_sh "cat '$T/kv.kvp' | quantize --kv fp8 -o '$T/kvpipe8.kvp' -r - >/dev/null"
expect_status 0 "--kv through a pipe with --report - still runs"

# ---- a report that cannot be written fails the run before the output is
# renamed into place (it was renamed first: exit 1 with OUTPUT replaced;
# under --kv the report was not even created until then) ----
no_tmp() { ! ls "$T"/side-* 2>/dev/null | grep -q '\.tmp\.'; }
echo "the earlier model" >"$T/side-old.kvp"
run_sh "quantize --to int8 --drop weird -f '$T/tiny.gguf' -o '$T/side-old.kvp' -r - >/dev/full"
expect_status 1 "--report - on a full disk"
expect_err_has "write failed" "says the report's write failed"
expect_true "the earlier output is kept" grep -qx "the earlier model" "$T/side-old.kvp"
run_sh "quantize --to int8 --drop weird '$T/tiny.gguf' -o '$T/side-new.kvp' -r - >/dev/full"
expect_status 1 "--report - on a full disk, a new output"
expect_true "no output" test ! -e "$T/side-new.kvp"
run quantize --to int8 --drop weird "$T/tiny.gguf" -o "$T/side-dev.kvp" -r /dev/full
expect_status 1 "--report /dev/full (a device: written in place)"
expect_true "no output (--report /dev/full)" test ! -e "$T/side-dev.kvp"
echo "the earlier stream" >"$T/side-old8.kvp"
run_sh "quantize --kv fp8 -f '$T/kv.kvp' -o '$T/side-old8.kvp' -r - >/dev/full"
expect_status 1 "--kv, --report - on a full disk"
expect_true "the earlier --kv output is kept" grep -qx "the earlier stream" "$T/side-old8.kvp"
run quantize --kv fp8 "$T/kv.kvp" -o "$T/side-new8.kvp" -r /dev/full
expect_status 1 "--kv, --report /dev/full"
expect_true "no --kv output (--report /dev/full)" test ! -e "$T/side-new8.kvp"
run quantize --kv fp8 "$T/kv.kvp" -o "$T/side-nodir8.kvp" -r "$T/no-such-dir/r.tsv"
expect_status 1 "--kv, a report in a folder that is not there"
expect_err_has "no-such-dir/r.tsv: cannot create" "says which report"
expect_err_one_line "one line"
expect_true "no --kv output (a report that cannot be created)" test ! -e "$T/side-nodir8.kvp"
expect_true "no temporary files left" no_tmp
run quantize --kv fp8 "$T/kv.kvp" -o "$T/side-ok8.kvp" -r "$T/side-ok8.tsv"
expect_status 0 "--kv with a report file"
expect_true "both written" sh -c "test -s '$T/side-ok8.kvp' && grep -q ^fp8_e4m3 '$T/side-ok8.tsv'"

# ---- --drop repeats: each adds a pattern, a tensor any of them matches is
# dropped (the last one alone was kept: step, I64, then stopped the run) ----
# dropped_rows: the names a dry-run plan lists as dropped, sorted, on one line
dropped_rows() { awk -F'\t' '$4 == "dropped" { print $1 }' "$OUT" | sort | tr '\n' ' '; }
want_dropped="model.layers.0.input_layernorm.weight model.layers.0.post_attention_layernorm.weight model.norm.weight step "
for order in "^step\$ norm" "norm ^step\$"; do
    set -- $order
    run quantize -n --to f16 --drop "$1" --drop "$2" "$T/lone/model.safetensors"
    expect_status 0 "--drop '$1' --drop '$2': both apply"
    got=$(dropped_rows)
    if [ "$got" = "$want_dropped" ]; then pass "--drop '$1' --drop '$2': step and the three norms dropped"; else
        fail "--drop '$1' --drop '$2' dropped '$got', wanted '$want_dropped'"; fi
    expect_out_has "TOTAL	12 tensors read: 8 written (" "--drop '$1' --drop '$2': 8 written"
    expect_out_has ", 4 dropped	" "--drop '$1' --drop '$2': 4 dropped"
    expect_err_lacks "matched no tensor" "--drop '$1' --drop '$2': each matched, no note"
done
# a tensor two patterns match is dropped once; the written file lacks all four
run quantize --to f16 --drop '^step$' --drop norm --drop 'layernorm' "$T/lone/model.safetensors" -o "$T/drop3.kvp"
expect_status 0 "three --drop patterns, two overlapping"
run kvdump --summary "$T/drop3.kvp"
expect_out_has "tensor     8" "8 tensors written"
run kvdump "$T/drop3.kvp"
expect_out_lacks "norm" "no norm in the output"
run quantize --help
expect_out_has "repeatable" "--help says --drop repeats"

# ---- a --drop that matches no tensor is noted (a typo went unnoticed), the
# exit status unchanged ----
run quantize -n --to f16 --drop '^w33$' "$T/bare.safetensors"
expect_status 0 "one --drop that matches nothing: exit 0"
expect_err_has "quantize: note: --drop '^w33\$' matched no tensor" "a note names it"
expect_out_has ", 0 dropped	" "and nothing is dropped"
run quantize -n --to f16 --drop weird --drop 'blk\.0\.wierd' "$T/tiny.gguf"
expect_status 0 "a --drop that matches nothing: still exit 0 (dry run)"
expect_err_has "quantize: note: --drop 'blk\.0\.wierd' matched no tensor" "the dry run names the pattern"
expect_err_lacks "--drop 'weird'" "only the pattern that matched nothing is noted"
expect_out_has ", 1 dropped	" "the other pattern still drops its tensor"
run quantize --to f16 --drop weird --drop lora_ "$T/tiny.gguf" -o "$T/nomatch.kvp"
expect_status 0 "a --drop that matches nothing: still exit 0 (conversion)"
expect_err_has "quantize: note: --drop 'lora_' matched no tensor" "the conversion names the pattern"
expect_true "the output is written" test -s "$T/nomatch.kvp"
run quantize -n --to f16 --drop '^step$' --drop '^model\.norm\.weight ' --drop 'nothing|neither' "$T/lone/model.safetensors"
expect_status 0 "two patterns that match nothing"
expect_err_has "quantize: note: --drop '^model\.norm\.weight ' matched no tensor" "the first named"
expect_err_has "quantize: note: --drop 'nothing|neither' matched no tensor" "the second named"
expect_true "one note each, nothing else" [ "$(grep -c 'matched no tensor' "$ERR")" = 2 ]

# ---- -i and -x repeat as --drop does: each adds a pattern; a tensor any
# --include pattern matches is converted, one any --exclude pattern matches
# is kept (the last one alone applied, the others silently not) ----
# converted_rows: the names a dry-run plan converts to i8, sorted, on one line
converted_rows() { awk -F'\t' '$4 == "i8" { print $1 }' "$OUT" | sort | tr '\n' ' '; }
# expect_converted WANT DESC: the dry run's converted rows are WANT
expect_converted() {
    got=$(converted_rows)
    if [ "$got" = "$1" ]; then pass "$2"; else fail "$2: converted '$got', wanted '$1'"; fi
}
L="$T/lone/model.safetensors" a=model.layers.0.self_attn m=model.layers.0.mlp
for order in "q_proj k_proj" "k_proj q_proj"; do
    set -- $order
    run quantize -n --to int8 --drop '^step$' -i "$1" --include "$2" "$L"
    expect_status 0 "-i '$1' --include '$2'"
    expect_converted "$a.k_proj.weight $a.q_proj.weight " "-i '$1' --include '$2': both converted"
    expect_out_has "TOTAL	12 tensors read: 11 written (2 converted), 1 dropped	" "-i '$1' --include '$2': 2 converted"
    expect_err_lacks "matched no tensor" "-i '$1' --include '$2': each matched, no note"
done
for order in "mlp q_proj" "q_proj mlp"; do
    set -- $order
    run quantize -n --to int8 --drop '^step$' -x "$1" --exclude "$2" "$L"
    expect_status 0 "-x '$1' --exclude '$2'"
    expect_converted "$a.k_proj.weight $a.o_proj.weight $a.v_proj.weight " "-x '$1' --exclude '$2': both kept"
    expect_out_has "11 written (3 converted)" "-x '$1' --exclude '$2': 3 converted"
done
# both lists: converted what an include selects and no exclude keeps
run quantize -n --to int8 --drop '^step$' -i self_attn -i gate_proj -x '[qk]_proj' -x v_proj "$L"
expect_status 0 "two -i and two -x"
expect_converted "$m.gate_proj.weight $a.o_proj.weight " "two -i and two -x: gate and o converted"
# written as planned
run quantize --to int8 --drop '^step$' -i q_proj -i k_proj "$L" -o "$T/incl2.kvp"
expect_status 0 "two -i on a real write"
run kvdump "$T/incl2.kvp"
expect_out_has "$a.q_proj.weight i8 " "q_proj written as i8"
expect_out_has "$a.k_proj.weight i8 " "k_proj written as i8"
expect_out_has "$a.o_proj.weight f16 " "o_proj kept f16"
expect_out_has "$m.up_proj.weight bf16 " "up_proj kept bf16"

# ---- an -i or -x pattern that matches no tensor is noted, as --drop's is;
# the exit status unchanged ----
run quantize -n --to int8 --drop '^step$' -i q_proj -i 'k_porj' -x nothing -x mlp "$L"
expect_status 0 "-i and -x that match nothing: exit 0"
expect_err_has "quantize: note: --include 'k_porj' matched no tensor" "the --include named"
expect_err_has "quantize: note: --exclude 'nothing' matched no tensor" "the --exclude named"
expect_true "one note each, nothing else" [ "$(grep -c 'matched no tensor' "$ERR")" = 2 ]
expect_converted "$a.q_proj.weight " "the patterns that matched still apply"
run quantize -n --to int8 --drop '^step$' -i 'q-proj' "$L"
expect_status 0 "an --include that matches nothing: exit 0"
expect_err_has "quantize: note: --include 'q-proj' matched no tensor" "noted: it converts nothing"
expect_out_has "11 written (0 converted)" "nothing converted"
# a pattern is tried on every tensor read: one that matches only a dropped
# tensor or a norm matched a name, and is not noted
run quantize -n --to int8 --drop '^step$' -x '^step$' -x 'model\.norm' -i 'layernorm' -i proj "$L"
expect_status 0 "-x and -i matching a dropped tensor and norms"
expect_err_lacks "matched no tensor" "no note for them"
run quantize --to f16 --drop weird -x lora_ "$T/tiny.gguf" -o "$T/xnote.kvp"
expect_status 0 "an --exclude that matches nothing: still exit 0 (conversion)"
expect_err_has "quantize: note: --exclude 'lora_' matched no tensor" "the conversion names it"
expect_true "the output is written" test -s "$T/xnote.kvp"
run quantize --help
expect_out_has "-i, -x and --drop are repeatable" "--help says -i and -x repeat too"

# ---- the real model (SmolLM2-135M-Instruct Q4_1), when cached ----

# ---- a model through a pipe: /dev/stdin opened by name, as a FIFO or
# <(cat f) is: the magic read to tell the format must not be lost ----
run_sh "cat '$T/tiny.gguf' | quantize --to q8_0 --drop weird /dev/stdin -o '$T/piped.kvp'"
expect_status 0 "a GGUF through a pipe converts"
expect_err_lacks "bad magic" "its magic is not lost to the format check"
run kvdump "$T/piped.kvp"
kvdump "$T/g8.kvp" >"$T/g8.txt" 2>/dev/null
expect_out_file "$T/g8.txt" "the same records as from the file"
run_sh "cat '$T/g8.kvp' | quantize --to q8_0 /dev/stdin -o '$T/piped2.kvp'"
expect_status 1 "a KVP model through a pipe is refused (converting reads it twice)"
expect_err_has "/dev/stdin: not a regular file: a KVP model is read twice" "naming the file and why"
expect_err_one_line "a KVP model through a pipe: one error line"
run_sh "cat '$G/model.safetensors' | quantize --to f16 /dev/stdin -o '$T/piped3.kvp'"
expect_status 1 "safetensors through a pipe is refused"
expect_err_has "/dev/stdin: neither GGUF nor KVP, and not a regular file" "naming the file and why"
run_sh "cat '$T/g8.kvp' | kvcalc -m /dev/stdin --json"
expect_status 0 "kvcalc reads a KVP model through a pipe"
expect_out_has '"source":"kvp"' "as KVP"
run_sh "cat '$T/tiny.gguf' | kvcalc -m /dev/stdin --json"
expect_status 0 "kvcalc reads a GGUF through a pipe"
run_sh "cat '$G/config.json' | kvcalc -m /dev/stdin --json"
expect_status 0 "kvcalc reads a config.json through a pipe"

M="$KVP_MODEL"
if [ ! -f "$M" ]; then
    echo "note: $M absent (scripts/fetch-model): SmolLM2 conversions skipped"
else
    for to in q8_0 int8 fp8 int4 nvfp4 mxfp4; do
        run quantize --to "$to" "$M" -o "$T/m.kvp" --report "$T/r-$to.tsv"
        expect_status 0 "SmolLM2 Q4_1 to $to"
        run kvdump --check "$T/m.kvp"
        expect_status 0 "kvdump --check accepts SmolLM2 $to"
        size=$(wc -c <"$T/m.kvp" | tr -d ' ')
        snr=$(awk -F'\t' '$1 == "TOTAL" { print $10 }' "$T/r-$to.tsv")
        eval "snr_$to=\$snr"
        echo "note: SmolLM2-135M $to: $size bytes, weighted SNR $snr dB"
        rm -f "$T/m.kvp"
    done
    # the SNR ordering: 8-bit integers > fp8 > 4-bit formats
    sane=$(awk -v q8="$snr_q8_0" -v i8="$snr_int8" -v f8="$snr_fp8" -v i4="$snr_int4" -v nv="$snr_nvfp4" \
        -v mx="$snr_mxfp4" 'BEGIN { print (q8 > f8 && i8 > f8 && f8 > i4 && f8 > nv && f8 > mx && i4 > 10 && mx > 10) ? 1 : 0 }')
    if [ "$sane" = 1 ]; then pass "SNR ordering int8/q8_0 > fp8 > int4/fp4"; else
        fail "SNR ordering: q8_0 $snr_q8_0 int8 $snr_int8 fp8 $snr_fp8 int4 $snr_int4 nvfp4 $snr_nvfp4 mxfp4 $snr_mxfp4"; fi
    head -c 100000 "$M" >"$T/trunc-m.gguf"
    run quantize --to int8 "$T/trunc-m.gguf" -o "$T/t.kvp"
    expect_status 1 "truncated SmolLM2 GGUF"
    expect_err_has "trunc-m.gguf" "truncated SmolLM2: file named"
fi

done_testing
