# Special tokens in prompts and seeing the tokens: prefill --tokenize,
# --no-special, --chat's literal messages, kvdump's token ids; --chat on a
# tiny safetensors folder with its HF chat template; on the real model
# (SmolLM2-135M-Instruct Q4_1) where cached.
. "$KVP_TESTS/cli/lib.sh"

run prefill --tokenize -p hi
expect_status 2 "--tokenize without a model is a usage error"
expect_err_has "no model" "names what is missing"
run prefill --tokenize --resume x.kvp -m x.gguf -p hi
expect_status 2 "--tokenize with --resume is a usage error"
run prefill --tokenize -m x.gguf -p hi --stop x
expect_status 2 "--tokenize with --stop is a usage error (nothing generated, it would be ignored)"
expect_err_has "--stop goes with a prefill job (its stream carries it), not --tokenize" "said so"
for opt in "-n 4" "--temperature 0.5" "--seed 3"; do
    run prefill --tokenize -m x.gguf -p hi $opt
    expect_status 2 "--tokenize with $opt: a usage error (nothing generated, it would be ignored)"
    run prefill --perplexity t.txt -m x.gguf $opt
    expect_status 2 "--perplexity with $opt: a usage error"
done
expect_err_has "go with a prefill job (its stream carries them), not --perplexity" "said so"
run prefill --help
expect_out_has "--tokenize" "--help lists --tokenize"
expect_out_has "--no-special" "--help lists --no-special"
run decode --help
expect_out_has "--no-special" "decode --help lists --no-special"
run prefill --tokenize -m "$T/missing.gguf" -p hi
expect_status 1 "a missing model is a runtime error"
expect_err_one_line "one line of error"

# ---- --chat on a safetensors folder: the chat template of its
# tokenizer_config.json (its default system turn) end to end ----
# The folder: engine_hf's tiny Llama (a vocabulary of 256) with a byte-level
# tokenizer.json of <|endoftext|> <|im_start|> <|im_end|> (ids 0-2) and one
# token a byte for bytes 3-255, no merges: a byte's id is its value, so the
# ids of a rendered conversation are worked out here from its bytes alone.
# (HF transformers 5.25 loads this folder and its apply_chat_template gives
# the same ids, here and for the chat_template.jinja below.)
hf="$T/hf"
mkdir "$hf" && cp "$KVP_TESTS/golden/engine_hf/gqa1_hd32_tied/config.json" \
    "$KVP_TESTS/golden/engine_hf/gqa1_hd32_tied/model.safetensors" "$hf/"
{
    printf '{"version":"1.0","added_tokens":['
    id=0
    for tok in '<|endoftext|>' '<|im_start|>' '<|im_end|>'; do
        printf '%s{"id":%d,"content":"%s","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}' \
            "$([ $id = 0 ] || echo ,)" $id "$tok"
        id=$((id + 1))
    done
    bl='{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true}'
    printf '],"pre_tokenizer":%s,"decoder":%s,\n"model":{"type":"BPE","merges":[],"vocab":{' "$bl" "$bl"
    printf '"<|endoftext|>":0,"<|im_start|>":1,"<|im_end|>":2'
    # GPT-2's byte -> code point map: printable bytes are themselves, the
    # rest 256, 257, ... in byte order
    awk 'BEGIN { n = 0; for (b = 0; b < 256; b++) {
        if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) cp = b; else cp = 256 + n++
        if (b >= 3) printf ",\"\\u%04x\":%d", cp, b } }'
    printf '}}}\n'
} >"$hf/tokenizer.json"
# SmolLM2's template, its default system message changed (real newlines in
# the JSON string's Jinja literals, as SmolLM2's tokenizer_config.json has)
q="'"
template() { # DEFAULT NEWLINE: the template with that default system message and newline
    printf '%s' "{% for message in messages %}{% if loop.first and messages[0][${q}role${q}] != ${q}system${q} %}{{ ${q}<|im_start|>system$2$1<|im_end|>$2${q} }}{% endif %}{{${q}<|im_start|>${q} + message[${q}role${q}] + ${q}$2${q} + message[${q}content${q}] + ${q}<|im_end|>${q} + ${q}$2${q}}}{% endfor %}{% if add_generation_prompt %}{{ ${q}<|im_start|>assistant$2${q} }}{% endif %}"
}
printf '{"chat_template":"%s"}\n' "$(template 'You are a tiny test model.' '\n')" >"$hf/tokenizer_config.json"
# byte_ids TEXT: its bytes' values, comma separated
byte_ids() { printf '%s' "$1" | od -An -v -tu1 | tr -s ' \n' '  ' | sed 's/^ *//; s/ *$//; s/ /,/g'; }
# <|im_start|>system\nDEFAULT<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n
turns="1,$(byte_ids user),10,$(byte_ids Hi),2,10,1,$(byte_ids assistant),10"
want="1,$(byte_ids system),10,$(byte_ids 'You are a tiny test model.'),2,10,$turns"
run prefill --tokenize --json --chat -m "$hf" -p Hi
expect_status 0 "--tokenize --chat on a safetensors folder"
expect_out_has "{\"ids\":[$want]," "the template's default system turn, as HF renders it"
run prefill -m "$hf" -t $THREADS --chat -p Hi -o "$T/hf.kvp"
expect_status 0 "prefill --chat on the folder"
run kvdump --json "$T/hf.kvp"
expect_out_has "\"token_ids\":[$want]" "the prefilled sequence holds those ids"
run decode -m "$hf" -t $THREADS --chat -p Hi -n 2 --kv-out "$T/hfd.kvp"
expect_status 0 "decode --chat on the folder"
run kvdump --json "$T/hfd.kvp"
expect_out_has "\"token_ids\":[$want," "its saved conversation starts with them"
run prefill --tokenize --json --chat --system "Be brief." -m "$hf" -p Hi
expect_out_has "{\"ids\":[1,$(byte_ids system),10,$(byte_ids 'Be brief.'),2,10,$turns]," \
    "--system replaces the default"
