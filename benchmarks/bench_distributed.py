"""bitparity.distributed against torch's all-reduce on gloo over 127.0.0.1: wall time and bytes per rank.

For each world size W, every rank holds [B/W, T] of a global batch [B, T] and runs, REPEATS times:
  bitparity  distributed.masked_whiten(x, mask) and distributed.ppo_policy_loss(...): all-gather the inputs'
             bytes, then the single-process op on the concatenation (spec 28);
  torch      the usual data-parallel way: local sums of x, x^2 and the count, one all_reduce(SUM) of the three,
             then the whitening on the local rows (torch ops); for the loss, the local masked sum and count,
             one all_reduce(SUM). World-size dependent bits; the baseline for cost only.
Prints the median over repeats (rank 0's clock, after a barrier) and the ratio, and the bytes each rank
receives: the all-gather receives (W - 1) ranks' inputs; a ring all-reduce of n bytes moves 2 (W - 1) / W n.

    python benchmarks/bench_distributed.py [--rows 64] [--cols 1024] [--repeats 20]
"""

import argparse
import datetime
import multiprocessing
import socket
import statistics
import time

import torch
import torch.distributed as dist
from tabulate import tabulate

from bitparity import distributed


def _torch_whiten(x, mask):
    m = mask.to(x.dtype)
    stats = torch.stack([(x * m).sum(), (x * x * m).sum(), m.sum()])
    dist.all_reduce(stats)
    mean = stats[0] / stats[2]
    var = (stats[1] / stats[2] - mean * mean) * stats[2] / (stats[2] - 1)
    return torch.where(mask, (x - mean) * torch.rsqrt(var + 1e-8), 0.0)


def _torch_loss(logp, old_logp, adv, mask):
    ratio = torch.exp(logp - old_logp)
    loss = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    stats = torch.stack([torch.where(mask, loss, 0.0).sum(), mask.sum().to(loss.dtype)])
    dist.all_reduce(stats)
    return stats[0] / stats[1]


def _timed(fn, repeats):
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _worker(rank, world, port, rows, cols, repeats, results):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(rank)
    local = rows // world
    x = torch.randn(local, cols, generator=g)
    mask = torch.rand(local, cols, generator=g) < 0.8
    logp = -torch.rand(local, cols, generator=g)
    old = logp + 0.1 * torch.randn(local, cols, generator=g)
    row = {
        "whiten bitparity": _timed(lambda: distributed.masked_whiten(x, mask, backend="cpu"), repeats),
        "whiten torch": _timed(lambda: _torch_whiten(x, mask), repeats),
        "loss bitparity": _timed(lambda: distributed.ppo_policy_loss(logp, old, x, mask, backend="cpu"), repeats),
        "loss torch": _timed(lambda: _torch_loss(logp, old, x, mask), repeats),
    }
    if rank == 0:
        results.put(row)
    dist.barrier()
    dist.destroy_process_group()


def _run(world, args):
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_worker, args=(r, world, port, args.rows, args.cols, args.repeats, results))
             for r in range(world)]
    for p in procs:
        p.start()
    row = results.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    table = []
    tokens = args.rows * args.cols
    for world in args.worlds:
        r = _run(world, args)
        local = tokens // world
        table.append([world, f"{1e3 * r['whiten bitparity']:.2f}", f"{1e3 * r['whiten torch']:.2f}",
                      f"{r['whiten bitparity'] / r['whiten torch']:.1f}x",
                      f"{1e3 * r['loss bitparity']:.2f}", f"{1e3 * r['loss torch']:.2f}",
                      f"{r['loss bitparity'] / r['loss torch']:.1f}x",
                      f"{(world - 1) * local * 5:,} / {2 * (world - 1) * 12 // world:,}",
                      f"{(world - 1) * local * 13:,} / {2 * (world - 1) * 8 // world:,}"])
    print(f"global batch [{args.rows}, {args.cols}] float32, gloo on 127.0.0.1, {args.repeats} repeats, median ms")
    print(tabulate(table, headers=["W", "whiten bp", "whiten torch", "ratio", "loss bp", "loss torch", "ratio",
                                   "whiten bytes in/rank bp / torch", "loss bytes in/rank bp / torch"]))


if __name__ == "__main__":
    main()
