# lib.sh - helpers for CLI tests: run a program, then check its exit status,
# stdout and stderr.  Sourced by tests/cli/*.sh; ends with "N passed, N failed".
#
#   run kvdump --check f.kvp      # sets $status; stdout in $OUT, stderr in $ERR
#   expect_status 0 "what this checks"
#   expect_out_has "text"  /  expect_err_has "text"  /  expect_out_file golden
set -u
: "${KVP_BIN:?}"
PATH="$KVP_BIN:$PATH"
# The real test model (tests/run sets it; the same rule when run by hand).
KVP_MODEL=${KVP_MODEL:-${KVPIPE_MODELS:-$HOME/.cache/kvpipe}/SmolLM2-135M-Instruct.Q4_1.gguf}
export PATH
# Threads for the programs' pools (-t): $KVP_TEST_THREADS (make tsan TSAN_MODEL=1
# runs 2 and 4), else 2.
THREADS=${KVP_TEST_THREADS:-2}
T_PASS=0
T_FAIL=0
T=$(mktemp -d "${TMPDIR:-/tmp}/kvp-cli.XXXXXX")
OUT="$T/stdout"
ERR="$T/stderr"
trap 'rm -rf "$T"' EXIT
LAST_CMD=""

run() {
    LAST_CMD="$*"
    "$@" >"$OUT" 2>"$ERR"
    status=$?
}

# run_sh 'a | b' : a pipeline; $status is the status of the last command.
run_sh() {
    LAST_CMD="$1"
    sh -c "$1" >"$OUT" 2>"$ERR"
    status=$?
}

pass() { T_PASS=$((T_PASS + 1)); echo "ok $1"; }
fail() {
    T_FAIL=$((T_FAIL + 1))
    echo "FAIL: $1"
    echo "  command: $LAST_CMD"
    echo "  exit: $status"
    echo "  stdout: $(head -c 600 "$OUT")"
    echo "  stderr: $(head -c 600 "$ERR")"
}

expect_status() { if [ "$status" -eq "$1" ]; then pass "$2"; else fail "$2 (wanted exit $1)"; fi; }
expect_out_has() { if grep -qF -- "$1" "$OUT"; then pass "$2"; else fail "$2 (stdout lacks '$1')"; fi; }
expect_out_lacks() { if grep -qF -- "$1" "$OUT"; then fail "$2 (stdout has '$1')"; else pass "$2"; fi; }
expect_err_has() { if grep -qF -- "$1" "$ERR"; then pass "$2"; else fail "$2 (stderr lacks '$1')"; fi; }
expect_err_lacks() { if grep -qF -- "$1" "$ERR"; then fail "$2 (stderr has '$1')"; else pass "$2"; fi; }
expect_err_empty() { if [ -s "$ERR" ]; then fail "$1 (stderr not empty)"; else pass "$1"; fi; }
expect_out_empty() { if [ -s "$OUT" ]; then fail "$1 (stdout not empty)"; else pass "$1"; fi; }
expect_out_file() { if cmp -s "$OUT" "$1"; then pass "$2"; else fail "$2 (stdout differs from $1)"; fi; }
# expect_true DESC CMD...: passes when CMD succeeds.
expect_true() {
    d=$1
    shift
    if "$@"; then pass "$d"; else fail "$d"; fi
}
# stderr is exactly one line (errors are one clear line)
expect_err_one_line() {
    n=$(wc -l <"$ERR")
    if [ "$n" -eq 1 ]; then pass "$1"; else fail "$1 (stderr has $n lines)"; fi
}

# need_model: M is the test model (SmolLM2-135M-Instruct Q4_1); where it is
# absent (scripts/fetch-model fetches it), the script's model tests are
# skipped: it ends here with what passed so far.
need_model() {
    M="$KVP_MODEL"
    if [ ! -f "$M" ]; then
        echo "note: $M absent (scripts/fetch-model); skipping the model tests"
        done_testing
        exit $?
    fi
}

