# Faults, part 2: output that cannot be written (a full disk, a full file
# system, a closed pipe), kills in the middle of writing a model or KV file,
# input cut short on a pipe, and memory limits.
#
# What must hold: write errors exit 1 with one line naming the output; a
# closed pipe ends a program quietly (exit 0 or 141); no partial file is ever
# left under the final name; after SIGINT, SIGTERM, SIGHUP, SIGPIPE,
# SIGXFSZ or any other signal that ends a process no temporary file either
# (lib/io.c removes it; only SIGKILL leaves it); every reader of a cut-off stream exits 1 naming the byte offset; an
# allocation that cannot be made is an error naming its size, not a crash.
. "$KVP_TESTS/cli/lib.sh"
. "$KVP_TESTS/cli/faults.lib"

mkdir "$T/w"
W="$T/w" # outputs go here, so leftovers are easy to see
"$KVP_UNIT_DIR/test_stream" --write-sample "$T/s.kvp" || { status=1; fail "could not write the sample stream"; }
"$KVP_UNIT_DIR/test_convert" --write-kv-sample "$T/kv.kvp" || { status=1; fail "could not write the KV sample"; }
"$KVP_UNIT_DIR/test_convert" --write-gguf "$T/tiny.gguf" || { status=1; fail "could not write the tiny GGUF"; }
M="$KVP_MODEL"
have_model=0
[ -f "$M" ] && have_model=1
[ $have_model = 1 ] || echo "note: $M absent (scripts/fetch-model): the tests on the real model are skipped"
# The smallest run of each engine program.
printf '{"id":"a","prompt":"The capital of France is"}\n{"id":"b","prompt":"Name a fruit."}\n' >"$T/p.jsonl"

# ---- helpers ----

# full_stdout PROG DESC CMD...: CMD's stdout is /dev/full: exit 1, one line.
full_stdout() {
    _p=$1 _d=$2
    shift 2
    if [ ! -c /dev/full ]; then
        echo "note: /dev/full is not a device here: $_p: $_d to a full disk not tested"
        return
    fi
    LAST_CMD="$* > /dev/full"
    "$@" </dev/null >/dev/full 2>"$ERR"
    status=$?
    : >"$OUT"
    _why=$(check_err_lines "$_p" 1 "")
    if [ "$status" -eq 1 ] && [ -z "$_why" ]; then pass "$_p: $_d to a full disk: exit 1, one line"; else
        fail "$_p: $_d to a full disk ${_why:-(wanted exit 1)}"; fi
}

# closed_pipe PROG DESC CMD...: CMD | head -c 1: exit 0 or 141, nothing on stderr.
closed_pipe() {
    _p=$1 _d=$2
    shift 2
    LAST_CMD="$* | head -c 1"
    { "$@" </dev/null 2>"$ERR"; echo $? >"$T/rc"; } | head -c 1 >/dev/null
    status=$(cat "$T/rc")
    : >"$OUT"
    if { [ "$status" -eq 0 ] || [ "$status" -eq 141 ]; } && [ ! -s "$ERR" ]; then
        pass "$_p: $_d into a closed pipe ends quietly"
    else
        fail "$_p: $_d into a closed pipe (wanted exit 0 or 141 and no stderr)"
    fi
}

# nothing_left NAME DESC: neither W/NAME nor a temporary W/NAME.tmp.* exists.
nothing_left() {
    _left=$(ls "$W" | grep -F "$1" | tr '\n' ' ')
    if [ -z "$_left" ]; then pass "$2: nothing left"; else fail "$2: left $_left"; fi
}