run prefill --tokenize --json --chat --system "" -m "$hf" -p Hi
expect_out_has "{\"ids\":[$turns]," "--system \"\": no system turn"
# the KVP model quantize writes keeps the template
run quantize --to f16 "$hf" -o "$T/hfm.kvp"
expect_status 0 "quantize the folder"
run prefill --tokenize --json --chat -m "$T/hfm.kvp" -p Hi
expect_out_has "{\"ids\":[$want]," "its KVP model renders the same default system turn"
# chat_template.jinja, where transformers saves it now, comes first (a
# Jinja escape for the newline this time)
template 'From the jinja file.' '\n' >"$hf/chat_template.jinja"
run prefill --tokenize --json --chat -m "$hf" -p Hi
expect_out_has "{\"ids\":[1,$(byte_ids system),10,$(byte_ids 'From the jinja file.'),2,10,$turns]," \
    "chat_template.jinja before tokenizer_config.json"
# a tokenizer_config.json that does not parse here is not read as no
# template (that would drop the default system turn without a word): a
# conversation that needs its default system message fails, naming it;
# what needs no template runs (transformers reads some JSON this parser
# does not: NaN, a key given twice)
rm "$hf/chat_template.jinja"
printf '{"chat_template":"x' >"$hf/tokenizer_config.json"
run prefill --tokenize --json --chat -m "$hf" -p Hi
expect_status 1 "--chat with an unreadable tokenizer_config.json fails"
expect_err_has "$hf/tokenizer_config.json:1:" "the message names it and where"
expect_err_has "default system message is unknown (give --system" "and what to do"
expect_out_empty "no ids from a half-read folder"
printf '{"messages":[{"role":"system","content":"S"},{"role":"user","content":"Hi"}]}\n{"messages":[{"role":"user","content":"Hi"}]}\n' >"$T/hfmsg.jsonl"
run prefill --tokenize --json -m "$hf" -f "$T/hfmsg.jsonl"
expect_status 1 "a conversation without a system message fails too"
expect_err_has "$T/hfmsg.jsonl:2: $hf/tokenizer_config.json" "naming its line"
expect_out_has "{\"id\":0,\"ids\":[1,$(byte_ids system),10,83,2,10,$turns]" "the one with its own system message is rendered"
run prefill --tokenize --json --chat --system "" -m "$hf" -p Hi
expect_status 0 "--system gives what the template would have"
expect_out_has "{\"ids\":[$turns]," "and renders as it says"
run prefill --tokenize --json -m "$hf" -p Hi
expect_status 0 "a plain prompt needs no template"
run quantize --to f16 "$hf" -o "$T/hfbad.kvp"
expect_status 0 "quantize converts the folder"
expect_err_has "note: $hf/tokenizer_config.json:1:" "with a note naming the file"
expect_err_has "(the output has no chat template)" "and what it means"

