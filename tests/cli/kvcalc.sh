# kvcalc.sh - the capacity planner end to end: the figures the issue names,
# every model family, splits, sweeps, the fragmentation simulator, and usage
# errors.  Expected numbers are worked out in the comments.
. "$KVP_TESTS/cli/lib.sh"

# jf NAME: the value of "NAME": in the first JSON line of stdout
jf() { sed -n '1s/.*"'"$1"'":\([^,}]*\).*/\1/p' "$OUT"; }
# tensor_bytes FILE: the data and scales bytes of a KVP file's tensors, as kvdump lists them
tensor_bytes() {
    kvdump --json "$1" | sed -n 's/.*"kind":"tensor".*"data_bytes":\([0-9]*\),"scales_bytes":\([0-9]*\).*/\1 \2/p' |
        awk '{ n += $1 + $2 } END { print n }'
}
expect_field() { # NAME VALUE DESC
    v=$(jf "$1")
    if [ "$v" = "$2" ]; then pass "$3"; else fail "$3 ($1 is '$v', wanted $2)"; fi
}

run kvcalc --help
expect_status 0 "--help exits 0"
expect_out_has "Usage: kvcalc" "--help prints the usage"
run kvcalc --version
expect_status 0 "--version exits 0"
expect_out_has "kvcalc (kvpipe)" "--version names the program"

# ---- the issue's figures: Llama-3-70B, 4096 tokens, batch 1, fp16 ----
run kvcalc --model llama-3-70b --seq-len 4096 --batch 1 --kv-dtype f16 --json
expect_status 0 "llama-3-70b json"
expect_field kv_bytes 1342177280 "Llama-3-70B: 1,342,177,280 KV bytes with its 8 KV heads"
expect_field kv_bytes_per_token 327680 "Llama-3-70B: 327,680 bytes a token"
# counting all 64 query heads as KV heads: 8x over 80 layers
run kvcalc --model llama-3-70b --seq-len 4096 --kv-heads 64 --json
expect_field kv_bytes 10737418240 "--kv-heads 64: 10,737,418,240 bytes (8x the GQA figure)"
# the often-quoted 4,294,967,296 is 64 heads over 32 layers (2 x 64 x 128 x 2 x 32 x 4096)
run kvcalc --model llama-3-70b --seq-len 4096 --kv-heads 64 --layers 32 --json
expect_field kv_bytes 4294967296 "--kv-heads 64 --layers 32: 4,294,967,296"
run kvcalc --model llama-3-70b --seq-len 4096 --kv-heads 64 --layers 32 --batch 128 --json
expect_field kv_bytes 549755813888 "... and 549,755,813,888 at batch 128"

# ---- bytes per token, each family ----
run kvcalc -m smollm2-135m --json
expect_field kv_bytes_per_token 23040 "SmolLM2-135M preset: 23,040 B/token"
gguf="$KVP_MODEL"
if [ -f "$gguf" ]; then
    run kvcalc -m "$gguf" --json
    expect_status 0 "SmolLM2 GGUF reads"
    expect_field kv_bytes_per_token 23040 "SmolLM2 from its GGUF: 23,040 B/token"
    expect_field source '"gguf"' "the GGUF is named as the source"
    expect_field weight_dtype '"q4_1"' "its weights are Q4_1"
    # Q4_1 matrices 30 x 3,538,944 / 32 x 20 + Q8_0 embeddings 28,311,552 / 32 x 34 + f32 norms 61 x 576 x 4
    expect_field weight_bytes 96576768 "its weight bytes are the tensors' exact bytes"
    # The same model as a KVP file: the same parameters (tied: no lm_head
    # tensor; an untied count was 0.163 B), and weight bytes the tensors'
    # own, compressed or not (it said f16, 325.65 MB, for 143 MB of q8_0).
    want_params=$(jf n_params)
    run quantize --to q8_0 "$gguf" -o "$T/q8.kvp"
    expect_status 0 "quantize --to q8_0 the GGUF"
    run quantize --to q8_0 --zstd "$gguf" -o "$T/q8z.kvp"
    expect_status 0 "... and once compressed"
    for f in q8.kvp q8z.kvp; do
        run kvcalc -m "$T/$f" --json
        expect_status 0 "$f reads"
        expect_field n_params "$want_params" "$f: the GGUF's parameter count"
        expect_field weight_dtype '"q8_0"' "$f: its weights are q8_0"
        expect_field weight_bytes "$(tensor_bytes "$T/q8.kvp")" "$f: weight bytes are its tensors' bytes"
    done
else
    echo "note: $gguf absent (make fetch-model): GGUF check skipped"
fi
# ---- KVP model files (quantize's output): read to the end, tensors skimmed ----
G=${KVP_TESTS:-tests}/golden
run quantize --to f32 --drop '^step$' "$G/tiny-st" -o "$T/tiny.kvp"
expect_status 0 "a tiny KVP model file to read"
run kvcalc -m "$T/tiny.kvp" --json
expect_status 0 "a KVP model file reads"
expect_field source '"kvp"' "the KVP file is named as the source"
# its weights are its tensors' own bytes: an embedding format given alone
# would change the label, not the bytes ("embeddings f32" at the file's)
run kvcalc -m "$T/tiny.kvp" --embed-dtype f32
expect_status 2 "--embed-dtype on a KVP file's own tensors exits 2"
expect_err_has "--embed-dtype: $T/tiny.kvp's weights are its tensors' own bytes (embeddings f32): give --weight-dtype too" \
    "and says why and what to give"
expect_out_empty "nothing planned"
run kvcalc -m "$T/tiny.kvp" --weight-dtype f32 --json
w32=$(jf weight_bytes)
run kvcalc -m "$T/tiny.kvp" --weight-dtype f32 --embed-dtype f16 --json
expect_status 0 "with --weight-dtype it plans"
w8=$(jf weight_bytes)
expect_true "and the embeddings' format changes the bytes ($w32 then $w8)" sh -c '[ -n "$1" ] && [ "$1" -lt "$2" ]' _ "$w8" "$w32"
size=$(wc -c <"$T/tiny.kvp")
for cut in 1000 $((size / 2)) $((size - 64)); do
    head -c "$cut" "$T/tiny.kvp" >"$T/cut.kvp"
    run kvcalc -m "$T/cut.kvp" --json
    expect_status 1 "a KVP model file cut at $cut of $size bytes is refused"
    expect_true "the error names the file and calls it cut short" grep -Eq "cut\.kvp: .*(cut short|truncated)" "$ERR"
