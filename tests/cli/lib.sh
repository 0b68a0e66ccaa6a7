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