# midwrite SIG OUT FEED CMD...: run CMD in the foreground (a background job of
# a script has SIGINT ignored) while a helper in the background waits until
# CMD's temporary file OUT.tmp.* holds data, stops CMD (SIGSTOP), notes
# whether OUT exists, then sends SIG and lets CMD go on (SIGCONT).  FEED, when
# not empty, is FILE:BYTES: CMD's stdin is a FIFO through which the helper
# writes the first BYTES of FILE and which it keeps open, so CMD waits
# mid-stream: deterministic.  Sets $status and $mid (caught, missed, ...).
midwrite() {
    _sig=$1 _out=$2 _feed=$3
    shift 3
    LAST_CMD="$* (SIG$_sig mid-write)"
    rm -f "$T/pid" "$T/mid" "$T/fifo"
    [ -n "$_feed" ] && mkfifo "$T/fifo"
    (
        if [ -n "$_feed" ]; then
            exec 3>"$T/fifo"
            head -c "${_feed##*:}" "${_feed%:*}" >&3
        fi
        _i=0 _pid=
        while [ $_i -lt 1000 ]; do
            [ -z "$_pid" ] && [ -s "$T/pid" ] && _pid=$(cat "$T/pid")
            if [ -n "$_pid" ]; then
                for _f in "$_out".tmp.*; do :; done
                if [ -s "$_f" ]; then
                    kill -STOP "$_pid"
                    if [ ! -e "$_f" ]; then
                        echo missed >"$T/mid" # renamed into place before it stopped
                    elif [ -e "$_out" ]; then
                        echo "the final name exists mid-write" >"$T/mid"
                    else
                        echo caught >"$T/mid"
                    fi
                    kill -"$_sig" "$_pid"
                    kill -CONT "$_pid"
                    exit 0
                fi
                if ! kill -0 "$_pid" 2>/dev/null; then
                    echo missed >"$T/mid"
                    exit 0
                fi
            fi
            sleep 0.01
            _i=$((_i + 1))
        done
        echo "timed out waiting for the temporary file" >"$T/mid"
        [ -n "$_pid" ] && kill -KILL "$_pid"
    ) &
    _helper=$!
    if [ -n "$_feed" ]; then
        sh -c 'echo $$ >"$0"; exec "$@"' "$T/pid" "$@" <"$T/fifo" >"$OUT" 2>"$ERR"
    else
        sh -c 'echo $$ >"$0"; exec "$@"' "$T/pid" "$@" </dev/null >"$OUT" 2>"$ERR"
    fi
    status=$?
    wait $_helper
    mid=$(cat "$T/mid" 2>/dev/null)
}

# after_kill SIG NAME DESC: the checks after midwrite.
after_kill() {
    case $1 in INT) _want=130 ;; HUP) _want=129 ;; TERM) _want=143 ;; KILL) _want=137 ;; USR1) _want=138 ;;
    ALRM) _want=142 ;; XCPU) _want=152 ;; SEGV) _want=139 ;; *) _want=999 ;; esac
    if [ "$mid" != caught ]; then
        fail "$3: SIG$1 mid-write: $mid"
        return
    fi
    if [ "$status" -eq "$_want" ]; then pass "$3: SIG$1 mid-write ends it by that signal"; else
        fail "$3: SIG$1 mid-write (wanted exit $_want)"; fi
    expect_true "$3: SIG$1: no file under the final name" test ! -e "$W/$2"
    if [ "$1" = KILL ]; then
        # nothing can run on SIGKILL: the temporary file stays, the final name never appears
        rm -f "$W/$2".tmp.*
    else
        nothing_left "$2" "$3: SIG$1"
    fi
}

# cut_pipe N FILE CMD...: CMD reads the first N bytes of FILE from a writer
# that then dies by SIGKILL (as a producer killed mid-stream).
cut_pipe() {
    _n=$1 _f=$2
    shift 2
    LAST_CMD="head -c $_n $_f (writer killed) | $*"
    { sh -c 'head -c "$0" "$1"; kill -KILL $$' "$_n" "$_f" | "$@" >"$OUT" 2>"$ERR"; } 2>/dev/null
    status=$?
}

# truncated PROG DESC OFFSET: exit 1, one line naming the byte offset.
truncated() {
    _why=$(check_err_lines "$1" 1 "offset $3")
    if [ "$status" -eq 1 ] && [ -z "$_why" ]; then pass "$1: $2: exit 1 naming offset $3"; else
        fail "$1: $2 ${_why:-(wanted exit 1)}"; fi
}

# ---- a full disk: stdout is /dev/full ----