done
# HF models beside their KVP conversions: tying from the lm_head tensor
# (lm_head.weight under HF names), bytes from the tensors, zstd or not
for m in gqa2_hd64_untied gqa1_hd32_tied; do
    run kvcalc -m "$G/engine_hf/$m" --json
    want_params=$(jf n_params)
    for z in "" --zstd; do
        f="$T/$m$z.kvp"
        run quantize --to q8_0 $z "$G/engine_hf/$m" -o "$f"
        expect_status 0 "$m: quantize --to q8_0 $z"
        run kvcalc -m "$f" --json
        expect_status 0 "$m$z.kvp reads"
        expect_field n_params "$want_params" "$m$z.kvp: the HF config's parameter count"
        expect_field weight_bytes "$(tensor_bytes "$f")" "$m$z.kvp: weight bytes are its tensors' bytes"
        expect_field weight_dtype '"q8_0"' "$m$z.kvp: q8_0, the format of most matrix bytes"
    done
done
run kvcalc -m "$T/gqa2_hd64_untied.kvp"
expect_out_has "0.000 B params; weights q8_0" "the report names the tensors' format"
# the layers' matrices name the format, not the 16-bit embeddings quantize
# keeps (in a small model they outweigh a 4-bit layer's bytes), and fp4
# (E2M1 with a scale a group of 32) has a name of its own
run quantize --to fp4 "$G/engine_hf/gqa2_hd64_untied" -o "$T/fp4.kvp"
run kvcalc -m "$T/fp4.kvp" --json
expect_field weight_dtype '"fp4-g32"' "fp4 layers: fp4-g32"
run kvcalc -m "$T/fp4.kvp"
expect_out_has "; weights fp4-g32 (embeddings bf16), KV f16" "the file's embeddings named as stored"
run kvcalc -m llama-3-8b --weight-dtype fp4-g32 --json
expect_status 0 "--weight-dtype fp4-g32"
# the embeddings' format, where it is not the matrices', is named beside it
run kvcalc -m llama-3-8b --embed-dtype fp4
expect_out_has "; weights f16 (embeddings, head and norms nvfp4), KV f16" "--embed-dtype fp4: named in the report"
run kvcalc -m llama-3-8b --weight-dtype int4
expect_out_has "; weights int4-g128 (embeddings, head and norms bf16), KV" "int4 weights: the bf16 embeddings named"
run kvcalc -m llama-3-8b
expect_out_has "; weights f16, KV f16" "all f16: one format named"

run kvcalc -m deepseek-v3 --json
expect_field kv_bytes_per_token 70272 "DeepSeek-V3 MLA: (512 + 64) x 61 x 2 = 70,272"
run kvcalc -m qwen2.5-7b --json
expect_field kv_bytes_per_token 57344 "Qwen2.5-7B: 2 x 4 x 128 x 2 x 28"
run kvcalc -m llama-3.1-405b --json
expect_field kv_bytes_per_token 516096 "Llama-3.1-405B: 2 x 8 x 128 x 2 x 126"
run kvcalc -m llama-3-8b --kv-heads 1 --json
expect_field kv_bytes_per_token 16384 "MQA: 2 x 1 x 128 x 2 x 32"
# sliding windows: Mistral stops at 4096 tokens; Gemma-2 on alternate layers
run kvcalc -m mistral-7b -s 8192 --gpu h100 --json
expect_field kv_bytes_per_seq 536870912 "Mistral-7B at 8192 tokens holds 4096: 131,072 x 4096"
expect_field max_context null "a sliding-only model's context is unbounded"
# ... for one sequence; 113 do not fit at 4097 tokens (their windows span
# 257 blocks, 256 at 4096), so theirs is not ("unbounded" sat above "a
# batch of 113 does not fit")
run kvcalc -m mistral-7b -g h100 -s 4097 -b 113
expect_out_has "longest context for 113 sequences: 4096 tokens" "113 of Mistral-7B: every length to 4096 fits"
expect_out_has "a batch of 113 does not fit" "... and 4097 does not"
expect_out_lacks "unbounded" "no unbounded context for a batch that does not fit"
# Gemma-2-9B fits 1 at 323,888 and 323,904 tokens, none between: the
# longest context is the one every shorter length fits (it said 323,904)
for s in 323888 323889 323903 323904; do
    run kvcalc -m gemma-2-9b -g h100 -s $s --json
    expect_field max_context 323888 "Gemma-2-9B at $s tokens: the longest context is 323,888"
done
# a model with no windows in memory for more than 2^32 tokens: every
# length planned fits, which is not unbounded, nor windows
run kvcalc -m smollm2-135m --gpu-mem 200TB
expect_out_has "longest context for 1 sequence: at least 4294967296 tokens" "SmolLM2 in 200 TB: at least 2^32 tokens"
expect_out_lacks "sliding windows" "and no windows named"
run kvcalc -m smollm2-135m --gpu-mem 200TB --json
expect_field max_context 4294967296 "its JSON max_context is 2^32, not null"
run kvcalc -m mistral-7b -g h100 -b 1
expect_out_has "longest context for 1 sequence: unbounded (sliding windows on every layer" "one sequence, not 'sequences'"
run kvcalc -m gemma-2-9b -s 8192 --json
expect_field kv_bytes_per_seq 2113929216 "Gemma-2-9B: 21 x 8192 x 8192 + 21 x 8192 x 4096"
# MoE: all experts' weights, attention-only KV
run kvcalc -m mixtral-8x7b --json
expect_field weight_bytes 93405585408 "Mixtral-8x7B f16 weights: 2 x 46,702,792,704"
expect_field kv_bytes_per_token 131072 "Mixtral KV as a dense 32-layer GQA model"
expect_field n_params_active 12879925248 "Mixtral active params 12.9B"
# KV formats
# fp8 and int8 as decode's cache holds them: a byte an element, and an f32
# scale per head (16 K and V) per layer (32) per token: 65536 + 2048
run kvcalc -m llama-3-8b --kv-dtype fp8 --json
expect_field kv_bytes_per_token 67584 "fp8 KV halves the bytes, plus its scales"
run kvcalc -m llama-3-8b --kv-dtype int8 -s 4096 --json
expect_field kv_alloc_bytes_per_seq 276824064 "int8 KV counts its per-token scales"
# int4: half a byte an element, an f32 scale per head per layer per block (256)
run kvcalc -m llama-3-8b --kv-dtype int4 -s 4096 --json
expect_field kv_alloc_bytes_per_seq 134742016 "int4 KV counts its per-block scales"

