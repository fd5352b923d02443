"""Runs one function on W gloo ranks over 127.0.0.1, each in a spawned process, and returns every rank's result.

`run(fn, world, *args)` calls `fn(rank, world, *args)` on each rank after `init_process_group("gloo")` with a
bounded timeout; `fn` must be a module-level function and its arguments and result picklable. The result travels as
`torch.save` bytes: a tensor put on a multiprocessing queue as itself would live in shared memory that dies with
its rank.
A rank that raises reports the exception, which `run` raises in the parent as a RuntimeError naming the rank
(tests that expect an error on every rank return it instead: `outcome(call)`). A rank that dies without
reporting, or a world that does not finish within `join_s`, fails now instead of hanging the suite.

Spawning a world costs a few seconds per rank (each imports torch and bitparity), so a test module runs each
world size once, gathering all its checks into one function (a module-scoped fixture), as tests/test_distributed.py does.
"""

import datetime
import io
import multiprocessing
import queue
import socket
import traceback

import torch
import torch.distributed as dist


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(fn, rank, world, port, args, results):
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
        try:
            value = io.BytesIO()
            torch.save(fn(rank, world, *args), value)
            results.put((rank, True, value.getvalue()))
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - the parent re-raises it with the rank named
        results.put((rank, False, traceback.format_exc()))


def outcome(call):
    """(exception type name, message) of `call()`, or ("ok", None): lets a rank report an expected error."""
    try:
        call()
    except Exception as e:  # noqa: BLE001 - the test compares the type and message
        return type(e).__name__, str(e)
    return "ok", None


def run(fn, world, *args, join_s=300):
    """[fn(0, world, *args), ..., fn(world - 1, world, *args)], each on its own gloo rank."""
    ctx = multiprocessing.get_context("spawn")
    results, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_rank_main, args=(fn, rank, world, port, args, results), daemon=True)
             for rank in range(world)]
    for p in procs:
        p.start()
    got, waited = {}, 0
    try:
        while len(got) < world:
            try:
                rank, ok, value = results.get(timeout=1)
            except queue.Empty:
                waited += 1
                dead = [r for r, p in enumerate(procs) if r not in got and p.exitcode not in (None, 0)]
                if dead or waited >= join_s:
                    raise RuntimeError(f"world {world}: only ranks {sorted(got)} reported within {waited} s; "
                                       f"exit codes {[p.exitcode for p in procs]}") from None
                continue
            if not ok:
                raise RuntimeError(f"world {world}, rank {rank} raised:\n{value}")
            got[rank] = torch.load(io.BytesIO(value), weights_only=False)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [got[r] for r in range(world)]