full_stdout kvdump "the listing" kvdump "$T/s.kvp"
full_stdout kvdump "--json" kvdump --json "$T/s.kvp"
full_stdout kvdump "--summary" kvdump --summary "$T/s.kvp"
name=$(kvdump --json "$T/s.kvp" | sed -n 's/.*"kind":"tensor".*"name":"\([^"]*\)".*/\1/p')
full_stdout kvdump "--extract" kvdump --extract "$name" "$T/s.kvp"
full_stdout kvdump "--help" kvdump --help
full_stdout kvdump "--version" kvdump --version
full_stdout kvcalc "a report" kvcalc -m llama-3-8b --gpu h100
full_stdout kvcalc "--json" kvcalc -m llama-3-8b --json
full_stdout kvcalc "a --tsv sweep" kvcalc -m llama-3-8b --seq-len 1024:65536:1024 --tsv
full_stdout kvcalc "--list-models" kvcalc --list-models
full_stdout kvcalc "--help" kvcalc --help
full_stdout quantize "a model (-o -)" quantize --to f16 --drop weird "$T/tiny.gguf" -o -
full_stdout quantize "KV blocks (--kv)" quantize --kv fp8 "$T/kv.kvp"
full_stdout quantize "--dry-run" quantize -n --to f16 --drop weird "$T/tiny.gguf"
full_stdout quantize "--report -" quantize --to f16 --drop weird "$T/tiny.gguf" -o "$W/rep.kvp" --report -
rm -f "$W/rep.kvp"
full_stdout quantize "--help" quantize --help
# -o onto a FIFO (or a device) is written in place, not replaced by a
# renamed file.  (Never try this on /dev/full or /dev/null: as root, a
# faulty build would replace the device node for the whole machine.)
mkfifo "$T/fifo"
cat "$T/fifo" >"$T/fromfifo" &
reader=$!
run quantize --to f16 --drop weird "$T/tiny.gguf" -o "$T/fifo"
# Release the reader even if quantize never opened the FIFO: an O_RDWR open
# of a FIFO never blocks on Linux, and closing it gives cat its end of file.
[ -p "$T/fifo" ] && { exec 4<>"$T/fifo"; exec 4>&-; }
expect_status 0 "quantize: -o FIFO"
if [ -p "$T/fifo" ]; then
    pass "quantize: -o FIFO: the FIFO is written in place, not replaced"
    wait $reader
    run kvdump --check "$T/fromfifo"
    expect_status 0 "quantize: -o FIFO: the reader got the whole model"
else
    fail "quantize: -o FIFO: the FIFO was replaced by a file"
    kill $reader 2>/dev/null
    wait $reader
fi
for p in prefill decode; do
    full_stdout $p "--version" $p --version
    "$p" --help >/dev/full 2>"$ERR"
    expect_true "$p: --help to a full disk: exit 1" test $? -eq 1
done

# ---- a full file system for -o: the file size limit (SIGXFSZ ignored: EFBIG) ----

run_sh "trap '' XFSZ; ulimit -f 4; exec quantize --to f32 --drop weird '$T/tiny.gguf' -o '$W/big.kvp'"
truncated quantize "a model onto a full file system" ""
expect_err_has "big.kvp" "quantize: the write error names the output"
nothing_left big.kvp "quantize: a model onto a full file system"
run_sh "trap '' XFSZ; ulimit -f 4; exec quantize --kv f32 '$T/kv.kvp' -o '$W/kvbig.kvp'"
truncated quantize "KV blocks onto a full file system" ""
nothing_left kvbig.kvp "quantize --kv onto a full file system"
# ... and with SIGXFSZ at its default, the kernel kills the writer mid-write
run_sh "ulimit -f 4; exec quantize --to f32 --drop weird '$T/tiny.gguf' -o '$W/xfsz.kvp'"
expect_status 153 "quantize: killed by SIGXFSZ mid-write"
nothing_left xfsz.kvp "quantize: killed by SIGXFSZ mid-write"

# ---- a closed pipe ----

closed_pipe kvdump "the listing" kvdump "$T/s.kvp"
closed_pipe kvdump "--json" kvdump --json "$T/s.kvp"
closed_pipe kvcalc "a long --tsv sweep" kvcalc -m llama-3-8b --seq-len 1:60000:1 --tsv
closed_pipe kvcalc "--list-models" kvcalc --list-models
closed_pipe quantize "a model (-o -)" quantize --to f32 --drop weird "$T/tiny.gguf" -o -
closed_pipe quantize "KV blocks" quantize --kv f32 "$T/kv.kvp"
closed_pipe quantize "--dry-run" quantize -n --to f16 --drop weird "$T/tiny.gguf"
closed_pipe kvdump "--help" kvdump --help
closed_pipe prefill "--help" prefill --help
closed_pipe decode "--help" decode --help

# ---- kills in the middle of writing: KV blocks through quantize --kv ----
# quantize reads the first 7232 bytes (header, config, sequence, two blocks),
# writes them to its temporary file and waits for the rest: deterministic.

# Started under nohup (SIGHUP ignored), a program keeps it ignored, as it
# should: SIGHUP then cannot end it, so that case is left out.
hup=HUP
if [ -r /proc/$$/status ] &&
    [ $((0x$(sed -n 's/^SigIgn:[[:space:]]*//p' /proc/$$/status) & 1)) -ne 0 ]; then
    echo "note: SIGHUP is ignored here (nohup?): the SIGHUP case is skipped"
    hup=
fi
# USR1, ALRM, XCPU (a CPU time limit) and SEGV end a process by default too:
# the handler removes the temporary file for every such signal.  (Under
# AddressSanitizer, SEGV is the sanitizer's to report: that case is left out.)
segv=SEGV
if under_asan quantize; then
    echo "note: under AddressSanitizer SIGSEGV is the sanitizer's: the SIGSEGV case is skipped"
    segv=
