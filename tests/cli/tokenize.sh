# Special tokens in prompts and seeing the tokens: prefill --tokenize,
# --no-special, --chat's literal messages, kvdump's token ids; on the real
# model (SmolLM2-135M-Instruct Q4_1) where cached.
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
