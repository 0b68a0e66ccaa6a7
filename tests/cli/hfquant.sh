#!/bin/sh
# hfquant.sh - quantized HF checkpoints (GPTQ, AWQ, compressed-tensors) through
# the programs: quantize says what it found and did and keeps or converts
# them, the same weights in three layouts give the same f32 bytes, kvcalc
# takes its weight format from quantization_config, and a bad one is refused
# naming the field.  Goldens: tests/golden/engine_hfquant (gen_engine_hfquant.py).
. "$(dirname "$0")/lib.sh"
G=${KVP_TESTS:-tests}/golden/engine_hfquant

# ---- quantize: kept as imported, with a note saying what was done ----
run quantize "$G/ct_w8a8_int8" -o "$T/w8.kvp"
expect_status 0 "an int8 compressed-tensors checkpoint converts"
expect_err_has "compressed-tensors naive-quantized int8 channel" "the note names the scheme"
expect_err_has "activations int8 dynamic token" "and the activations it does not apply"
expect_err_has "14 weights used in place" "and says the codes are used in place"
run kvdump --json "$T/w8.kvp"
expect_out_has '"name":"model.layers.1.mlp.down_proj.weight","dtype":"i8"' "the weight is one i8 tensor"
expect_out_lacks 'weight_scale' "its scales are no tensor of their own"
run quantize "$G/gptq_desc_act" -o "$T/gptq.kvp"
expect_status 0 "a GPTQ desc_act checkpoint converts"
expect_err_has "14 dequantized to f32 (g_idx order; exact)" "the note says what a g_idx order costs"

# ---- the same codes as compressed-tensors, GPTQ (desc_act) and AWQ: the same f32 weights ----
for c in ct_w4a16_g32 gptq_desc_act awq_g32; do
    run quantize --to f32 "$G/$c" -o "$T/$c.f32.kvp"
    expect_status 0 "$c to f32"
    run kvdump --extract model.layers.1.self_attn.o_proj.weight "$T/$c.f32.kvp"
    cp "$OUT" "$T/$c.o_proj.bin"
done
expect_true "GPTQ's weights equal compressed-tensors' bit for bit" cmp -s "$T/ct_w4a16_g32.o_proj.bin" "$T/gptq_desc_act.o_proj.bin"
expect_true "AWQ's weights equal compressed-tensors' bit for bit" cmp -s "$T/ct_w4a16_g32.o_proj.bin" "$T/awq_g32.o_proj.bin"
expect_true "64x64 f32 values" test "$(wc -c <"$T/awq_g32.o_proj.bin")" -eq 16384
run quantize --to int8 "$G/awq_g32" -o "$T/awq8.kvp" --report -
expect_status 0 "an AWQ checkpoint requantizes to int8"
expect_out_has "model.layers.0.mlp.up_proj.weight	96x64	i4	i8	channel" "from its i4 groups"

# ---- kvcalc: the linear layers' format from quantization_config ----
jf() { sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" "$OUT" | head -n 1; }
for c in ct_w4a16_g32:int4-g32 gptq_desc_act:int4-g32 awq_g32:int4-g32 ct_w8a8_int8:int8 ct_fp8_channel:fp8; do
    run kvcalc --model "$G/${c%%:*}" --json
    expect_status 0 "kvcalc reads ${c%%:*}"
    v=$(jf weight_dtype)
    expect_true "${c%%:*}: weights ${c#*:} (got $v)" test "$v" = "\"${c#*:}\""
done
run kvcalc --model "$G/ct_w4a16_g32" --json
w4=$(jf weight_bytes)
run kvcalc --model "$G/ct_w8a8_int8" --json
w8=$(jf weight_bytes)
run kvcalc --model "$G/ct_w4a16_g32" --weight-dtype bf16 --json
w16=$(jf weight_bytes)
expect_true "int4 < int8 < bf16 weight bytes ($w4, $w8, $w16)" test "$w4" -lt "$w8" -a "$w8" -lt "$w16"

# ---- bad quantization_config: refused by every reader, naming the field ----
mkdir -p "$T/bad"
cp "$G/gptq_desc_act/model.safetensors" "$T/bad/"
sed 's/"bits": 4/"bits": 3/' "$G/gptq_desc_act/config.json" >"$T/bad/config.json"
run quantize "$T/bad" -o "$T/bad.kvp"
expect_status 1 "3-bit GPTQ is refused by quantize"
expect_err_has "config.json: quantization_config.bits: 3 bits (4 or 8 are supported)" "naming the file and field"
expect_err_one_line "in one line"
run kvcalc --model "$T/bad"
expect_status 1 "and by kvcalc"
expect_err_has "quantization_config.bits" "naming the field"
sed 's/"quant_method": "gptq"/"quant_method": "hqq"/' "$G/gptq_desc_act/config.json" >"$T/bad/config.json"
run quantize "$T/bad" -o "$T/bad.kvp"
expect_status 1 "an unknown method is refused"
expect_err_has "quant_method: 'hqq' is not supported (compressed-tensors, gptq, awq)" "naming it and the choices"
sed 's/"group_size": 32/"group_size": 16/' "$G/gptq_desc_act/config.json" >"$T/bad/config.json"
run quantize "$T/bad" -o "$T/bad.kvp"
expect_status 1 "scales that do not match the group size are refused"
expect_err_has "model.layers.0.mlp.down_proj.scales: shape [3, 64]" "naming the tensor and its shape"
expect_true "nothing written" test ! -e "$T/bad.kvp"

# ---- SmolLM2 quantized by llm-compressor (scripts/ref/make_smollm2_ct.py), when cached ----
CT=${KVPIPE_CACHE:-$HOME/.cache/kvpipe}/smollm2-ct
for s in w4a16-g64 w8a8-int8 fp8; do
    if [ ! -f "$CT/$s/model.safetensors" ]; then
        echo "note: $CT/$s absent (scripts/ref/make_smollm2_ct.py): its decode check skipped"
        continue
    fi
    run decode -m "$CT/$s" -t $THREADS --chat -p "What is the capital of France?" -n 40
    expect_status 0 "decode runs SmolLM2 $s"
    expect_out_has "Paris" "and SmolLM2 $s knows the capital of France"
done

done_testing
