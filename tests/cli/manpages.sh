#!/bin/sh
# The man pages against the programs: every long option a program's --help
# lists is documented in its page (prefill's and specdec's shared options in
# decode(1), which their pages point to), every option a page's OPTIONS
# section defines is one --help lists, and each page formats without a
# groff warning (where groff is installed).
. "$KVP_TESTS/cli/lib.sh"
MAN="$KVP_TESTS/../man"

# long_opts: the --options in standard input, one a line, sorted
long_opts() { grep -o -- '--[a-z][a-z0-9_-]*' | sort -u; }
# page_opts PAGE: the options a page's OPTIONS section defines (the first
# line after each .TP), in roff's \-\- spelling turned back into --
page_opts() {
    awk '/^\.SH OPTIONS/ { o = 1; next } /^\.SH/ { o = 0 } o && prev == ".TP" { print } { prev = $0 }' "$1" |
        sed 's/\\-/-/g' | long_opts
}
# documented OPT PAGE...: OPT is written (as \-\-opt) in one of the pages,
# not only as the start of a longer one (--top in \-\-top\-k)
documented() {
    o=$(printf '%s' "$1" | sed 's/-/\\\\-/g')
    shift
    grep -qP -- "$o(?![a-z0-9_]|\\\\-)" "$@"
}

for p in decode prefill specdec quantize kvdump kvcalc tpbench; do
    pages="$MAN/$p.1"
    case $p in prefill | specdec) pages="$pages $MAN/decode.1" ;; esac
    run "$p" --help
    expect_status 0 "$p --help"
    help=$(long_opts <"$OUT")
    [ -n "$help" ] || fail "$p --help lists no long option"
    missing=""
    for o in $help; do
        # shellcheck disable=SC2086 # pages is a list
        documented "$o" $pages || missing="$missing $o"
    done
    if [ -z "$missing" ]; then pass "$p: every option of --help is in its man page"; else
        fail "$p: --help lists options its man page does not document:$missing"; fi
    defined=$(page_opts "$MAN/$p.1")
    [ -n "$defined" ] || fail "$p.1 defines no option in its OPTIONS section"
    extra=""
    for o in $defined; do
        printf '%s\n' "$help" | grep -qx -- "$o" || extra="$extra $o"
    done
    if [ -z "$extra" ]; then pass "$p: every option $p.1 defines is in --help"; else
        fail "$p: $p.1 defines options --help does not list:$extra"; fi
done

# The checks above can fail: an option its page lacks is found
printf '.SH OPTIONS\n.TP\n.B \\-\\-alpha\n.TP\n.B \\-\\-kv\\-mem\n' >"$T/fake.1"
if documented --alpha "$T/fake.1" && ! documented --beta "$T/fake.1" && ! documented --alph "$T/fake.1" &&
    ! documented --kv "$T/fake.1"; then
    pass "an option a page lacks is found (and a prefix is not taken for it)"
else fail "an option a page lacks is found (and a prefix is not taken for it)"; fi
[ "$(page_opts "$T/fake.1" | tr '\n' ' ')" = "--alpha --kv-mem " ] && pass "a page's defined options are read" ||
    fail "a page's defined options are read (got '$(page_opts "$T/fake.1")')"

if command -v groff >/dev/null 2>&1; then
    for f in "$MAN"/*.1 "$MAN"/*.5; do
        LAST_CMD="groff -man -ww -z $f"
        groff -man -ww -z "$f" >"$OUT" 2>"$ERR"
        status=$?
        expect_err_empty "$(basename "$f") formats without a groff warning"
    done
else
    echo "skip: no groff (Debian groff-base): the pages' formatting is not checked"
fi
done_testing