# ---- a BPE GGUF that names no pre-tokenizer (tokenizer.ggml.pre missing):
# llama.cpp's 'default' one, as llama.cpp takes it, and one note saying so.
# The vocabulary of scripts/ref/gen_tokenizer_default.py, whose pair merges
# show the cuts: llama.cpp gives these ids (tok_default.txt), where GPT-2's
# pattern keeps "1234" and "'s" whole ----
nopre="$KVP_TESTS/golden/tok_default_vocab.bin"
printf '%s\n' '{"prompt":"1234"}' "{\"prompt\":\"it's 2024... ok?\"}" >"$T/nopre.jsonl"
run prefill --tokenize --json -m "$nopre" -f "$T/nopre.jsonl"
expect_status 0 "--tokenize a vocabulary without tokenizer.ggml.pre"
expect_out_has '"ids":[304,51,52],' "1234 as 123 and 4, as llama.cpp cuts it"
expect_out_has '"ids":[1140,39,115,32,50,810,52,1353,46,2414,107,63],' "it's 2024... ok? as llama.cpp cuts it"
expect_err_has "prefill: note: $nopre: no tokenizer.ggml.pre: tokenized with llama.cpp's 'default' pre-tokenizer" \
    "a note names the file and the pre-tokenizer assumed"
expect_err_one_line "said once for the load, not once a prompt"

# ---- an HF folder whose tokenizer.json normalizes to NFC (Qwen2's,
# GPT-NeoX's): the text between the added tokens HF matches first is put in
# NFC before it is cut into words. The small byte-level tokenizer.json of
# scripts/ref/gen_tokenizer_nfc.py, whose one-token precomposed letters and
# combining marks show it; HF tokenizers gives these ids (tok_nfc.txt's kind):
# "e" U+0301 twice is "é" twice (999), "cafe" U+0301 the added token "café"
# (1139, matched after NFC), <|endoftext|> (1134, matched before) keeps the
# U+0301 after it apart (1023). Any other normalizer is refused, naming it ----
nfc="$T/nfc"
mkdir "$nfc" && cp "$KVP_TESTS/golden/engine_hf/gqa1_hd32_tied/config.json" \
    "$KVP_TESTS/golden/engine_hf/gqa1_hd32_tied/model.safetensors" "$nfc/"
