#!/bin/sh
# tpbench: the collectives table with 1 to 4 ranks over every operation and
# dtype, in place, JSON, usage errors, a wrong reduction caught by the check,
# a stopped and a killed rank ending the job, NCCL without a GPU, and the
# model-shaped traffic.  Small sizes: the whole file takes well under a minute.
. "$KVP_TESTS/cli/lib.sh"

# As root OpenMPI wants these; CI has 2 cores, so up to 4 ranks oversubscribe.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# No warnings about the missing fabrics of a container.
export OMPI_MCA_btl_base_warn_component_unused=0
# Under `make asan` (tests/lsan.supp): a slow unwind keeps libmpi's frames
# in the stacks of OpenMPI's leaks so the suppressions can name them, and
# the PMPI shim below may be preloaded ahead of the ASan runtime.
case ${ASAN_OPTIONS:-} in
*detect_leaks=1*) export ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0:verify_asan_link_order=0" ;;
esac

# ---- one rank, no launcher ----
run tpbench all_reduce -b 8 -e 4K -n 2 -w 1
expect_status 0 "one rank without mpirun"
expect_out_has "# Avg bus bandwidth" "the average busbw line"
expect_out_has "#wrong" "the nccl-tests columns"
expect_out_has "# Wrong elements     : 0 OK" "nothing wrong"
expect_err_empty "quiet on stderr"
rows=$(grep -c '^ ' "$OUT")
if [ "$rows" -eq 10 ]; then pass "8 B .. 4 KiB is 10 rows"; else fail "8 B .. 4 KiB gave $rows rows"; fi

# ---- usage errors: exit 2, two lines ----
for bad in "-b x" "-f 1" "-d double" "-o avg" "nosuchop" "-c 2" "--backend tcp" "all_reduce all_gather" \
    "sendrecv -z" "--tp 2" "--model nosuch --tp 2" "--model llama-3-8b" "--model llama-3-8b --tp 2 --link x" \
    "-e 8 -b 16" "broadcast -r 1" "-i 0" "-i 0K" "--model llama-3-8b --tp 2 --bandwidth 0"; do
    # shellcheck disable=SC2086
    run tpbench $bad
    expect_status 2 "usage error: $bad"
    expect_err_has "Try 'tpbench --help'" "usage error says where help is: $bad"
done
# A sweep that cannot run is a usage error too, before any output (the
# sizes need the rank count, known only once MPI is up): a size past MPI's
# int counts, more rows than a sweep takes, no size between -b and -e.
for bad in "-b 8G -e 8G" "-e 8G" "-d half -b 4G -e 4G" "-b 8 -e 8M -i 1" "-b 0 -e 0"; do
    # shellcheck disable=SC2086
    run tpbench $bad
    expect_status 2 "a sweep that cannot run: $bad"
    expect_out_empty "and nothing on stdout: $bad"
    expect_err_has "Try 'tpbench --help'" "and the help hint: $bad"
done
run tpbench -b 8G -e 8G
expect_err_has "8589934592 bytes is over 2147483647 float elements" "the size past int counts is named"
run tpbench -b 8 -e 8M -i 1
expect_err_has "more than 4096 sizes" "too many rows says so"
# K M G T P are all powers of 1024 (nccl-tests' K M G; the size parser's P
# was decimal here), with or without i and B
run tpbench -b 1P -e 1P
expect_err_has "1125899906842624 bytes is over" "P is 2^50"
run tpbench -b 1T -e 1TB
expect_err_has "1099511627776 bytes is over" "T is 2^40"
run tpbench -b 2K -e 2KiB -i 1M -n 1 -w 0
expect_status 0 "K and Ki alike"
expect_out_has "minBytes 2048 maxBytes 2048 step: 1048576(bytes)" "K is 2^10, M 2^20"
run tpbench --help
expect_status 0 "--help"
expect_out_has "--backend mpi|nccl" "--help lists the backends"