fi
for sig in INT TERM $hup USR1 ALRM XCPU $segv KILL; do
    midwrite $sig "$W/kvk.kvp" "$T/kv.kvp:7232" quantize --kv fp8 -o "$W/kvk.kvp"
    after_kill $sig kvk.kvp "quantize --kv"
done

# ---- input that ends early on a pipe: every reader names the offset ----

for cut in 20:20 64:64 100:64 5000:5000 10816:10816; do
    n=${cut%:*} off=${cut#*:}
    cut_pipe "$n" "$T/kv.kvp" kvdump --check
    truncated kvdump "a stream cut at byte $n" "$off"
    cut_pipe "$n" "$T/kv.kvp" quantize --kv fp8 -o "$W/cut.kvp"
    truncated quantize "--kv: a stream cut at byte $n" "$off"
    nothing_left cut.kvp "quantize --kv: a stream cut at byte $n"
done
cut_pipe 0 "$T/kv.kvp" kvdump --check
_why=$(check_err_lines kvdump 1 "empty input")
if [ "$status" -eq 1 ] && [ -z "$_why" ]; then pass "kvdump: a writer that dies before writing"; else fail "kvdump: nothing from a dead writer ${_why:-}"; fi

# a model file cut short (a copy interrupted): quantize reads KVP models
quantize --to f16 --drop weird "$T/tiny.gguf" -o "$T/g.kvp" 2>/dev/null
gend=$(kvdump --json "$T/g.kvp" | sed -n 's/.*"kind":"end".*"offset":\([0-9]*\).*/\1/p')
for cut in 30:30 64:64 200:64 1000:832 "$gend:$gend"; do
    n=${cut%:*} off=${cut#*:}
    head -c "$n" "$T/g.kvp" >"$T/gcut.kvp"
    run quantize --to f32 "$T/gcut.kvp" -o "$W/gcut.kvp"
    truncated quantize "a KVP model cut at byte $n" "$off"
    nothing_left gcut.kvp "quantize: a KVP model cut at byte $n"
done

if [ $have_model = 0 ]; then
    done_testing
    exit $?
fi

# ---- the real model ----

# full disk and closed pipe
full_stdout prefill "a KV stream" prefill -m "$M" -t 2 -f "$T/p.jsonl"
full_stdout decode "text" decode -m "$M" -t 2 -p "The capital of France is" -n 4
full_stdout decode "JSON Lines" decode -m "$M" -t 2 -f "$T/p.jsonl" -n 4
closed_pipe prefill "a KV stream" prefill -m "$M" -t 2 -f "$T/p.jsonl"
closed_pipe decode "JSON Lines" decode -m "$M" -t 2 -f "$T/p.jsonl" -n 4
closed_pipe decode "text" decode -m "$M" -t 2 -p "The capital of France is" -n 8

# a full file system under -o and --kv-out; a SIGXFSZ kill
run_sh "trap '' XFSZ; ulimit -f 100; exec prefill -m '$M' -t 2 -f '$T/p.jsonl' -o '$W/pf.kvp'"
truncated prefill "-o onto a full file system" ""
expect_err_has "pf.kvp" "prefill: the write error names the output"
nothing_left pf.kvp "prefill -o onto a full file system"
run_sh "trap '' XFSZ; ulimit -f 100; exec decode -m '$M' -t 2 -f '$T/p.jsonl' -n 2 --kv-out '$W/dk.kvp'"
truncated decode "--kv-out onto a full file system" ""
nothing_left dk.kvp "decode --kv-out onto a full file system"
# a result line that does not fit is taken back: --resume's file, and a
# file standard output was opened on with `>`, end in whole lines (the
# file stops 10 bytes short of the size limit, so the next line is cut)
unit=$(sh -c "trap '' XFSZ; ulimit -f 1; head -c 2000 /dev/zero >'$T/unit' 2>/dev/null; wc -c <'$T/unit'")
printf '{"id":"pad","text":"%s"}\n' "$(head -c $((4 * unit - 38)) /dev/zero | tr '\0' x)" >"$W/r.jsonl"
cp "$W/r.jsonl" "$T/r0.jsonl"
run_sh "trap '' XFSZ; ulimit -f 4; exec decode -m '$M' -t 2 -f '$T/p.jsonl' -n 2 --resume '$W/r.jsonl'"
expect_status 1 "decode --resume onto a full file system fails"
expect_err_has "r.jsonl: File too large" "it names the results file"
if cmp -s "$W/r.jsonl" "$T/r0.jsonl"; then pass "the part-written line is cut off: the results file is as it was"; else
    fail "the results file ends in a part-written line ($(wc -c <"$W/r.jsonl") bytes, wanted $(wc -c <"$T/r0.jsonl"))"; fi
LAST_CMD="(cat r.jsonl; exec decode ...) > s.jsonl, 4 blocks at most"
sh -c "trap '' XFSZ; ulimit -f 4; cat '$T/r0.jsonl'; exec decode -m '$M' -t 2 -f '$T/p.jsonl' -n 2" >"$W/s.jsonl" 2>"$ERR"
status=$?
expect_status 1 "decode > FILE onto a full file system fails"
if cmp -s "$W/s.jsonl" "$T/r0.jsonl"; then pass "standard output's file ends in whole lines"; else
    fail "standard output's file ends in a part-written line"; fi
rm -f "$W/r.jsonl" "$W/s.jsonl"
run_sh "ulimit -f 100; exec prefill -m '$M' -t 2 -f '$T/p.jsonl' -o '$W/pfx.kvp'"
expect_status 153 "prefill: killed by SIGXFSZ mid-write"
nothing_left pfx.kvp "prefill: killed by SIGXFSZ mid-write"
run_sh "ulimit -f 100; exec decode -m '$M' -t 2 -f '$T/p.jsonl' -n 2 --kv-out '$W/dkx.kvp'"
expect_status 153 "decode: killed by SIGXFSZ mid-write"
nothing_left dkx.kvp "decode: killed by SIGXFSZ mid-write"

# kills in the middle of writing a model (about 2 s of writing: the helper
# catches it at its first bytes)
for sig in INT TERM KILL; do
    midwrite $sig "$W/m8.kvp" "" quantize --to q8_0 --threads 2 "$M" -o "$W/m8.kvp"
    after_kill $sig m8.kvp "quantize SmolLM2"
done
# SIGPIPE: the --report reader goes away while the model is written
LAST_CMD="quantize --to q8_0 M -o m.kvp --report - | head -c 1"
{ quantize --to q8_0 --threads 2 "$M" -o "$W/mp.kvp" --report - 2>"$ERR"; echo $? >"$T/rc"; } | head -c 1 >/dev/null
status=$(cat "$T/rc")
tmps=$(ls "$W" | grep -c '^mp\.kvp')
if [ "$status" -eq 141 ] && [ "$tmps" -eq 0 ]; then
    pass "quantize: the --report reader gone mid-write: SIGPIPE, nothing left"
elif [ "$status" -eq 0 ] && kvdump --check "$W/mp.kvp" 2>/dev/null; then
    pass "quantize: the --report reader gone: finished first, the model is whole"
else
    fail "quantize: the --report reader gone mid-write (wanted 141)"
fi
rm -f "$W/mp.kvp"

# prefill -o: its write is too short to catch every time; a signal at any
# moment leaves either a whole file or nothing, and never a temporary file
# (decode --kv-out goes through the same kvp_run_save: the SIGXFSZ tests).
# A caught signal stops prefill as it stops decode: the sequences done are
# written, a whole stream, and renamed into place (or nothing, caught
# before the first).
printf '{"id":"%s","prompt":"%s"}\n' x "Once upon a time, in a land far away, there lived a king who had three daughters and a great many horses." \
    y "In the beginning the universe was created. This has made a lot of people very angry and been widely regarded as a bad move." \
    >"$T/long.jsonl"
for sig in INT TERM; do
    midwrite $sig "$W/pk.kvp" "" prefill -m "$M" -t 2 --kv-dtype f32 -f "$T/long.jsonl" -o "$W/pk.kvp"
    # one verdict whichever moment the signal hit, so the count is stable
    tmps=$(ls "$W" | grep -c '^pk\.kvp\.tmp\.')
    if [ "$mid" = caught ] && [ ! -e "$W/pk.kvp" ] && [ "$tmps" -eq 0 ]; then
        pass "prefill -o: SIG$sig mid-write: nothing left"
    elif [ "$mid" = caught ] && [ "$tmps" -eq 0 ] && kvdump --check "$W/pk.kvp" >/dev/null 2>&1; then
        pass "prefill -o: SIG$sig: stopped, the sequences done written whole, no temporary left"
    elif [ "$mid" = missed ] && [ "$tmps" -eq 0 ] && kvdump --check "$W/pk.kvp" >/dev/null 2>&1; then
        pass "prefill -o: SIG$sig after the write: the file is whole, no temporary left"
    else
        fail "prefill -o: SIG$sig: $mid, $tmps temporary files, final: $(ls "$W" | grep -c '^pk\.kvp$')"
    fi
    rm -f "$W/pk.kvp"
done

# input that ends early on a pipe: decode reading prefill's stream
prefill -m "$M" -t 2 -p "The capital of France is" -o "$T/pf.kvp" 2>/dev/null
size=$(wc -c <"$T/pf.kvp" | tr -d ' ')
end=$(kvdump --json "$T/pf.kvp" | sed -n 's/.*"kind":"end".*"offset":\([0-9]*\).*/\1/p')
for cut in 30:30 64:64 100:64 100000:100000 "$end:$end"; do
    n=${cut%:*} off=${cut#*:}
    cut_pipe "$n" "$T/pf.kvp" decode -m "$M" -t 2 -n 2
    truncated decode "a KV stream cut at byte $n of $size" "$off"
done
cut_pipe 100000 "$T/pf.kvp" decode -m "$M" -t 2 -n 2 --kv-out "$W/resume.kvp"
nothing_left resume.kvp "decode: a cut stream writes no --kv-out"

# ---- memory: an allocation that cannot be made ----

if under_asan decode; then
    echo "note: sanitizer build: the ulimit -v tests are skipped"
else
    # 4 GiB of address space: the model loads, the KV pool does not
    for p in prefill decode; do
        run_sh "ulimit -v 4194304; exec $p -m '$M' -t 2 -p hi -n 1 --kv-mem 64GiB"
        _why=$(check_err_lines $p 1 "KV cache: cannot allocate")
        if [ "$status" -eq 1 ] && [ -z "$_why" ]; then pass "$p: --kv-mem 64GiB under ulimit -v: exit 1 naming the size"; else
            fail "$p: --kv-mem 64GiB under ulimit -v ${_why:-(wanted exit 1)}"; fi
        expect_err_has "MiB" "$p: the KV error names the bytes"
    done
    run_sh "ulimit -v 4194304; exec decode -m '$M' -t 2 -p hi -n 1 --kv-blocks 1000000000"
    _why=$(check_err_lines decode 1 "1000000000 blocks")
    if [ "$status" -eq 1 ] && [ -z "$_why" ]; then pass "decode: --kv-blocks 1000000000: exit 1 naming the count"; else
        fail "decode: --kv-blocks 1000000000 ${_why:-(wanted exit 1)}"; fi
    # 60 MB: the 98 MB model cannot even be mapped
    for p in "decode -p hi -n 1" "prefill -p hi" "quantize --to q8_0 -o $W/lim.kvp" "kvcalc"; do
        prog=${p%% *}
        args=${p#"$prog"}
        [ "$prog" = kvcalc ] && args=""
        run_sh "ulimit -v 60000; exec $prog -m '$M' $args"
        [ "$prog" = quantize ] && run_sh "ulimit -v 60000; exec quantize --to q8_0 '$M' -o '$W/lim.kvp'"
        _why=$(check_err_lines "$prog" 1 "cannot map the file's")
        if [ "$status" -eq 1 ] && [ -z "$_why" ]; then pass "$prog: a model larger than ulimit -v: exit 1 naming the bytes"; else
            fail "$prog: a model larger than ulimit -v ${_why:-(wanted exit 1)}"; fi
    done
    nothing_left lim.kvp "quantize under ulimit -v"
fi

# ---- a job's outputs together: one failing leaves none of the others ----
# --stats=/dev/full (a device: written in place, so its write fails as a
# full disk's would) fails the job with the --kv-out or -o stream not in
# place, and an older one under that name kept; so does a standard output
# whose last flush fails (a full disk, a closed descriptor)
if [ $have_model = 1 ] && [ -c /dev/full ]; then
    for p in decode specdec; do
        run $p -m "$M" -t 2 -n 2 -f "$T/p.jsonl" --kv-out "$W/side-$p.kvp" --stats=/dev/full
        expect_status 1 "$p --kv-out, --stats on a full disk: exit 1"
        expect_err_has "/dev/full" "$p: names the statistics file"
        nothing_left "side-$p.kvp" "$p --kv-out, --stats on a full disk"
    done
    printf 'old\n' >"$W/side-old.kvp"
    run decode -m "$M" -t 2 -n 2 -f "$T/p.jsonl" --kv-out "$W/side-old.kvp" --stats=/dev/full
    expect_status 1 "decode --kv-out over a file, --stats on a full disk: exit 1"
    expect_true "the file under --kv-out's name is the old one" test "$(cat "$W/side-old.kvp")" = old
    rm -f "$W/side-old.kvp"
    nothing_left side-old.kvp "decode --kv-out over a file, --stats on a full disk"
    run prefill -m "$M" -t 2 -f "$T/p.jsonl" -o "$W/side-pf.kvp" --stats=/dev/full
    expect_status 1 "prefill -o, --stats on a full disk: exit 1"
    nothing_left side-pf.kvp "prefill -o, --stats on a full disk"
    run prefill -m "$M" -t 2 -f "$T/p.jsonl" --stats=/dev/full
    expect_status 1 "prefill to standard output, --stats on a full disk: exit 1"
    cp "$OUT" "$T/side-cut.kvp"
    run kvdump --check "$T/side-cut.kvp"
    expect_status 1 "the stream on standard output has no END record: its reader fails too"
    # standard output failing at its last flush (one text answer, held by stdio)
    run_sh "decode -m '$M' -t 2 -n 4 -p hi --kv-out '$W/side-full.kvp' --stats='$W/side-full.json' >/dev/full"
    expect_status 1 "decode --kv-out --stats=FILE, standard output on a full disk: exit 1"
    expect_err_has "<stdout>: write error" "decode: says so"
    nothing_left side-full "decode --kv-out --stats=FILE, standard output on a full disk"
    run_sh "decode -m '$M' -t 2 -n 4 -p hi --kv-out '$W/side-closed.kvp' >&-"
    expect_status 1 "decode --kv-out, standard output closed: exit 1"
    nothing_left side-closed.kvp "decode --kv-out, standard output closed"
    printf 'The capital of France is Paris, and it is large and old. It lies on the Seine.' >"$T/side.txt"
    run_sh "prefill -m '$M' -t 2 --perplexity '$T/side.txt' --ctx 8 --chunks 2 --save-logits '$W/side-base.kvp' >/dev/full"
    expect_status 1 "prefill --perplexity --save-logits, the report on a full disk: exit 1"
    nothing_left side-base.kvp "prefill --save-logits, the report on a full disk"
    run prefill -m "$M" -t 2 --perplexity "$T/side.txt" --ctx 8 --chunks 2 --save-logits "$W/side-base.kvp"
    expect_status 0 "prefill --perplexity --save-logits"
    expect_true "the base is saved" test -s "$W/side-base.kvp"
    rm -f "$W/side-base.kvp"
fi

# ---- a signal between a job's two renames waits for the second ----
# (strace delivers SIGHUP right after the first rename: the job dies of it
# once both outputs are in place, not with the stream renamed and the
# statistics' temporary file removed, which left last run's beside it)
if [ $have_model = 1 ] && command -v strace >/dev/null 2>&1 && strace -o /dev/null true 2>/dev/null; then
    hup_after_rename() { strace -f -o /dev/null -e trace=rename -e inject=rename:signal=SIGHUP:when=1 "$@"; }
    for p in decode prefill quantize; do
        printf 'old\n' >"$W/pair-$p.2"
        case $p in
        decode) run hup_after_rename decode -m "$M" -t 2 -n 2 -f "$T/p.jsonl" --kv-out "$W/pair-$p.1" \
            --stats="$W/pair-$p.2" ;;
        prefill) run hup_after_rename prefill -m "$M" -t 2 -f "$T/p.jsonl" -o "$W/pair-$p.1" --stats="$W/pair-$p.2" ;;
        quantize) prefill -m "$M" -t 2 -p "The capital" -o "$T/pair-in.kvp" 2>/dev/null
            run hup_after_rename quantize --kv fp8 "$T/pair-in.kvp" -o "$W/pair-$p.1" -r "$W/pair-$p.2" ;;
        esac
        expect_status 129 "$p: SIGHUP after the first rename ends the job (of that signal)"
        expect_true "$p: ... after the second: both outputs in place" \
            sh -c '[ -s "$1" ] && [ "$(cat "$2")" != old ]' _ "$W/pair-$p.1" "$W/pair-$p.2"
        rm -f "$W/pair-$p.1" "$W/pair-$p.2"
        nothing_left "pair-$p" "$p: a signal between the renames"
    done
else
    echo "note: no strace (or no ptrace here): the signal between two renames is not tested"
fi

# ---- --stats=FILE that cannot be made: refused before the work ----
# (a folder missing, a folder by that name, a symlink dangling into a
# missing folder: the folder that counts is the one the link leads to), in
# prefill as in decode and specdec: no answer or stream is written first
if [ $have_model = 1 ]; then
    mkdir "$T/side-dir"
    ln -s "$T/nodir/s.json" "$T/side-dangling"
    for st in "$T/nodir/s.json" "$T/side-dir" "$T/side-dangling"; do
        run prefill -m "$M" -t 2 -f "$T/p.jsonl" --stats="$st"
        expect_status 1 "prefill --stats=${st##*/} that cannot be made: exit 1"
        expect_out_empty "prefill --stats=${st##*/}: refused before the stream is written"
        run prefill -m "$M" -t 2 -f "$T/p.jsonl" -o "$W/side-pre.kvp" --stats="$st"
        expect_status 1 "prefill -o --stats=${st##*/}: exit 1"
        nothing_left side-pre.kvp "prefill -o --stats=${st##*/}"
        for p in decode specdec; do
            run $p -m "$M" -t 2 -n 2 -f "$T/p.jsonl" --stats="$st"
            expect_status 1 "$p --stats=${st##*/} that cannot be made: exit 1"
            expect_out_empty "$p --stats=${st##*/}: refused before any answer"
        done
    done
    expect_err_has "cannot write into $T/nodir" "the message names the folder the link leads to"
    # a link dangling into a folder that is there makes its file
    ln -s "$W/side-made.json" "$T/side-link"
    for job in "decode -n 2" "prefill -o $W/side-made.kvp"; do
        run ${job%% *} -m "$M" -t 2 -f "$T/p.jsonl" --stats="$T/side-link" ${job#* }
        expect_status 0 "${job%% *} --stats through a link dangling into a folder that is there"
        expect_true "${job%% *}: the statistics are written where it leads" grep -q '"seconds"' "$W/side-made.json"
        rm -f "$W/side-made.json" "$W/side-made.kvp"
    done
    run decode -m "$M" -t 2 -n 2 -f "$T/p.jsonl" --stats=/dev/null
    expect_status 0 "decode --stats=/dev/null: written in place, not refused"
fi

# ---- NaN in the weights or in a KV stream's blocks ----
# (test_stream --rewrite nan@N: record N's data all 0xff, NaN in every
# float kind, its checksums right): every program that chooses a token or
# scores one refuses the logits, no token made up from them
if [ $have_model = 1 ]; then
    quantize --to keep "$M" -o "$T/keep.kvp" 2>/dev/null
    n=$(kvdump --json "$T/keep.kvp" | grep '"blk.0.attn_norm.weight"' | sed 's/.*"index":\([0-9]*\).*/\1/')
    "$KVP_UNIT_DIR/test_stream" --rewrite "$T/keep.kvp" "$T/nanw.kvp" "nan@$n"
    # a report to standard output is held to the end: a failed run prints none of it
    run_sh "quantize --to f16 '$T/nanw.kvp' -o '$T/nanf16.kvp' -r -"
    expect_status 1 "quantize -r -, NaN weights: refused"
    expect_out_empty "quantize -r -: no half report on standard output"
    run_sh "quantize --to f16 '$T/keep.kvp' -o '$T/f16.kvp' -r -"
    expect_out_has "blk.0.attn_norm.weight" "quantize -r -: a run that succeeds prints its report"
    rm -f "$T/f16.kvp"
    for t in 0 0.8; do
        run decode -m "$T/nanw.kvp" -t 2 -n 4 -p "The capital of France is" --temperature $t
        expect_status 1 "decode, NaN weights, temperature $t: refused"
        expect_err_has "NaN or infinity" "decode, NaN weights, temperature $t: says so"
        expect_out_empty "decode, NaN weights, temperature $t: no text made up"
    done
    run prefill -m "$T/nanw.kvp" -t 2 -p "The capital" -o "$T/nan-pf.kvp"
    expect_status 1 "prefill, NaN weights: refused"
    expect_true "prefill, NaN weights: no stream left" test ! -e "$T/nan-pf.kvp"
    printf 'The capital of France is Paris, and it is large and old.' >"$T/ppl.txt"
    run prefill -m "$T/nanw.kvp" -t 2 --perplexity "$T/ppl.txt" --ctx 8 --chunks 1
    expect_status 1 "--perplexity, NaN weights: refused, not PPL nan"
    run specdec -m "$T/nanw.kvp" -t 2 -n 4 -p "The capital of France is"
    expect_status 1 "specdec, NaN weights: refused"
    prefill -m "$M" -t 2 -p "The capital of France is" -o "$T/pf.kvp" 2>/dev/null
    "$KVP_UNIT_DIR/test_stream" --rewrite "$T/pf.kvp" "$T/nankv.kvp" nan@1
    run decode -m "$M" -t 2 -n 4 "$T/nankv.kvp"
    expect_status 1 "decode of a KV stream whose block is NaN: refused"
    expect_err_has "NaN or infinity" "names the cause"
    expect_err_has "nankv.kvp: record " "and the file and record, as it is read"
fi

done_testing