# ---- splits ----
run kvcalc -m llama-3-70b --gpu h100 --tp 4 -s 4096 --json
expect_field kv_heads_per_gpu 2 "tp 4: 2 of 8 KV heads a GPU"
expect_field kv_bytes_per_token_per_gpu 81920 "tp 4: a quarter of the KV"
expect_field gpus 4 "tp 4 alone means 4 GPUs"
run kvcalc -m llama-3-70b --gpu h100 --tp 16 -s 4096 --json
expect_field kv_heads_per_gpu 1 "tp 16 > 8 KV heads: one head a GPU, replicated"
expect_field kv_bytes_per_token_per_gpu 40960 "tp 16: per-GPU KV stops shrinking at one head"
run kvcalc -m llama-3-70b --gpu h100 --gpus 8 -s 4096 --json
expect_field tp 8 "--gpus 8 alone: tp 8"
run kvcalc -m llama-3-70b --gpu h100 --tp 2 --gpus 8 -s 4096 --json
expect_field replicas 4 "tp 2 on 8 GPUs: 4 replicas"
run kvcalc -m llama-3-70b --gpu h200 --pp 2 -s 4096 --json
expect_out_has '"stages":[{"layer_begin":0,"layer_end":40' "pp 2: stages of 40 layers"
expect_field kv_bytes_per_token_per_gpu 163840 "pp 2: half the layers' KV a GPU"
# ---- blocks ----
run kvcalc -m llama-3-8b -s 1000 --json
expect_field kv_alloc_bytes_per_seq 132120576 "1000 tokens take 63 blocks of 16 = 1008 tokens"
expect_field kv_waste_bytes_per_seq 1048576 "8 empty slots x 131,072"
run kvcalc -m llama-3-8b -s 1000 --block-size 256 --json
expect_field kv_alloc_bytes_per_seq 134217728 "block 256: 1024 tokens"

# ---- the README question: 8k conversations, H200, Llama-3-8B fp8 weights and KV ----
run kvcalc --model llama-3-8b --gpu h200 --weight-dtype fp8 --kv-dtype fp8 --seq-len 8192 --json
expect_status 0 "the README one-liner runs"
expect_field max_seqs 225 "225 conversations of 8k tokens fit (an fp8 scale per head per token)"
expect_field fits true "it fits"
run kvcalc --model llama-3-8b --gpu h200 --weight-dtype fp8 --kv-dtype fp8 --seq-len 8192
expect_out_has "sequences of 8192 tokens at once: 225" "the report says so in words"
expect_out_has "GiB" "the report gives GiB"
# the README shows the end of this very report: it must be what the program prints
readme="$KVP_TESTS/../README.md"
if [ -f "$readme" ]; then
    awk -v cmd='    $ kvcalc --model llama-3-8b --gpu h200 --weight-dtype fp8 --kv-dtype fp8 --seq-len 8192' '
        $0 == cmd { on = 1; next }
        !on || $0 == "    ..." { next }
        /^    / { line[++n] = substr($0, 5); next }
        /^$/ { line[++n] = ""; next }
        { exit }
        END { while (n > 0 && line[n] == "") n--; for (i = 1; i <= n; i++) print line[i] }' "$readme" >"$T/readme.out"
    k=$(wc -l <"$T/readme.out")
    if [ "$k" -gt 5 ] && tail -n "$k" "$OUT" | cmp -s - "$T/readme.out"; then
        pass "the README's kvcalc example is the report's last $k lines"
    else
        fail "the README's kvcalc example ($k lines) is not what kvcalc prints: $(tail -n "$k" "$OUT" | diff "$T/readme.out" - | head -5)"
    fi
else
    echo "note: $readme absent: the README example check skipped"
fi
run kvcalc -m llama-3-70b --gpu rtx-4090 -s 4096 --json
expect_field fits false "70B in f16 does not fit a 24GB card"
expect_field max_seqs 0 "... so no sequences"

# ---- sweeps ----
run kvcalc -m llama-3-8b --gpu h100 --seq-len 1024:4096:1024 --json
expect_status 0 "sweep runs"
n=$(wc -l <"$OUT")
if [ "$n" -eq 4 ]; then pass "1024:4096:1024 gives 4 JSON lines"; else fail "sweep gave $n lines"; fi
run kvcalc -m llama-3-8b --gpu h100 --batch 1:64:x2 --tsv
n=$(wc -l <"$OUT")
if [ "$n" -eq 8 ]; then pass "1:64:x2 gives a header and 7 TSV rows"; else fail "tsv sweep gave $n lines"; fi
expect_out_has "max_seqs" "the TSV header names its columns"
run kvcalc -m llama-3-8b --gpu h100 --seq-len 2048:4096:2048 --tp 1:2:1 --json
n=$(wc -l <"$OUT")
if [ "$n" -eq 4 ]; then pass "two swept options multiply"; else fail "2 x 2 sweep gave $n lines"; fi
run kvcalc -m llama-3-8b --gpu-mem 40G:80G:20G -s 4096
expect_status 0 "a human sweep table"
expect_out_has "max_seqs" "the sweep table has a header"
# a swept option the table has no column of its own for gets one, leading
run kvcalc -m llama-3-8b -g h200 --gpu-util 0.5:0.9:0.2
expect_status 0 "a --gpu-util sweep"
expect_true "its rows show the swept share" sh -c "head -1 '$OUT' | grep -q '^gpu-util ' &&
    awk 'NR > 1 { print \$1 }' '$OUT' | tr '\n' ' ' | grep -qx '0.5 0.7 0.9 '"
run kvcalc -m llama-3-8b --gpu-mem 40G:80G:40G --kv-heads 4:8:4 -s 4096
expect_true "--gpu-mem and --kv-heads sweeps: a column each" sh -c "head -1 '$OUT' | grep -q '^gpu-mem  *kv-heads  *seq_len'"
expect_true "... with the values at each point" sh -c "sed -n 5p '$OUT' | grep -q '^80000000000 8  '"
# the fragmentation a text sweep simulates is printed after its table (it was dropped)
run kvcalc -m llama-3-8b -g h200 -s 1024:2048:1024 --lengths uniform:1:100
expect_status 0 "a text sweep with --lengths"
expect_out_has "Fragmentation (simulated lengths, seed 1, reserve seq-len tokens contiguous)" "prints the fragmentation"
n=$(grep -c '^  [0-9][0-9]*  *\(contiguous\|paged\)' "$OUT")
if [ "$n" -eq 14 ]; then pass "one row per scheme per point (2 x 7)"; else fail "fragmentation rows: $n, wanted 14"; fi
expect_true "each row leads with its point's seq-len" grep -q '^  2048  *paged 256 ' "$OUT"

