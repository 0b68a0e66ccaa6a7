# device-steps.sh - the step runner scripts/device-check and scripts/device-full
# share (sourced, not run): each step under `timeout` within an overall
# budget, its output appended to a log in $OUT, one summary line a step.
# The sourcing script sets budget (seconds), start (date +%s), summary (a
# file) and failed (0) first.

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