cp "$KVP_TESTS/golden/tok_nfc_tokenizer.json" "$nfc/tokenizer.json"
printf '%s\n' '{"prompt":"e\u0301e\u0301 cafe\u0301<|endoftext|>\u0301"}' >"$T/nfc.jsonl"
run prefill --tokenize --json -m "$nfc" -f "$T/nfc.jsonl"
expect_status 0 "--tokenize with an NFC normalizer"
expect_out_has '"ids":[999,999,32,1139,1134,1023],' "decomposed text gets HF's ids: NFC between the added tokens"
expect_err_empty "no note: NFC is applied, nothing is left out"
for ty in NFKC NFD Lowercase StripAccents; do
    sed "s/\"type\":\"NFC\"/\"type\":\"$ty\"/" "$KVP_TESTS/golden/tok_nfc_tokenizer.json" >"$nfc/tokenizer.json"
    run prefill --tokenize --json -m "$nfc" -f "$T/nfc.jsonl"
    expect_status 1 "a $ty normalizer is refused, not skipped"
    expect_err_has "prefill: $nfc/tokenizer.json: normalizer: \"$ty\" is not supported" "the message names the file and $ty"
    expect_out_empty "no ids for $ty"
done

need_model
nl='
'
# A vocabulary alone (llama.cpp's ggml-vocab-*.gguf: metadata, no tensor):
# --tokenize reads only that; here the model's first 16 MB (its metadata
# and more) with the tensor count set to 0
head -c 16000000 "$M" >"$T/vocab.gguf"
printf '\0\0\0\0\0\0\0\0' | dd of="$T/vocab.gguf" bs=1 seek=8 conv=notrunc 2>/dev/null
run prefill --tokenize -m "$M" --chat -p "Hi there" --json
cp "$OUT" "$T/full-ids.json"
run prefill --tokenize -m "$T/vocab.gguf" --chat -p "Hi there" --json
expect_status 0 "--tokenize with a vocabulary-only GGUF"
expect_out_file "$T/full-ids.json" "the model's ids and pieces, its chat template and system message too"
run prefill --tokenize -m "$T/vocab.gguf" --tokens 1,2
expect_status 0 "--tokens against the vocabulary's size"
run decode -m "$T/vocab.gguf" -p hi
expect_status 1 "decode of a vocabulary-only file: refused"
expect_err_has "tensor token_embd.weight is missing" "says what is missing"
rm -f "$T/vocab.gguf"
# several prompts: a line "# ID" before each, an id's newline and control
# bytes escaped (a raw newline split the header)
printf '%s\n' '{"id":"a\"b\nc\u0001\\","prompt":"x"}' '{"id":"7x","prompt":"z"}' >"$T/ids.jsonl"
run prefill --tokenize -m "$M" -f "$T/ids.jsonl"
expect_status 0 "--tokenize, ids with control characters"
expect_true "the id's header is one line, escaped" grep -qxF '# a"b\nc\x01\\' "$OUT"
expect_true "a plain id as it is" grep -qxF '# 7x' "$OUT"
expect_true "four lines: two headers, two tokens" test "$(wc -l <"$OUT")" -eq 4
# from a pipe a prompt's tokens come out once the next prompt is read, not
# at the end of the input (they waited there in stdout's buffer)
mkfifo "$T/tfifo"
prefill --tokenize -m "$M" -f - --json <"$T/tfifo" >"$T/tok.out" 2>"$T/tok.err" &
pid=$!
exec 7>"$T/tfifo"
printf '{"id":"t1","prompt":"One"}\n{"id":"t2","prompt":"Two"}\n' >&7
i=0
while [ ! -s "$T/tok.out" ] && [ $i -lt 600 ] && kill -0 $pid 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
expect_true "--tokenize -f -: the first prompt's tokens before the input ends" grep -q '"id":"t1"' "$T/tok.out"
printf '{"id":"t3","prompt":"Three"}\n' >&7
exec 7>&-
wait $pid
expect_true "then the rest, at the end" test "$(grep -c '"id":"t[123]"' "$T/tok.out")" -eq 3
rm -f "$T/tfifo"
P="<|im_start|>user${nl}Hi<|im_end|>"

# The issue's example: llama.cpp and HF give [1, 4093, 198, 26843, 2].
run prefill --tokenize -m "$M" -p "$P"
expect_status 0 "--tokenize"
cat >"$T/want.txt" <<'E'
     1 -> '<|im_start|>'
  4093 -> 'user'
   198 -> '\n'
 26843 -> 'Hi'
     2 -> '<|im_end|>'
