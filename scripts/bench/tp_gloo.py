"""tp_gloo.py - torch.distributed's gloo all_reduce timed like tpbench.

The reference for scripts/bench-tp: NP processes on this host (spawned
here, joined through a file), float32 sum all-reduce in place (torch's
only form), for each size WARMUP untimed calls then ITERS timed calls back
to back; the time is the mean per call averaged over the ranks, as tpbench
(and nccl-tests) report it.  Rank 0 prints one JSON line a size:
{"size": bytes, "count": elements, "time_us": ...}.

Usage: tp_gloo.py NP ITERS WARMUP SIZE...
"""
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, world, init, iters, warmup, sizes):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.set_num_threads(1)  # one core a rank, like an MPI rank
    for size in sizes:
        count = size // 4
        x = torch.full((count,), float(rank + 1), dtype=torch.float32)
        for _ in range(warmup):
            dist.all_reduce(x)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(t)
        if rank == 0:
            print(json.dumps({"size": count * 4, "count": count, "time_us": t.item() / world * 1e6}), flush=True)
    dist.destroy_process_group()


def main():
    world, iters, warmup = (int(a) for a in sys.argv[1:4])
    sizes = [int(s) for s in sys.argv[4:]]
    with tempfile.TemporaryDirectory() as d:
        init = "file://" + os.path.join(d, "rendezvous")
        mp.spawn(run, args=(world, init, iters, warmup, sizes), nprocs=world, join=True)


if __name__ == "__main__":
    main()