# ---- NCCL: built here, but no GPU in CI ----
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "skip: a GPU is present: the no-GPU failure of --backend nccl is not tested here"
else
    run tpbench --backend nccl -b 8 -e 8
    expect_status 1 "--backend nccl without a GPU fails"
    if grep -qE "no CUDA device|built without NCCL" "$ERR"; then pass "and says why"
    else fail "--backend nccl: no clear reason"; fi
    expect_err_has "tpbench: rank 0: " "the error names the rank"
    # NCCL's counts are size_t: 16 GiB of floats (2^32 elements) passes the
    # size check that MPI's int counts fail, and meets the GPU check instead
    run tpbench --backend nccl -b 16G -e 16G
    expect_status 1 "--backend nccl -b 16G: past MPI's limit, not NCCL's"
    expect_err_lacks "float elements" "no size error for NCCL"
fi

# ---- the model, alone: modeled only ----
# only the splits decode runs (and kvcalc plans): 32 heads over 5 do not split
run tpbench --model llama-3-8b --tp 5
expect_status 2 "--tp 5 on llama-3-8b is a usage error"
expect_err_has "--tp: tensor parallelism over 5 ranks: 32 query heads do not split evenly (rank counts that split this model: 1, 2, 4, 8, 16, 32)" \
    "names the heads and the splits that work, as decode does"
expect_out_empty "nothing modeled"
run tpbench --model llama-3-70b --tp 8 --gpu h100
expect_status 0 "--model alone"
expect_out_has "measured: not run" "one rank measures nothing"
for l in nvlink4 pcie4 pcie5 ib-ndr; do expect_out_has "modeled  $l" "modeled over $l"; done
expect_out_has "160 all_reduce of 1 x 8192" "llama-3-70b: two all-reduces a layer"
run tpbench --model llama-3-8b --tp 2 --backend nccl
expect_status 0 "--model alone with --backend nccl: only models, needs no GPU"
expect_out_has "modeled" "and models"
run tpbench --model llama-3-8b --tp 1
expect_status 0 "--model --tp 1"
expect_out_has "nothing to measure (--tp 1 has no collectives)" "--tp 1: no collectives, no mpirun hint"
expect_out_has "#   none: one rank holds the whole model" "--tp 1: the traffic line claims no collectives"
expect_out_lacks "all_reduce of" "nor lists any"
run tpbench --model llama-3-8b --tp 1 --json
expect_out_has '"traffic":{"all_reduce":0,"all_reduce_bytes":0,"all_gather":0,"all_gather_bytes":0}' \
    "--tp 1 --json: no traffic"
for o in "-b 1M" "-e 2M" "-f 3" "-i 8" "-z" "-o max" "-r 1" "-c 0"; do
    run tpbench --model llama-3-8b --tp 2 $o
    expect_status 2 "--model with the sweep's $o is a usage error"
    expect_err_has "${o%% *} goes with a sweep" "names $o"
done
run tpbench -f 2 -i 8 -e 64
expect_status 2 "-f with -i is a usage error"
expect_err_has "-f and -i" "names both"
run tpbench --model llama-3-8b --tp 4 --link pcie4 --alpha 0 --bandwidth 32G --json
expect_status 0 "--model --json"

json_ok() { # FILE EXPR: EXPR (python, on the parsed object j) is true
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); sys.exit(0 if eval(sys.argv[2]) else 1)' "$1" "$2"
}
if command -v python3 >/dev/null 2>&1; then
    expect_true "--model JSON parses, one link, alpha 0" json_ok "$OUT" \
        'j["measured"] is None and len(j["modeled"]) == 1 and j["modeled"][0]["alpha_us"] == 0 and j["modeled"][0]["source"] == "modeled"'
else
    echo "skip: no python3: JSON output not parsed"
fi