E
expect_out_file "$T/want.txt" "one line per token, id and escaped piece, markers as special ids"
expect_err_empty "no stderr"

run prefill --tokenize --json -m "$M" -p "$P"
expect_status 0 "--tokenize --json"
printf '%s\n' '{"ids":[1,4093,198,26843,2],"pieces":["<|im_start|>","user","\n","Hi","<|im_end|>"]}' >"$T/want.json"
expect_out_file "$T/want.json" "--json gives ids and pieces"

run_sh "printf '%s' '$P' | prefill --tokenize -m '$M' --json"
expect_status 0 "--tokenize reads standard input"
expect_out_file "$T/want.json" "standard input tokenizes as -p"
printf '%s' "$P" >"$T/p.txt"
run prefill --tokenize -m "$M" --json -f "$T/p.txt"
expect_out_file "$T/want.json" "a plain text file is parsed for special tokens too"

run prefill --tokenize --no-special --json -m "$M" -p "$P"
expect_status 0 "--no-special"
expect_out_lacks '"ids":[1,' "--no-special: <|im_start|> is not id 1"
expect_out_has '"<","|","im","_","start","|",">","user"' "--no-special: the marker is text"

# --chat renders what SmolLM2's chat template renders, its default system
# turn included (ids from transformers 4.x: AutoTokenizer.from_pretrained(
# gguf_file=the Q4_1 GGUF), apply_chat_template(add_generation_prompt=True)
# and that text tokenized, with and without a system message)
run prefill --tokenize --json --chat -m "$M" -p "Hi there"
expect_out_has '"ids":[1,9690,198,2683,359,253,5356,5646,11173,3365,3511,308,34519,28,7018,411,407,19712,8182,2,198,1,4093,198,26843,665,2,198,1,520,9531,198]' \
    "--chat: the template's default system turn, as HF renders it"
run prefill --tokenize --json --chat --system "Be brief." -m "$M" -p "Hi there"
expect_out_has '"ids":[1,9690,198,6077,5453,30,2,198,1,4093,198,26843,665,2,198,1,520,9531,198]' \
    "--system replaces it, as a system message does in HF's"
printf '%s\n' '{"messages":[{"role":"user","content":"Hi there"}]}' >"$T/msgs.jsonl"
run prefill --tokenize --json -m "$M" -f "$T/msgs.jsonl"
expect_out_has '"ids":[1,9690,198,2683,359,253,5356,5646,11173,3365,3511,308,34519,28,7018,411,407,19712,8182,2,198,1,4093,198,26843,665,2,198,1,520,9531,198]' \
    "a messages line without a system turn gets the default too"
# --chat: the message is literal, the template's markers special
# (--system "": no system turn at all)
run prefill --tokenize --json --chat --system "" -m "$M" -p "Hi<|im_end|>"
expect_status 0 "--tokenize --chat"
printf '%s\n' '{"ids":[1,4093,198,26843,44,108,306,79,486,108,46,2,198,1,520,9531,198],"pieces":["<|im_start|>","user","\n","Hi","<","|","im","_","end","|",">","<|im_end|>","\n","<|im_start|>","ass","istant","\n"]}' >"$T/chat.json"
expect_out_file "$T/chat.json" "a message cannot close its own turn"

cat >"$T/p.jsonl" <<'J'
{"id":"a","prompt":"<|im_start|>user\nHi<|im_end|>"}
{"id":"b","messages":[{"role":"user","content":"Hi<|im_end|>"}]}
J
run prefill --tokenize --json --system "" -m "$M" -f "$T/p.jsonl"
expect_status 0 "--tokenize a JSON Lines file"
expect_out_has '{"id":"a","ids":[1,4093,198,26843,2],' "\"prompt\" is parsed for special tokens"
expect_out_has '{"id":"b","ids":[1,4093,198,26843,44,108,306,79,486,108,46,2,198,1,520,9531,198],' "\"messages\" contents stay literal"
run prefill --tokenize -m "$M" -f "$T/p.jsonl"
expect_out_has "# b" "text output names each prompt"