# ---- fragmentation ----
# all lengths 1000 on block 16: floor(blocks / 63) sequences; contiguous 4096 reservations fit max_seqs
run kvcalc -m llama-3-8b --gpu h100 -s 4096 --lengths uniform:1000:1000 --json
expect_status 0 "simulation runs"
blocks=$(jf kv_blocks)
maxs=$(jf max_seqs)
paged=$(sed -n 's/.*"scheme":"paged","block_size":16,"seqs":\([0-9]*\).*/\1/p' "$OUT")
contig=$(sed -n 's/.*"scheme":"contiguous","block_size":0,"seqs":\([0-9]*\).*/\1/p' "$OUT")
if [ -n "$blocks" ] && [ "$paged" = "$((blocks / 63))" ]; then pass "equal lengths: paged seqs = blocks / 63"; else fail "paged $paged vs blocks $blocks / 63"; fi
if [ -n "$maxs" ] && [ "$contig" = "$maxs" ]; then pass "contiguous reservation = max_seqs at 4096"; else fail "contiguous $contig vs $maxs"; fi
# windows are charged as the plan charges them: lengths all of --seq-len
# admit the Answer's sequences at its block size, and contiguous reserves a
# windowed layer's window (every token in every layer: Mistral-7B 14 of
# the plan's 113, Gemma-2-9B 10 of 16)
for c in "mistral-7b -s 32768" "mistral-7b -s 32768 --tp 2" "gemma-2-9b -s 16384" "gemma-2-9b -s 16384 --pp 2" \
    "gemma-2-9b -s 16384 --block-size 64 --kv-dtype int4"; do
    len=${c#*-s }
    len=${len%% *}
    bs=$(echo "$c" | sed -n 's/.*--block-size \([0-9]*\).*/\1/p')
    run kvcalc -m $c -g h100 --lengths "uniform:$len:$len" --json
    maxs=$(jf max_seqs)
    paged=$(sed -n 's/.*"scheme":"paged","block_size":'"${bs:-16}"',"seqs":\([0-9]*\).*/\1/p' "$OUT")
    if [ -n "$maxs" ] && [ "$paged" = "$maxs" ]; then pass "$c: the simulation admits the plan's $maxs"
    else fail "$c: the simulation admits $paged, the plan $maxs"; fi
done
run kvcalc -m mistral-7b -g h100 --lengths uniform:32768:32768 --json
contig=$(sed -n 's/.*"scheme":"contiguous","block_size":0,"seqs":\([0-9]*\).*/\1/p' "$OUT")
expect_true "Mistral-7B: a contiguous reservation of its 4096-token window, 113 ($contig)" [ "$contig" = 113 ]
run kvcalc -m llama-3-8b --gpu h100 -s 4096 --lengths lognormal:6:1 --seed 7 --json
cp "$OUT" "$T/a"
run kvcalc -m llama-3-8b --gpu h100 -s 4096 --lengths lognormal:6:1 --seed 7 --json
expect_true "same seed, same simulation" cmp -s "$OUT" "$T/a"
run kvcalc -m llama-3-8b --gpu h100 -s 4096 --lengths lognormal:6:1 --seed 8 --json
expect_true "another seed, another simulation" sh -c "! cmp -s '$OUT' '$T/a'"
printf '100\n200\n# comment\n300\n' >"$T/lens"
run kvcalc -m llama-3-8b --gpu h100 -s 4096 --lengths "$T/lens" --shared-prefix 64
expect_status 0 "lengths from a file, with a shared prefix"
expect_out_has "paged 16" "the report lists block 16"
expect_out_has "contiguous" "and the contiguous scheme"
expect_out_has "saved" "and what the prefix saved"
# every sequence starts with the prefix: one longer than any sequence is refused
run kvcalc -m llama-3-8b -g h200 -s 4096 --lengths uniform:1:100 --shared-prefix 5000
expect_status 2 "--shared-prefix longer than the longest sequence exits 2"
expect_err_has "--shared-prefix: 5000 tokens is longer than the longest sequence, 100 tokens" "and says how long that is"
run kvcalc -m llama-3-8b -g h200 -s 4096 --lengths lognormal:6:1 --shared-prefix 5000
expect_status 2 "--shared-prefix longer than --seq-len exits 2"
expect_err_has "longest sequence, 4096 tokens (--seq-len" "and names --seq-len"
run kvcalc -m llama-3-8b -g h200 -s 1024:8192:x2 --lengths lognormal:6:1 --shared-prefix 2000
expect_status 2 "--shared-prefix longer than the shortest swept --seq-len exits 2"
run kvcalc -m llama-3-8b -g h200 -s 4096 --lengths uniform:1:100 --shared-prefix 100
expect_status 0 "--shared-prefix as long as the longest sequence runs"
run kvcalc -m llama-3-8b -g h200 --shared-prefix 64
expect_status 2 "--shared-prefix without --lengths exits 2"
expect_err_has "--shared-prefix needs --lengths" "and says it needs --lengths"
run kvcalc -m llama-3-8b -g h200 --seed 7
expect_status 2 "--seed without --lengths exits 2"
expect_err_has "--seed needs --lengths" "and says it needs --lengths"

# ---- lists ----
run kvcalc --list-models
for m in smollm2-135m llama-3-8b llama-3-70b llama-3.1-405b mistral-7b mixtral-8x7b qwen2.5-7b qwen2.5-72b gemma-2-9b deepseek-v3; do
    expect_out_has "$m" "--list-models has $m"
done
run kvcalc --list-gpus
for g in h100-sxm h100-pcie h200 a100-40 a100-80 l40s rtx-4090 b200; do
    expect_out_has "$g" "--list-gpus has $g"
done

# ---- HF config.json ----
mkdir -p "$T/hf"
cat >"$T/hf/config.json" <<'EOF'
{"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
 "num_key_value_heads": 8, "vocab_size": 128256, "intermediate_size": 14336,
 "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-05}
EOF
run kvcalc -m "$T/hf" -s 4096 --json
expect_status 0 "an HF folder reads"
expect_field kv_bytes 536870912 "HF Llama-3-8B shape: 131,072 x 4096"
expect_field n_params 8030261248 "and its parameter count"
run kvcalc -m "$T/hf/config.json" --json
expect_field seq_len 8192 "seq-len defaults to the model's context"
# A model without a name is labelled by its path, whole: no fixed-size copy
# cuts a long one (it was 159 bytes), in JSON, TSV or the report.
long="$T/$(printf 'd%.0s' $(seq 1 200))/$(printf 'e%.0s' $(seq 1 200))"
mkdir -p "$long"
cp "$T/hf/config.json" "$long/"
run kvcalc -m "$long" --json
expect_status 0 "a model under a 400-byte path reads"
expect_out_has "\"model\":\"$long\"," "--json labels it with the whole path"
run kvcalc -m "$long" --tsv
expect_out_has "$long	hf	" "--tsv too"
run kvcalc -m "$long"
expect_out_has "model      $long (hf)" "the report too"

# DeepSeek-V3's config.json: MLA, 256 experts, q low rank; same figures as the preset
cat >"$T/ds.json" <<'EOF'
{"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
 "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
 "n_routed_experts": 256, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "kv_lora_rank": 512,
 "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "vocab_size": 129280,
 "max_position_embeddings": 163840, "rope_theta": 10000, "rms_norm_eps": 1e-06, "tie_word_embeddings": false}
EOF
run kvcalc -m "$T/ds.json" --json
expect_status 0 "DeepSeek-V3 config.json reads"
expect_field kv_bytes_per_token 70272 "DeepSeek-V3 from HF: 70,272 B/token"
run kvcalc -m deepseek-v3 --json
want=$(jf n_params)
run kvcalc -m "$T/ds.json" --json
expect_field n_params "$want" "DeepSeek-V3 from HF: the preset's parameter count"
# an MLA size past the planner's range is the loader's refusal too (one
# definition, config.h): the file and the field are named, exit 1
sed 's/"kv_lora_rank": 512/"kv_lora_rank": 70000/' "$T/ds.json" >"$T/ds-big.json"
run kvcalc -m "$T/ds-big.json"
expect_status 1 "an MLA latent rank over the loader's range exits 1"
expect_err_has "ds-big.json: config: 70000 MLA latent rank (kv_lora_rank; want 0..65536)" "naming the file and field"
expect_err_one_line "one line"
# the query rank, which only the planner reads, likewise (it was dropped)
sed 's/"q_lora_rank": 1536/"q_lora_rank": 70000/' "$T/ds.json" >"$T/ds-bigq.json"
run kvcalc -m "$T/ds-bigq.json"
expect_status 1 "an MLA query rank over the range exits 1"
expect_err_has "ds-bigq.json: config: 70000 MLA query rank (q_lora_rank; want 0..65536)" "naming the file and field"
expect_err_one_line "one line"

# ---- usage errors: exit 2 ----
run kvcalc --model llama-3-8b --frobnicate
expect_status 2 "unknown option exits 2"
run kvcalc --model llama-3-8b --block-size 0
expect_status 2 "--block-size 0 exits 2"
expect_err_has "block-size" "and names the option"
run kvcalc --model llama-3-8b --block-size 24
expect_status 2 "--block-size 24 (not a power of two) exits 2"
run kvcalc --model llama-3-8b --gpu-mem -5G
expect_status 2 "negative --gpu-mem exits 2"
run kvcalc --model llama-3-8b --seq-len -1
expect_status 2 "negative --seq-len exits 2"
run kvcalc --model llama-3-8b --seq-len 8k
expect_status 2 "--seq-len 8k exits 2"
expect_err_has "digits only: 8192 or 8000, not 8k" "and says what a count takes"
# numbers are decimal digits: strtod's sign, space, exponent and hex are
# refused (-s 0x100 was 256 tokens, --gpu-mem 0x50G 80 GB)
refused_number() { # OPTION VALUE
    run kvcalc --model llama-3-8b --gpu h200 "$1" "$2"
    expect_status 2 "$1 '$2' exits 2"
    expect_err_has "$1: '$2' is not" "$1 '$2': the message names the option"
}
for v in 0x100 1e3 0x1p4 ' 8192' '8192 ' +8192 8192.0 inf; do refused_number --seq-len "$v"; done
for v in 0x10B 1e9 ' 8B' 8.B .5B; do refused_number --params "$v"; done
for v in 0x50G 8e10 ' 80G' 80G. +80G 80GiB/s 80G/s; do refused_number --gpu-mem "$v"; done
for v in 80GiB/s 1T/s; do refused_number --overhead "$v"; done
for v in 0x0.8p0 9e-1 ' 0.9' .9; do refused_number --gpu-util "$v"; done
for v in 0x5 ' 5' +5 1e2; do refused_number --seed "$v"; done
run kvcalc --model llama-3-8b --gpu h200 --gpu-mem 80G:160G:x2e0
expect_status 2 "a FACTOR with an exponent exits 2"
# the documented forms still read
run kvcalc -m llama-3-8b --gpu-mem 141GB --gpu-bw 3.35TB/s --params 8.03B --gpu-util 0.95 -s 8192 --json
expect_status 0 "141GB, 3.35TB/s, 8.03B, 0.95, 8192 read"
expect_field gpu_mem_bytes 141000000000 "141GB is 141e9 bytes"
expect_field n_params 8030000000 "8.03B is 8.03e9 parameters"
run kvcalc -m llama-3-8b --gpu-mem 1.5GiB --json
expect_field gpu_mem_bytes 1610612736 "1.5GiB is 1.5 x 2^30 bytes"
run kvcalc -m llama-3-8b --gpu-mem 80gib --gpu-bw 3.35tb/s --json
expect_field gpu_mem_bytes 85899345920 "a unit in lower case is the same unit (kvcalc(1) Numbers)"
expect_field gpu_bw_bytes_per_s 3350000000000 "a rate in lower case with /s"
# a count's STEP that is not whole says so (it said STEP must be above 0)
run kvcalc -m llama-3-8b -g h200 -s 1:3:0.5
expect_status 2 "a fractional STEP for a count exits 2"
expect_err_has "STEP '0.5' is not a whole number" "and says the step is not a whole number"
run kvcalc --model llama-3-8b --gpu h100 --gpu-util 2
expect_status 2 "--gpu-util 2 exits 2"
expect_err_has "gpu-util" "and names the option"
run kvcalc --model llama-3-8b --gpu h100 --tp 4 --gpus 6
expect_status 2 "--gpus not a multiple of tp exits 2"
run kvcalc --model no-such-model
expect_status 2 "an unknown preset exits 2"
expect_err_has "list-models" "and points at --list-models"
run kvcalc --model llama-3-8b --gpu tpu-v9
expect_status 2 "an unknown GPU exits 2"
run kvcalc --model llama-3-8b --kv-dtype q4_0
expect_status 2 "an unknown KV dtype exits 2"
run kvcalc --model llama-3-8b --seq-len 10:1:1
expect_status 2 "a backwards sweep exits 2"
run kvcalc --model llama-3-8b --lengths uniform:1:10
expect_status 2 "--lengths without a GPU exits 2"
run kvcalc
expect_status 2 "no model exits 2"
# the bytes a model's kind is sniffed from are kept for its reader: '-' is stdin
run_sh "cat '$T/tiny.kvp' | kvcalc -m - --json"
expect_status 0 "-m - reads the model from standard input"
expect_out_has '"source":"kvp"' "a KVP model read from standard input"

# ---- runtime errors: exit 1, one clear line naming the file ----
run kvcalc --model "$T/missing.gguf"
expect_status 1 "a missing model file exits 1"
expect_err_has "missing.gguf" "and names the file"
printf 'hello, not a model\n' >"$T/junk.bin"
run kvcalc --model "$T/junk.bin"
expect_status 1 "a file that is not a model exits 1"
expect_err_has "junk.bin" "and names it"
expect_err_one_line "in one line"
printf 'GGUF\003\000\000\000' >"$T/short.gguf"
run kvcalc --model "$T/short.gguf"
expect_status 1 "a truncated GGUF exits 1"
expect_err_has "short.gguf" "and names it"
mkdir -p "$T/empty"
run kvcalc --model "$T/empty"
expect_status 1 "a folder without config.json exits 1"
if [ "$(id -u)" != 0 ]; then
    printf '{}' >"$T/unreadable.json"
    chmod 000 "$T/unreadable.json"
    run kvcalc --model "$T/unreadable.json"
    expect_status 1 "an unreadable file exits 1"
fi

# ---- a model file's bad value is the file's fault: exit 1, the file and the field ----
# (the command line's own values stay usage errors, exit 2)
hf_bad() { # NAME LAYERS FFN VOCAB: a Llama-3-8B config.json with those three
    mkdir -p "$T/$1"
    printf '{"model_type":"llama","hidden_size":4096,"intermediate_size":%s,"num_attention_heads":32,%s}\n' "$3" \
        "\"num_hidden_layers\":$2,\"num_key_value_heads\":8,\"vocab_size\":$4" >"$T/$1/config.json"
}
hf_bad hf_layers 200000 14336 128256
run kvcalc -m "$T/hf_layers"
expect_status 1 "num_hidden_layers 200000 in a config.json exits 1"
expect_err_has "hf_layers: config: 200000 layers (want 1..4096)" "names the file and the layer count"
expect_err_one_line "in one line, no usage hint"
hf_bad hf_ffn0 32 0 128256
run kvcalc -m "$T/hf_ffn0"
expect_status 1 "intermediate_size 0 exits 1 (quantize and decode refuse it too)"
expect_err_has "config: 0 feed-forward width" "names the feed-forward width"
hf_bad hf_vocab 32 14336 4000000000
run kvcalc -m "$T/hf_vocab"
expect_status 1 "vocab_size 4e9 exits 1"
expect_err_has "config: 4000000000 vocabulary (want 1..16777216)" "names the vocabulary"
if [ -x "${KVP_UNIT_DIR:-}/test_convert" ]; then
    "$KVP_UNIT_DIR/test_convert" --write-gguf "$T/bad-layers.gguf" layers
    run kvcalc -m "$T/bad-layers.gguf"
    expect_status 1 "a GGUF of 2^31 layers exits 1"
    k=$(sed 's/^kvcalc: //' "$ERR")
    run quantize --to int8 "$T/bad-layers.gguf" -o "$T/bad.kvp"
    if [ -n "$k" ] && [ "$k" = "$(sed 's/^quantize: //' "$ERR")" ]; then pass "kvcalc says what quantize says: $k"
    else fail "kvcalc '$k', quantize '$(cat "$ERR")'"; fi
fi
run kvcalc --layers 200000 --hidden 4096 --heads 32
expect_status 2 "--layers 200000 on the command line stays a usage error"

# ---- a model from options alone has every dimension a model file must
# (kvp_config_check): no FFN or vocabulary was planned as 0, with weights
# a third of the model's and "vocab 0" in the report ----
run kvcalc --layers 32 --hidden 4096 --heads 32 --gpu h100
expect_status 2 "a model of options without --ffn and --vocab exits 2"
expect_err_has "kvcalc: give --model, or a model from options: --layers, --hidden, --heads, --ffn and --vocab (missing --ffn, --vocab)" \
    "naming what is missing"
expect_out_empty "nothing planned without them"
run kvcalc --layers 32 --hidden 4096 --heads 32 --ffn 14336 --gpu h100
expect_status 2 "... and without --vocab alone"
expect_err_has "(missing --vocab)" "naming --vocab"
run kvcalc --layers 32 --hidden 4096 --heads 32 --kv-heads 8 --ffn 14336 --vocab 128256 --json
expect_status 0 "Llama-3-8B's shape from options plans"
run kvcalc -m llama-3-8b --json
want=$(jf n_params)
run kvcalc --layers 32 --hidden 4096 --heads 32 --kv-heads 8 --ffn 14336 --vocab 128256 --json
expect_field n_params "$want" "with the preset's parameter count"

# ---- shapes the loader refuses are refused from options too (exit 2) ----
run kvcalc -m llama-3-8b --experts 8 --experts-used 9 --gpu h200
expect_status 2 "--experts-used 9 of --experts 8 exits 2"
expect_err_has "Llama-3-8B with --experts 8 --experts-used 9: config: 9 experts used a token, more than the 8 experts" \
    "names the options and both counts"
run kvcalc -m llama-3-8b --kv-heads 7
expect_status 2 "32 heads over --kv-heads 7 exits 2"
expect_err_has "config: 32 heads are not a multiple of 7 KV heads" "the loader's words for a config.json"
run kvcalc --layers 2 --hidden 64 --heads 4 --kv-heads 3 --ffn 128 --vocab 256
expect_status 2 "--heads 4 --kv-heads 3 exits 2"
run kvcalc --layers 2 --hidden 64 --heads 3 --ffn 128 --vocab 256
expect_status 2 "--hidden 64 over --heads 3 with no --head-dim exits 2"
expect_err_has "hidden size 64 is not a multiple of 3 heads" "says the heads do not divide the hidden size"
run kvcalc --layers 2 --hidden 64 --heads 3 --head-dim 16 --ffn 128 --vocab 256 --json
expect_status 0 "with --head-dim it plans"
run kvcalc -m llama-3-8b --kv-heads 4:8:2
expect_status 2 "a sweep with one bad point exits 2 before printing"
expect_out_empty "nothing printed"

# ---- only the TP splits decode runs (lib/model/shard.h) ----
run kvcalc -m llama-3-8b --tp 3 --gpu h100
expect_status 2 "llama-3-8b --tp 3 exits 2"
expect_err_has "--tp: tensor parallelism over 3 ranks: 32 query heads do not split evenly (rank counts that split this model: 1, 2, 4, 8, 16, 32)" \
    "says why and which splits work, as decode does"
run kvcalc -m smollm2-135m --tp 2 --gpu h100
expect_status 2 "9 query heads over --tp 2 exits 2"
expect_err_has "9 query heads do not split evenly (rank counts that split this model: 1, 3)" "decode's message"
run kvcalc -m llama-3-8b --gpus 6 --gpu h100
expect_status 2 "--gpus 6 alone (tp 6) exits 2"
expect_err_has "--gpus: tensor parallelism over 6 ranks" "names --gpus"
run kvcalc -m llama-3-8b --tp 1:8:1 --gpu h100
expect_status 2 "a --tp sweep through 3 exits 2"
run kvcalc -m smollm2-135m --tp 3 --gpu h100 --json
expect_status 0 "smollm2 --tp 3 plans"
expect_field kv_heads_per_gpu 1 "one of its 3 KV heads a GPU"
run kvcalc -m smollm2-135m --tp 9 --gpu h100
expect_status 2 "--tp 9: the FFN width 1536 does not split"
expect_err_has "the FFN width 1536 does not split evenly" "names the FFN width"

# ---- a factor sweep of a count gives each count once ----
run kvcalc -m llama-3-8b --gpu h100 -s 1024:8192:x1.0001 --tsv
expect_status 0 "a fine factor sweep"
n=$(($(wc -l <"$OUT") - 1))
expect_true "7169 rows, the distinct counts 1024..8192 (was 20797)" [ "$n" = 7169 ]
expect_true "no seq_len twice" sh -c "cut -f15 '$OUT' | sort | uniq -d | grep -q . && exit 1 || exit 0"
run kvcalc -m llama-3-8b --gpu h100 --gpu-mem 1000:2000:x1.0001 --tsv
expect_status 0 "a size sweep of steps under a byte"
expect_true "1001 rows, each size once" [ "$(($(wc -l <"$OUT") - 1))" = 1001 ]

# ---- --lengths and --tsv: refused, and --help says so ----
run kvcalc -m llama-3-8b --gpu h100 -s 4096 --lengths uniform:100:4000 --tsv
expect_status 2 "--lengths with --tsv exits 2"
run kvcalc --help
expect_out_has "not --tsv" "--help says --lengths does not go with --tsv"

# ---- --check: a stats file names a KV dtype decode's cache holds; int4 KV
# is a plan for other engines' caches, which no decode run wrote ----
cat >"$T/int4.json" <<'EOF'
{"requests":10,"kv_memory":0,"output_tokens":240,"prompt_tokens":150,"preemptions":0,"peak_kv_blocks":5,
 "kv_blocks":5,"block_size":16,"max_num_seqs":64,"model":"",
 "model_fingerprint":"1d9ba74afb3032449c2bb4394c0ac691","input":"prompts","kv_dtype":"int4",
 "kv_block_bytes":368640,"kv_pool_bytes":1843200,"kv_pool_sized_by":"kv-mem","kv_mem":2097152,
 "kv_out":false,"stopped":false,"peak_running":3,"max_seq_len":41}
EOF
run kvcalc --check "$T/int4.json" -m smollm2-135m
expect_status 1 "--check: a stats file with kv_dtype int4 exits 1"
expect_err_has "kvcalc: $T/int4.json: kv_dtype: not a dtype decode's KV cache holds (f32 f16 bf16 fp8_e4m3 i8)" \
    "naming the file and the field"
sed 's/"kv_dtype":"int4"/"kv_dtype":"f16"/' "$T/int4.json" >"$T/f16.json"
run kvcalc --check "$T/f16.json" -m smollm2-135m
expect_status 0 "the same run in f16 checks, and agrees"
run kvcalc --help
expect_out_has "other engines' caches, not decode's" "--help says which KV dtypes decode has none of"

# ---- --seed, --shared-prefix and --kv-mem take one value (kvcalc(1) Sweeps
# names them), and a sweep of one says so ----
run kvcalc -m llama-3-8b -g h100 --lengths uniform:1:100 --seed 1:3:1
expect_status 2 "--seed 1:3:1 exits 2"
expect_err_has "kvcalc: --seed: '1:3:1': one value, not a sweep (--seed and --shared-prefix do not sweep)" \
    "and says --seed does not sweep"
run kvcalc -m llama-3-8b -g h100 --lengths uniform:1:100 --shared-prefix 16:64:16
expect_status 2 "--shared-prefix 16:64:16 exits 2"
expect_err_has "kvcalc: --shared-prefix: '16:64:16': one value, not a sweep" "and says --shared-prefix does not sweep"
run kvcalc --check "$T/f16.json" -m smollm2-135m --kv-mem 1MiB:2MiB:1MiB
expect_status 2 "--kv-mem 1MiB:2MiB:1MiB exits 2"
expect_err_has "kvcalc: --kv-mem: '1MiB:2MiB:1MiB': one value, not a sweep" "and says --kv-mem does not sweep"
run kvcalc --help
expect_out_has "all but --seed, --shared-prefix and --kv-mem" "--help names the options that do not sweep"

# ---- a lengths file: 1..4294967295 each, a 0 refused naming the line (exit
# 1), a length past --seq-len clamped to it (kvcalc(1) --lengths) ----
printf '100\n0\n' >"$T/len0"
run kvcalc -m llama-3-8b -g h100 -s 4096 --lengths "$T/len0"
expect_status 1 "a lengths file with a 0 exits 1"
expect_err_has "kvcalc: $T/len0: line 2: not a length (a whole number 1..4294967295)" "naming the file and line"
printf '5000\n' >"$T/len5000"
run kvcalc -m llama-3-8b -g h100 -s 4096 --lengths "$T/len5000" --json
expect_status 0 "a length past --seq-len"
expect_out_has '"scheme":"contiguous","block_size":0,"seqs":' "simulates"
expect_true "clamped to 4096: no waste in a 4096-token reservation" grep -q '"scheme":"contiguous","block_size":0,"seqs":[0-9]*,"tokens":[0-9]*,"alloc_bytes":[0-9]*,"waste_bytes":0,' "$OUT"

# ---- small things a review found ----
# the preset tables have no TSV form: --tsv is refused, not ignored
for l in --list-models --list-gpus; do
    run kvcalc $l --tsv
    expect_status 2 "$l --tsv exits 2"
    expect_err_has "kvcalc: --tsv: --list-models and --list-gpus print a table, or JSON Lines with --json" "and says why"
    expect_out_empty "$l --tsv: no text table"
done
# --help names every weight format the parser takes, which take any case
run kvcalc --help
expect_out_has "f16 bf16 f32 fp8 fp8-e5m2 int8 int4 int4-gN fp4-gN nvfp4 mxfp4" "--help lists fp8-e5m2 and fp4-gN"
run kvcalc -m llama-3-8b --weight-dtype INT4-G64 --json
expect_status 0 "INT4-G64 is int4-g64, as Q4_K is q4_k"
expect_field weight_dtype '"int4-g64"' "named int4-g64"
# a sweep's text table says its unit, and the longest context as the report does
run kvcalc -m mistral-7b -g h100 -s 4096:8192:4096 -b 1:113:112
expect_out_has "kv_bytes (B)    weights/gpu (B)  kv_free/gpu (B)" "the byte columns say B"
expect_true "one sequence of Mistral-7B: unbounded, not -1" grep -q '^4096  *1  .* unbounded$' "$OUT"
expect_true "113: every length to 4096" grep -q '^4096  *113  .* 4096$' "$OUT"

# ---- an empty name is a usage error that says so, as kvp_cli_opt_path's are ----
run kvcalc -m '' -g h200
expect_status 2 "-m '' exits 2"
expect_err_has "kvcalc: --model: an empty name (a preset" "and says the model's name is empty"
run kvcalc --check "$T/none.json" -m ''
expect_status 2 "--check with -m '' exits 2"
expect_err_has "kvcalc: --model: an empty name" "the same message"
run kvcalc -m llama-3-8b -g h200 --lengths ''
expect_status 2 "--lengths '' exits 2 (it was read as a file named '': exit 1)"
expect_err_has "kvcalc: --lengths: an empty spec (a file of lengths, uniform:A:B" "and says the spec is empty"

# ---- a zero FFN width is no model's shape: refused like --layers 0 ----
run kvcalc -m llama-3-8b --ffn 0
expect_status 2 "--ffn 0 exits 2"
expect_err_has "kvcalc: --ffn: 0 is out of range (1..4194304)" "and names the option"
run kvcalc --layers 2 --hidden 64 --heads 4 --ffn 0:256:128 --vocab 256 --tsv
expect_status 2 "a --ffn sweep from 0 exits 2"
expect_out_empty "nothing printed"
run kvcalc -m llama-3-8b --ffn 1 --json
expect_status 0 "--ffn 1 plans"
expect_field n_ff 1 "with an FFN width of 1"
# and a vocabulary of 0 likewise ("config: 0 vocabulary" from a file)
run kvcalc -m llama-3-8b --vocab 0
expect_status 2 "--vocab 0 exits 2"
expect_err_has "kvcalc: --vocab: 0 is out of range (1..16777216)" "and names the option"

# ---- a shape option's range is the loader's: a config.json past a ceiling
# is refused naming the range (the file's fault, exit 1); the option takes
# that range, the option one past it is a usage error naming it (exit 2).
# The numbers come from the loader's message, so the two cannot drift ----
mkdir -p "$T/lim"
# shape_limit OPTION KEY BASE...: KEY set far past any ceiling in the tiny
# config.json; then OPTION at the range's end and one past it, on BASE
shape_limit() {
    opt=$1 key=$2
    shift 2
    case $key in
    num_local_experts) sed 's/"vocab_size": 16/"vocab_size": 16, "num_local_experts": 4000000000, "num_experts_per_tok": 1/' ;;
    *) sed "s/\"$key\": [0-9]*/\"$key\": 4000000000/" ;;
    esac <"$G/tiny-st/config.json" >"$T/lim/config.json"
    run kvcalc -m "$T/lim/config.json"
    expect_status 1 "$key past the loader's ceiling: a file's fault"
    range=$(sed -n 's/.*config: 4000000000 [a-z -]*(want \([0-9]*\.\.[0-9]*\)).*/\1/p' "$ERR")
    if [ -z "$range" ]; then
        fail "$key: the loader's refusal names no range ($(cat "$ERR"))"
        return
    fi
    hi=${range#*..}
    run kvcalc "$@" "--$opt" "$hi" --json
    expect_status 0 "--$opt $hi, the loader's ceiling, plans"
    run kvcalc "$@" "--$opt" $((hi + 1)) --json
    expect_status 2 "--$opt $((hi + 1)), past the loader's ceiling, exits 2"
    # the whole range is the loader's, its start too (--experts-used 0)
    expect_err_has "kvcalc: --$opt: $((hi + 1)) is out of range ($range)" "and names the option and the loader's range"
    expect_out_empty "--$opt $((hi + 1)): nothing planned"
}
shape_limit layers num_hidden_layers -m llama-3-8b
shape_limit hidden hidden_size -m llama-3-8b
shape_limit ffn intermediate_size -m llama-3-8b
shape_limit heads num_attention_heads -m llama-3-8b
# (a file's KV heads divide its heads, so the heads' ceiling is theirs)
shape_limit kv-heads num_attention_heads -m llama-3-8b --heads 65536
shape_limit head-dim head_dim -m llama-3-8b
shape_limit vocab vocab_size -m llama-3-8b
shape_limit experts num_local_experts -m mixtral-8x7b
shape_limit experts-used num_local_experts -m mixtral-8x7b --experts 65536
# the issue's three, in one sweep each: refused before anything is printed
run kvcalc -m llama-3-8b --layers 4000:5000:500 --tsv
expect_status 2 "a --layers sweep past 4096 exits 2"
expect_err_has "kvcalc: --layers: 4500 is out of range (1..4096)" "naming the first value past it"
expect_out_empty "nothing printed"
# a head dim that --hidden and --heads imply is held to the head dim's ceiling
run kvcalc --layers 2 --hidden 65536 --heads 2 --ffn 128 --vocab 256
expect_status 2 "--hidden 65536 --heads 2 (a head dim of 32768) exits 2"
expect_err_has "kvcalc: --layers 2 --heads 2 --hidden 65536 --vocab 256 --ffn 128: config: hidden size 65536 over 2 heads is a head dim of 32768 (want 1..1024)" "naming the options and the range"
run kvcalc --layers 2 --hidden 65536 --heads 64 --ffn 128 --vocab 256 --json
expect_status 0 "--hidden 65536 --heads 64 (a head dim of 1024) plans"
expect_field head_dim 1024 "with a head dim of 1024"

# ---- --experts-used takes the loader's 0: a dense model uses no experts, so
# a MoE preset plans dense with --experts 0 --experts-used 0 (--experts 0
# alone keeps its top-2, which no model of 0 experts can have) ----
run kvcalc -m mixtral-8x7b --experts 0 --experts-used 0 --json
expect_status 0 "Mixtral with --experts 0 --experts-used 0 plans"
expect_field n_expert 0 "with no experts"
expect_field n_params 7241732096 "Mixtral made dense has Mistral-7B's 7,241,732,096 parameters"
expect_field n_params_active 7241732096 "every one of them active"
run kvcalc -m mistral-7b --json
expect_field n_params 7241732096 "(Mistral-7B's count, from its preset)"
run kvcalc --layers 2 --hidden 64 --heads 4 --ffn 128 --vocab 256 --experts 0 --experts-used 0 --json
expect_status 0 "a model of options alone takes --experts-used 0"
run kvcalc -m mixtral-8x7b --experts 0:8:8 --experts-used 0 --tsv
expect_status 2 "--experts-used 0 beside an --experts sweep to 8: 8 experts no token uses exits 2"
expect_err_has "config: 8 experts, but none used a token" "naming the count"
expect_out_empty "--experts 0:8:8 --experts-used 0: nothing planned"
run kvcalc -m mixtral-8x7b --experts-used 0
expect_status 2 "Mixtral with --experts-used 0 (its 8 experts kept) exits 2"
run kvcalc -m mixtral-8x7b --experts 0
expect_status 2 "--experts 0 alone: Mixtral's top-2 of no experts exits 2"
expect_err_has "config: 2 experts used a token, more than the 0 experts" "naming both counts"

done_testing