# the presets found, named as kvcalc --json names them, however --model
# and --gpu were spelled (the JSON of both joins on them)
run tpbench --model LLAMA_3-8B --gpu 'H_1.0-0' --tp 1 --json
expect_status 0 "--model and --gpu spelled loosely"
expect_out_has '"model":"Llama-3-8B",' "the model preset's name, as kvcalc prints it"
expect_out_has '"gpu":"h100-sxm",' "the GPU preset's canonical name, not the spelling given"
run kvcalc --model LLAMA_3-8B --gpu 'H_1.0-0' --json
expect_out_has '"model":"Llama-3-8B",' "kvcalc names the model so"
expect_out_has '"gpu":"h100-sxm",' "and the GPU"
run tpbench --model llama-3-8b --tp 1 --json
expect_out_has '"gpu":"h100-sxm",' "the default GPU by its preset's name too"

# --json is one object or nothing: a run that fails leaves no half document
# (before, the settings, the rank list and "rows":[ were out)
case ${KVP_CFLAGS:-} in
*sanitize*) echo "skip: under the sanitizers, tpbench under ulimit -v" ;;
*)
    run_sh "ulimit -v 1500000; tpbench -b 512M -e 512M -n 1 -w 0 --json"
    expect_status 1 "--json out of memory for its buffers: exit 1"
    expect_err_has "out of memory for a 536870912-byte host buffer" "says why"
    expect_out_empty "--json out of memory: nothing on stdout"
    ;;
esac

if ! command -v mpirun >/dev/null 2>&1; then
    echo "skip: no mpirun (Debian: openmpi-bin): the multi-rank tpbench tests did not run"
    done_testing
    exit $?
fi
run tpbench -b 8 -e 8 -n 1 -w 0
head -n 1 "$OUT" >"$T/alone.head"
run mpirun -np 2 tpbench -b 8 -e 8 -n 1 -w 0
if grep -q "has no MPI" "$ERR"; then
    # a build without MPI says so, not "over mpi"
    expect_true "a build without MPI: its header says one process" grep -q "1 rank in one process (this build has no MPI)" \
        "$T/alone.head"
    echo "skip: this tpbench was built without MPI: the multi-rank tests did not run"
    done_testing
    exit $?
fi
expect_true "alone, a build with MPI: 1 rank over mpi" grep -q "1 rank over mpi," "$T/alone.head"
expect_status 0 "two ranks"

# ---- every operation and dtype, 2 and 4 ranks; every reduction at 3 ----
for np in 2 4; do
    for op in all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv; do
        for d in float half bfloat16; do
            run mpirun -np $np tpbench $op -b 8 -e 64K -f 16 -d $d -n 2 -w 1 -r $((np - 1))
            if [ "$status" -eq 0 ] && grep -q "# Wrong elements     : 0 OK" "$OUT"; then pass "np $np $op $d"
            else fail "np $np $op $d"; fi
        done
    done
done
for op in all_reduce reduce_scatter reduce; do
    for d in float half bfloat16; do
        for o in prod max min; do
            run mpirun -np 3 tpbench $op -b 12 -e 6K -f 8 -d $d -o $o -n 1 -w 0 -r 1
            if [ "$status" -eq 0 ] && grep -q "# Wrong elements     : 0 OK" "$OUT"; then pass "np 3 $op $d $o"
            else fail "np 3 $op $d $o"; fi
        done
    done
done
# tpbench.1's rounding example: sizes of the operations that cut their
# buffers a part a rank are whole elements a rank, the others' whole elements
for op in all_gather all_reduce; do
    run mpirun -np 3 tpbench $op -b 1K -e 64K -f 8 -n 1 -w 0 -c 0
    awk '/^ / { printf "%s ", $1 }' "$OUT" >"$T/sizes"
    want="8184 65532 "
    [ $op = all_gather ] || want="1024 8192 65536 "
    expect_true "$op -b 1K -e 64K -f 8 over 3 ranks: the rows $want($(cat "$T/sizes"))" \
        [ "$(cat "$T/sizes")" = "$want" ]
done
run mpirun -np 4 tpbench alltoall -b 8 -e 1K -f 4 -d half -z -n 2 -w 0
expect_status 0 "-z"
if awk '/^ / && $6 != "N/A" { bad = 1 } END { exit bad }' "$OUT"; then pass "-z leaves out-of-place N/A"
else fail "-z ran out of place"; fi
expect_out_lacks "     N/A     N/A     N/A     N/A     N/A" "-z ran in place"