# fifo_two_parts 'CMD' WHAT: run CMD (sh -c; stdout to $T/inc.out, stderr
# to $T/inc.err) on prompts from a FIFO: one prompt and half a second are
# written, then nothing until CMD has answered (60 s at most), since it must
# not wait for the rest of its input (not even a second request) to start;
# then the rest, four prompts (f1-f4) in all.  Passes when the answer came
# early, CMD exits 0 and all four are answered.  (CMD gives --json: without
# it the form of the output waits for the input to show one request or
# more.)
fifo_two_parts() {
    status=0
    mkfifo "$T/fifo"
    sh -c "$1" <"$T/fifo" >"$T/inc.out" 2>"$T/inc.err" &
    pid=$!
    exec 7>"$T/fifo"
    printf '{"id":"f1","prompt":"One"}\n{"id":"f2","prompt":"Tw' >&7
    i=0
    while [ ! -s "$T/inc.out" ] && [ $i -lt 600 ] && kill -0 $pid 2>/dev/null; do
        sleep 0.1
        i=$((i + 1))
    done
    LAST_CMD="$1, from a FIFO written in two parts"
    if [ -s "$T/inc.out" ]; then pass "$2: the first answer came before the prompts were all written"
    else fail "$2: no answer after 60 s with the input still open: $(cat "$T/inc.err")"; fi
    printf 'o"}\n{"id":"f3","prompt":"Three"}\n{"id":"f4","prompt":"Four"}\n' >&7
    exec 7>&-
    wait $pid
    status=$?
    rm -f "$T/fifo"
    expect_status 0 "$2: then the rest is read and answered"
    n=$(grep -c '"id":"f[1-4]"' "$T/inc.out")
    if [ "$n" = 4 ]; then pass "$2: all four answered"; else fail "$2: $n of 4 answered: $(cat "$T/inc.out")"; fi
}

# wait_catching PID: until PID (a background job of this script) catches
# SIGTERM (its stop handler installed: Linux's /proc/PID/status SigCgt, 60 s
# at most; elsewhere 5 s).
wait_catching() {
    _i=0
    if [ -r "/proc/$1/status" ]; then
        while [ $_i -lt 600 ] && kill -0 "$1" 2>/dev/null; do
            _m=$(sed -n 's/^SigCgt:[[:space:]]*//p' "/proc/$1/status" 2>/dev/null)
            _m=${_m#"${_m%????}"} # the first 16 signals: shell arithmetic is signed
            [ -n "$_m" ] && [ $((0x$_m & 0x4000)) -ne 0 ] && break
            sleep 0.1
            _i=$((_i + 1))
        done
    else
        sleep 5
    fi
}

# wait_exit PID DESC: PID's exit status into $status; still running WAIT_S s
# from now: a failure (DESC) and SIGKILL.
# A sanitizer build computes ~10x slower (ASan: a 512-token prompt chunk
# takes 11 s on one thread, past the 10 s a stop at the next chunk had)
case ${KVP_CFLAGS:-} in *sanitize*) WAIT_S=60 ;; *) WAIT_S=10 ;; esac
wait_exit() {
    _i=0
    while kill -0 "$1" 2>/dev/null && [ $_i -lt $((WAIT_S * 10)) ]; do
        sleep 0.1
        _i=$((_i + 1))
    done
    if kill -0 "$1" 2>/dev/null; then
        fail "$2: still running $WAIT_S s later"
        kill -KILL "$1"
    fi
    wait "$1"
    status=$?
}

# term_when_waiting PID DESC: SIGTERM to PID (a background job of this
# script) half a second after it catches SIGTERM (wait_catching), so the
# signal finds it waiting for input: decode's handler is in place from
# before its model load, which takes the test model milliseconds (a signal
# during the load ends the job the same way, once loaded).  Then its exit
# status into $status (wait_exit: DESC names the failure to end).
term_when_waiting() {
    wait_catching "$1"
    if [ -r "/proc/$1/status" ]; then sleep 0.5; fi
    kill -TERM "$1" 2>/dev/null
    wait_exit "$1" "$2"
}

# spec_prompts FILE: 8 prompts for speculative decoding, 6 whose answers
# copy them (prompt lookup drafts well) and 2 that do not.
spec_prompts() {
    awk 'BEGIN {
        for (i = 0; i < 6; i++) {
            s = "Copy this list exactly:"
            for (j = 0; j < 8; j++) s = s " item " (j * i + 3) " is " (j % 2 ? "red" : "blue") ","
            printf "{\"id\":\"c%d\",\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}]}\n", i, s
        }
        print "{\"id\":\"o1\",\"messages\":[{\"role\":\"user\",\"content\":\"Write a short poem about the sea.\"}]}"
        print "{\"id\":\"o2\",\"prompt\":\"Once upon a time\"}"
    }' >"$1"
}

done_testing() {
    echo "$T_PASS passed, $T_FAIL failed"
    [ "$T_FAIL" -eq 0 ]
}
