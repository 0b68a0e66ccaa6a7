"""tp_report.py - scripts/bench-tp's table: tpbench's MPI all_reduce beside
torch.distributed's gloo all_reduce, and tpbench's busbw checked against a
recomputation from its own times.

Reads, for each rank count NP, OUT/tpbench-NP.json (tpbench --json) and
OUT/gloo-NP.jsonl (tp_gloo.py).  busbw is recomputed here from the time
alone: size / time x 2(n-1)/n (nccl-tests' PERFORMANCE.md), not from
tpbench's algbw.  tpbench's in-place column is compared with gloo, whose
all_reduce is in place (its out-of-place column is shown beside).  The last lines are the ratios.

Usage: tp_report.py OUT NP...
"""
import json
import math
import sys


def busbw(size, time_us, n):
    return size / (time_us * 1e-6) / 1e9 * 2 * (n - 1) / n


def main():
    out, nps = sys.argv[1], [int(a) for a in sys.argv[2:]]
    worst = 0.0
    ratios = {}
    print("%3s %10s | %10s %9s | %10s %9s | %10s %9s | %7s" % (
        "np", "size (B)", "in-place", "busbw", "out-place", "busbw", "gloo us", "busbw", "ratio"))
    for n in nps:
        tp = json.load(open("%s/tpbench-%d.json" % (out, n)))
        assert tp["ranks"] == n and tp["op"] == "all_reduce"
        gloo = {r["size"]: r for r in map(json.loads, open("%s/gloo-%d.jsonl" % (out, n)))}
        for row in tp["rows"]:
            for cell in ("out_of_place", "in_place"):
                c = row[cell]
                if c is None:
                    continue
                mine = busbw(row["size"], c["time_us"], n)
                # tpbench's JSON has 9 significant digits
                err = abs(mine - c["busbw"]) / mine if mine > 0 else abs(c["busbw"])
                worst = max(worst, err)
            ip = row["in_place"]
            g = gloo.get(row["size"])
            if g is None or ip is None:
                continue
            gb = busbw(g["size"], g["time_us"], n)
            ratio = ip["busbw"] / gb if gb > 0 else float("nan")
            ratios.setdefault(n, []).append((row["size"], ratio))
            op = row["out_of_place"]
            print("%3d %10d | %10.1f %9.4f | %10.1f %9.4f | %10.1f %9.4f | %6.2fx" % (
                n, row["size"], ip["time_us"], ip["busbw"], op["time_us"], op["busbw"], g["time_us"], gb, ratio))
    print()
    print("busbw recomputed from the times: largest relative difference from tpbench's %.2e (%s)" % (
        worst, "agrees" if worst < 1e-6 else "DISAGREES"))
    for n in nps:
        rs = ratios.get(n, [])
        small = [r for s, r in rs if s <= 64 * 1024]
        large = [r for s, r in rs if s > 64 * 1024]
        gm = lambda v: math.exp(sum(map(math.log, v)) / len(v)) if v else float("nan")
        print("np %d: tpbench MPI / gloo busbw, geometric mean: %.2fx up to 64 KiB, %.2fx above" % (
            n, gm(small), gm(large)))
    return 0 if worst < 1e-6 else 1


if __name__ == "__main__":
    sys.exit(main())
