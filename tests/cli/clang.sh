#!/bin/sh
# clang.sh - scripts/check-clang passes on the tree (`make CC=clang` builds:
# clang warned where gcc did not, and -Werror made those errors) and fails,
# naming the file and the warning, on a planted one of each kind it caught.
. "$(dirname "$0")/lib.sh"
root=$(cd "$KVP_TESTS/.." && pwd)
check=$root/scripts/check-clang
if ! command -v clang >/dev/null 2>&1; then
    echo "skip: clang is not installed (scripts/deps installs it): the tree is not checked under clang's warnings"
    done_testing
    exit 0
fi

run "$check"
expect_status 0 "the tree builds under clang's warnings"
expect_out_empty "no warning"

# a message function passing its format on in a va_list, unmarked
cat >"$T/fmt.c" <<'C'
#include <stdarg.h>
#include <stdio.h>
void say(const char *fmt, ...);
void say(const char *fmt, ...) { va_list ap; va_start(ap, fmt); vfprintf(stderr, fmt, ap); va_end(ap); }
C
run "$check" "$T/fmt.c"
expect_status 1 "a va_list format that is no literal fails"
expect_out_has "fmt.c:4:" "names the file and line"
expect_out_has "Wformat-nonliteral" "names the warning"
# a parameter named as getopt's global
cat >"$T/shadow.c" <<'C'
#include <getopt.h>
int next_arg(int argc, int optind);
int next_arg(int argc, int optind) { return optind < argc; }
C
run "$check" "$T/shadow.c"
expect_status 1 "a parameter shadowing optind fails"
expect_out_has "Wshadow" "names the warning"
done_testing
