# device-steps.sh - what scripts/device-check and scripts/device-full share
# (sourced, not run, from the repo root).  Here, for --prepare: a carried
# folder with zstd in it, kept out of git, within what one call may carry.
# There: the step runner, each step under `timeout` within an overall
# budget, its output appended to a log in $OUT, one summary line a step;
# the sourcing script sets budget (seconds), start (date +%s), summary (a
# file) and failed (0) first.

# carry_zstd DIR: zstd's headers and static library into DIR/zstd (the
# device machine has neither); ZSTD_INCLUDE, ZSTD_LIBDIR override where.
carry_zstd() {
    inc=${ZSTD_INCLUDE:-/usr/include} zlib=${ZSTD_LIBDIR:-}
    if [ -z "$zlib" ]; then
        for d in $(pkg-config --variable=libdir libzstd 2>/dev/null) /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib \
            /usr/local/lib; do
            [ -f "$d/libzstd.a" ] && zlib=$d && break
        done
    fi
    if [ ! -f "$inc/zstd.h" ] || [ ! -f "${zlib:-/nonexistent}/libzstd.a" ]; then
        echo "$(basename "$0"): zstd.h or libzstd.a not found (ZSTD_INCLUDE, ZSTD_LIBDIR): run scripts/deps" \
            "(Debian: libzstd-dev)" >&2
        return 1
    fi
    mkdir -p "$1/zstd/include" "$1/zstd/lib"
    for h in zstd.h zstd_errors.h zdict.h; do
        [ -f "$inc/$h" ] && cp "$inc/$h" "$1/zstd/include/"
    done
    cp "$zlib/libzstd.a" "$1/zstd/lib/"
}

# carry_ignore DIR: DIR in .git/info/exclude, so it travels only when carried
carry_ignore() {
    git check-ignore -q "$1" && return 0
    echo "/$1/" >>"$(git rev-parse --git-common-dir)/info/exclude"
    echo "$(basename "$0"): added /$1/ to .git/info/exclude"
}

# carry_fits DIR: the working tree and DIR against the 64 MiB a call may
# carry (over 60 MiB fails: too close)
carry_fits() {
    tree=$(git ls-files -co --exclude-standard -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
    du -sb "$1" | awk -v t="$tree" -v d="$1" '{ m = 1048576;
        printf "working tree %.1f MiB + %s %.1f MiB = %.1f MiB of the 64 MiB that may travel\n", t / m, d, $1 / m, (t + $1) / m;
        if (t + $1 > 60 * m) { print "too close to 64 MiB"; exit 1 } }'
}

left() { echo $((budget - ($(date +%s) - start))); }

# step NAME MAX_SECONDS LOG CMD...: run CMD under timeout (the lesser of MAX
# and what is left of the budget), its output appended to $OUT/LOG; one
# summary line "NAME STATUS SECONDS".
step() {
    name=$1 max=$2 log=$OUT/$3
    shift 3
    t=$(left)
    [ "$t" -gt "$max" ] && t=$max
    if [ "$t" -lt 10 ]; then
        printf '%-18s %-12s %5s\n' "$name" "no time" - >>"$summary"
        failed=1
        return 1
    fi
    s0=$(date +%s)
    echo "== $name: $* (timeout ${t}s)" >>"$log"
    timeout -k 10 "$t" "$@" >>"$log" 2>&1
    rc=$?
    dt=$(($(date +%s) - s0))
    case $rc in
    0) st=ok ;;
    124 | 137) st="TIMEOUT" ;;
    *) st="FAIL($rc)" ;;
    esac
    [ "$rc" -eq 0 ] || failed=1
    printf '%-18s %-12s %5s\n' "$name" "$st" "$dt" >>"$summary"
    echo "== $name: $st after ${dt}s" >>"$log"
    return $rc
}

skip() { # NAME WHY
    printf '%-18s %-12s %5s  %s\n' "$1" "not run" - "$2" >>"$summary"
    failed=1
}

# absent NAME WHY: an optional step this machine lacks the tool for (not a failure)
absent() {
    printf '%-18s %-12s %5s  %s\n' "$1" "absent" - "$2" >>"$summary"
}
