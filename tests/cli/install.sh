#!/bin/sh
# install.sh - the installed API: `make install DESTDIR=...` puts the public
# headers (lib/kvpipe.h and what it includes) and kvpipe.pc in place, and a
# program built from that tree alone, with pkg-config's flags, reads a KVP
# file, tokenizes a text and runs one step of the model.
. "$(dirname "$0")/lib.sh"
root=$(cd "$KVP_TESTS/.." && pwd)
o=$(dirname "$KVP_UNIT_DIR")
dest=$T/dest
prefix=/opt/kvpipe

if ! command -v pkg-config >/dev/null 2>&1; then
    echo "install: pkg-config missing (make deps installs it); skipped"
    done_testing
    exit $?
fi

run make -s --no-print-directory -C "$root" install O="$o" BINDIR="$KVP_BIN" DESTDIR="$dest" PREFIX="$prefix"
expect_status 0 "make install DESTDIR=... succeeds"
# make -q tells the truth: a built program is up to date, and other flags
# make it out of date without rewriting the flags file
flags_before=$(cat "$o/build-flags")
run make -q -C "$root" O="$o" BINDIR="$KVP_BIN" "$KVP_BIN/kvdump"
expect_status 0 "make -q: a built program is up to date"
run make -q -C "$root" O="$o" BINDIR="$KVP_BIN" OPT=-O0 "$KVP_BIN/kvdump"
expect_status 1 "make -q: other flags make it out of date"
expect_true "make -q wrote no flags" test "$(cat "$o/build-flags")" = "$flags_before"
inc=$dest$prefix/include/kvpipe
expect_true "kvpipe.h installed" test -f "$inc/kvpipe.h"
expect_true "stream.h installed beside it" test -f "$inc/stream.h"
for h in convert_impl.h backend_cpu_kern.h num_impl.h cli.h hash.h runopts.h; do
    expect_true "internal $h not installed" test ! -e "$inc/$h"
done
expect_true "libkvpipe.a installed" test -f "$dest$prefix/lib/libkvpipe.a"
expect_true "kvpipe.pc installed" test -f "$dest$prefix/lib/pkgconfig/kvpipe.pc"

# pkg-config as a packager stages it: the .pc says PREFIX, the sysroot adds DESTDIR.
pc() { PKG_CONFIG_PATH=$dest$prefix/lib/pkgconfig PKG_CONFIG_LIBDIR=$dest$prefix/lib/pkgconfig \
    PKG_CONFIG_SYSROOT_DIR=$dest pkg-config "$@"; }
run pc --cflags --libs --static kvpipe
expect_status 0 "pkg-config knows kvpipe"
for l in -lkvpipe -lzstd -lm -pthread; do
    expect_out_has " $l" "the static link line has $l"
done
expect_out_has "-I$dest$prefix/include" "the include folder is the installed one"
flags=$(cat "$OUT")
# the library is static only: the plain link line (what build tools ask
# for without --static) links too
run pc --libs kvpipe
for l in -lkvpipe -lzstd -lm -pthread; do
    expect_out_has " $l" "the plain link line has $l"
done
plain=$(cat "$OUT")

# Built with nothing from the tree but the test's source: no -I into lib/.
# shellcheck disable=SC2086
run ${CC:-cc} -std=c11 -Wall -Wextra -Werror ${KVP_CFLAGS:-} "$root/tests/install/use_api.c" $flags -o "$T/use_api"
expect_status 0 "a program builds against the installed API alone"
expect_err_empty "it builds without warnings"

# shellcheck disable=SC2086
run ${CC:-cc} -std=c11 ${KVP_CFLAGS:-} "$root/tests/install/use_api.c" $(pc --cflags kvpipe) $plain -o "$T/use_api2"
expect_status 0 "and with pkg-config's plain --libs"
run quantize --to f16 --drop step "$root/tests/golden/tiny-st" -o "$T/tiny.kvp"
expect_status 0 "quantize makes a KVP model file"
run "$T/use_api" "$T/tiny.kvp"
expect_status 0 "the installed API reads a KVP file"
expect_out_has "kvpipe " "prints the library version"
expect_out_has " config 1 " "counts its config record"
expect_out_has " tensor " "counts its tensors"
expect_out_has " end 1" "reads through the end record"

head -c 1000 "$T/tiny.kvp" >"$T/cut.kvp"
run "$T/use_api" "$T/cut.kvp"
expect_status 1 "a cut-off stream is an error through the API too"
expect_err_has "cut.kvp" "names the file"

if [ -f "$KVP_MODEL" ]; then
    text="The capital of France is"
    run "$T/use_api" "$T/tiny.kvp" "$KVP_MODEL" "$text"
    expect_status 0 "tokenizes and runs one step of SmolLM2 through the API"
    expect_out_has "ids 504 3575 282 4649 314" "SmolLM2's ids for the text"
    api_next=$(sed -n 's/^next \([0-9]*\) .*/\1/p' "$OUT")
    run decode -m "$KVP_MODEL" -p "$text" -n 1 --json
    expect_status 0 "decode gives one token"
    dec_text=$(sed -n 's/.*"text":"\([^"]*\)".*/\1/p' "$OUT")
    run "$T/use_api" "$T/tiny.kvp" "$KVP_MODEL" "$text"
    api_piece=$(sed -n 's/^next [0-9]* \(.*\)$/\1/p' "$OUT")
    if [ -n "$api_next" ] && [ "$api_piece" = "$dec_text" ]; then pass "the API's greedy token is decode's ($api_next '$api_piece')"
    else fail "the API's greedy token '$api_piece' ($api_next) is not decode's '$dec_text'"; fi
else
    echo "install: $KVP_MODEL missing; the model step is skipped"
fi

done_testing