run mpirun -np 3 tpbench broadcast -r 5
expect_status 2 "a root past the ranks is a usage error"
n=$(grep -c "^tpbench: " "$ERR")
if [ "$n" -eq 1 ]; then pass "one rank says it"; else fail "$n ranks said it"; fi

run mpirun -np 4 tpbench -x
expect_status 2 "a bad flag under mpirun"
n=$(grep -c "^tpbench: " "$ERR")
if [ "$n" -eq 1 ]; then pass "only rank 0 prints the usage error"; else fail "$n usage lines"; fi

run mpirun -np 3 tpbench -b 8 -e 8M -i 1
expect_status 2 "too many sizes under mpirun"
expect_out_empty "before the table"
n=$(grep -c "^tpbench: " "$ERR")
if [ "$n" -eq 1 ]; then pass "one rank says it"; else fail "$n ranks said it"; fi

# ---- JSON ----
run mpirun -np 3 tpbench reduce_scatter -b 12 -e 12K -f 4 -d bfloat16 -n 2 -w 0 --json
expect_status 0 "--json"
if command -v python3 >/dev/null 2>&1; then
    expect_true "JSON: 3 ranks, 6 rows, nothing wrong, busbw = algbw x 2/3" json_ok "$OUT" \
        'j["ranks"] == 3 and len(j["rows"]) == 6 and j["wrong"] == 0 and len(j["rank_list"]) == 3 and all(abs(r["out_of_place"]["busbw"] - r["out_of_place"]["algbw"] * 2 / 3) < 1e-5 for r in j["rows"]) and all(abs(r["in_place"]["algbw"] - r["size"] / r["in_place"]["time_us"] / 1e3) < 1e-3 * r["in_place"]["algbw"] + 1e-5 for r in j["rows"])'
fi

# ... and a rank killed mid-run leaves nothing either (rank 1 found among
# mpirun's children by its rank variable: the JSON lists no pids until the end)
k=$T/kill-json
mpirun -np 2 tpbench all_reduce -b 64K -e 64K -i 1 -n 2000000 -w 0 -c 0 --timeout 3 --json >"$k.out" 2>"$k.err" &
job=$!
pid=""
i=0
while [ $i -lt 300 ] && [ -z "$pid" ]; do
    for c in $(pgrep -P $job); do
        tr '\0' '\n' <"/proc/$c/environ" 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1 && pid=$c
    done
    sleep 0.1
    i=$((i + 1))
done
sleep 1
[ -n "$pid" ] && kill -KILL "$pid"
( sleep 60 && kill -9 $job 2>/dev/null ) &
dog=$!
wait $job
status=$?
kill $dog 2>/dev/null
LAST_CMD="mpirun -np 2 tpbench ... --json; kill -KILL rank 1 (${pid:-not found})"
cp "$k.out" "$OUT"
cp "$k.err" "$ERR"
expect_true "--json, rank 1 killed: the job fails" sh -c '[ -n "$1" ] && [ "$2" -ne 0 ]' _ "$pid" "$status"
expect_out_empty "--json, rank 1 killed: nothing on stdout"

# ---- a wrong reduction is caught ----
# A profiling-interface shim (PMPI, part of the MPI standard) preloaded into
# the ranks makes every all-reduce compute max instead of sum: tpbench
# itself has no hook for this.
if command -v mpicc >/dev/null 2>&1; then
    cat >"$T/wrongop.c" <<'EOF'
#include <mpi.h>
int MPI_Iallreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c, MPI_Request *q)
{
    /* the data's all-reduces only: tpbench sums its counts in doubles */
    return PMPI_Iallreduce(s, r, n, t, t == MPI_FLOAT ? MPI_MAX : op, c, q);
}
EOF
    if mpicc -shared -fPIC -o "$T/wrongop.so" "$T/wrongop.c" 2>"$T/cc.err"; then
        run mpirun -np 3 -x LD_PRELOAD="$T/wrongop.so" tpbench all_reduce -b 1K -e 4K -n 1 -w 0
        expect_status 1 "a wrong all-reduce exits 1"
        expect_out_has "FAILED" "and says FAILED"
        # 3 ranks x 256 floats: a max equals the sum only where the other values are 0
        if awk '/^ / && $1 == 1024 { exit !($9 > 600 && $13 > 600) }' "$OUT"; then pass "wrong elements counted over ranks"
        else fail "the wrong count is off: $(grep '^ *1024 ' "$OUT")"; fi
    else
        echo "skip: mpicc could not build the shim: $(head -c 200 "$T/cc.err")"
    fi