run prefill --tokenize -m "$M" -p "a	é😀"
cat >"$T/esc.txt" <<'E'
    81 -> 'a'
   197 -> '\t'
  2756 -> 'é'
 10813 -> '\xf0\x9f'
   242 -> '\x98'
   218 -> '\x80'
E
expect_out_file "$T/esc.txt" "pieces: control bytes and parts of a character escaped"
run prefill --tokenize -m "$M" --tokens 1,4093
expect_out_has "  4093 -> 'user'" "--tokens: pieces of given ids"

# -f is read a prompt at a time: a bad line fails the job after the
# prompts before it are printed, naming the file and line; a one-line
# file's prompt is not named (as -p's), a longer file's are.
printf '%s\n' '{"id":"x","prompt":"Hi"}' '{"id":"y","prompt":"Hi there"}' '{"id":"z","prompt":""}' \
    '{"id":"w","prompt":"Hi"}' >"$T/bad.jsonl"
run prefill --tokenize -m "$M" --json -f "$T/bad.jsonl"
expect_status 1 "an empty prompt on line 3 fails --tokenize"
expect_err_has "bad.jsonl:3: prompt z is empty" "the error names the file, line and id (not a count read as the index)"
expect_true "the two prompts before it were printed" test "$(grep -c '"id":"[xy]"' "$OUT")" -eq 2
expect_out_lacks '"id":"w"' "nothing after it"
printf '%s\n' '{"prompt":"Hi"}' '{"prompt":"Hi"}' '{"prompt":"Hi" x' >"$T/bad2.jsonl"
run prefill --tokenize -m "$M" -f "$T/bad2.jsonl"
expect_status 1 "a line that is not JSON fails --tokenize"
expect_err_has "bad2.jsonl:3" "named with its line"
expect_true "the prompts before it were printed, each named" test "$(grep -c '^# [01]$' "$OUT")" -eq 2
printf '%s\n' '{"prompt":"Hi"}' >"$T/one.jsonl"
run prefill --tokenize -m "$M" --json -f "$T/one.jsonl"
printf '%s\n' '{"ids":[26843],"pieces":["Hi"]}' >"$T/one.want"
expect_out_file "$T/one.want" "a one-line file's prompt is not named"

# prefill and decode parse the markers: a hand-written ChatML prompt is --chat's.
run_sh "prefill -m '$M' -t 2 -n 1 -p '$P' | kvdump --json"
expect_status 0 "prefill of a prompt with special tokens"
expect_out_has '"token_ids":[1,4093,198,26843,2]' "kvdump shows the special ids prefill used"
run_sh "prefill -m '$M' -t 2 -n 1 -p '$P' | kvdump"
expect_out_has "ids [1 4093 198 26843 2]" "kvdump's listing shows them too"
run decode -m "$M" -t 2 -n 12 --chat --system "" -p "What is the capital of France?"
cp "$OUT" "$T/chat.out"
run decode -m "$M" -t 2 -n 12 -p "<|im_start|>user${nl}What is the capital of France?<|im_end|>${nl}<|im_start|>assistant${nl}"
expect_status 0 "decode of a hand-written ChatML prompt"
expect_out_file "$T/chat.out" "gives what --chat gives"
run decode -m "$M" -t 2 -n 12 --no-special -p "<|im_start|>user${nl}What is the capital of France?<|im_end|>${nl}<|im_start|>assistant${nl}"
expect_status 0 "decode --no-special"
if cmp -s "$OUT" "$T/chat.out"; then fail "--no-special changed nothing"; else pass "--no-special takes the markers as text"; fi
done_testing
