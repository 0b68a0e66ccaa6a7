#!/bin/sh
# layers.sh - scripts/check-layers passes on the tree and fails, naming the
# file and the include, on each kind of violation planted in a copy of lib/.
. "$(dirname "$0")/lib.sh"
root=$(cd "$KVP_TESTS/.." && pwd)
check=$root/scripts/check-layers

run "$check" "$root"
expect_status 0 "the tree follows its layers"
expect_out_has "follow the layers" "says what it checked"

# fresh copy of the library for each planted violation
plant() { # DESC
    rm -rf "$T/tree"
    mkdir -p "$T/tree"
    cp -R "$root/lib" "$T/tree/lib"
    rm -f "$T/tree/lib/libkvpipe.a"
    [ -d "$root/kernels" ] && cp -R "$root/kernels" "$T/tree/kernels"
}
# add_include FILE HEADER: after the file's first include line
add_include() {
    sed "0,/^#include \"/s//#include \"$2\"\n#include \"/" "$1" >"$1.new" && mv "$1.new" "$1"
}

plant
add_include "$T/tree/lib/num/quant.c" stream.h
run "$check" "$T/tree"
expect_status 1 "num including the KVP format fails"
expect_out_has "lib/num/quant.c:" "names the file"
expect_out_has "includes stream.h of format/, a layer above num/" "names the include and the layers"

plant
add_include "$T/tree/lib/cpu/backend_cpu.c" capacity.h
run "$check" "$T/tree"
expect_status 1 "a sibling layer's header fails"
expect_out_has "includes capacity.h of plan/, a sibling layer of cpu/" "names the sibling"

plant
add_include "$T/tree/lib/num/tensor.c" quant.h
run "$check" "$T/tree"
expect_status 1 "tensor.c -> quant.h -> tensor.h is a circle"
expect_out_has "circle" "says circle"
expect_out_has "quant" "names a module of the circle"

plant
add_include "$T/tree/lib/format/stream.h" hash.h
run "$check" "$T/tree"
expect_status 1 "a public header including an internal one fails"
expect_out_has "lib/format/stream.h:" "names the public header"
expect_out_has "includes hash.h, which lib/kvpipe.h does not make public" "names the internal header"

plant
mkdir "$T/tree/lib/extra"
echo 'int extra;' >"$T/tree/lib/extra/extra.c"
run "$check" "$T/tree"
expect_status 1 "a folder without a rank fails"
expect_out_has "lib/extra: a folder with no layer rank" "names the folder"

plant
cp "$T/tree/lib/base/hash.h" "$T/tree/lib/engine/hash.h"
run "$check" "$T/tree"
expect_status 1 "two files of one name fail"
expect_out_has "hash.h: the same file name in two places" "names the file"

plant
add_include "$T/tree/lib/model/config.c" nowhere.h
run "$check" "$T/tree"
expect_status 1 "an include of no header of lib/ fails"
expect_out_has "includes \"nowhere.h\", which is no header" "names the include"

done_testing