else
    echo "skip: no mpicc: the wrong-reduction test did not run"
fi

# ---- the model, measured ----
run mpirun -np 2 tpbench --model llama-3-8b --tp 2 --batch 2 -n 2 -w 1 --link nvlink4
expect_status 0 "--model measured with 2 ranks"
expect_out_has "measured  all_reduce       64" "64 all-reduces measured"
expect_out_has "modeled  nvlink4" "beside the model"
run mpirun -np 2 tpbench --model llama-3-8b --tp 4
expect_status 2 "--tp 4 in a job of 2"
# a step past MPI's counts is a usage error before any output, as the sweep's
# sizes are (before, the job started and MPI_ABORT ended it, naming neither
# the collective nor --batch)
run mpirun -np 2 tpbench --model llama-3-8b --tp 2 --batch 20000
expect_status 2 "--batch whose logits pass MPI's counts: a usage error"
expect_out_empty "before any output"
expect_err_has "tpbench: --batch 20000: its all_gather of 2565120000 elements is over the mpi backend's 2147483647 a call (MPI counts are int): --batch 16743 at most" \
    "names the collective, the limit and the largest --batch"
expect_true "said once" [ "$(grep -c 'at most' "$ERR")" -eq 1 ]

# ---- a rank that stops or dies ends the job ----
# the rank's pid from the table's rank list
rank_pid() { # FILE RANK
    awk -v r="$2" '$1 == "#" && $2 == "Rank" && $3 == r { print $5 }' "$1"
}
wait_ranks() { # FILE: until the rank list is out (at most 30 s)
    i=0
    while [ $i -lt 300 ] && ! grep -q '^#  Rank  2 ' "$1"; do sleep 0.1; i=$((i + 1)); done
}
for sig in STOP KILL; do
    k=$T/kill-$sig # a file of its own: the job starts in the background, and the
    # shell may look before it has truncated a file an earlier job wrote
    mpirun -np 3 tpbench all_reduce -b 64K -e 64K -i 1 -n 2000000 -w 0 -c 0 --timeout 3 \
        >"$k.out" 2>"$k.err" &
    job=$!
    wait_ranks "$k.out"
    pid=$(rank_pid "$k.out" 1)
    sleep 0.5
    start=$(date +%s)
    [ -n "$pid" ] && kill -$sig "$pid"
    # a watchdog, so a hang fails the test instead of the suite
    ( sleep 60 && kill -9 $job 2>/dev/null ) &
    dog=$!
    wait $job
    status=$?
    took=$(($(date +%s) - start))
    kill $dog 2>/dev/null
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
    LAST_CMD="mpirun -np 3 tpbench ... --timeout 3; kill -$sig rank 1 ($pid)"
    cp "$k.out" "$OUT"
    cp "$k.err" "$ERR"
    if [ -n "$pid" ] && [ "$status" -ne 0 ] && [ "$took" -lt 30 ]; then pass "kill -$sig a rank: the job ends non-zero ($took s)"
    else fail "kill -$sig a rank: exit $status after $took s"; fi
    if [ "$sig" = STOP ]; then
        expect_err_has "waited 3 s for its peers" "a stopped rank: rank 0 says it waited"
        if grep -qE "^tpbench: rank 0: " "$ERR"; then pass "the message names the program and the rank"; else fail "no program and rank named"; fi
        expect_true "said once (the other ranks wait half as long again)" [ "$(grep -c "for its peers" "$ERR")" -eq 1 ]
    fi
done

done_testing
