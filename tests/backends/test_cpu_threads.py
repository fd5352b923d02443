"""The cpu backend's helper threads (backends/cpu/parallel.c): whichever thread computes which chunk, the bits
are the numpy backend's.

By default a call wakes helpers only for idle cores, so on a busy machine (CI, or a developer's tests running
side by side) it may run alone.  Here bp_set_eager_helpers makes every call wake all its helpers and wait until
they have joined before claiming, so the split over threads is exercised whatever the load.  Each case is one
kind of parallel loop of the C sources: run_rows (softmax), masked_row_sums and run_row_segments
(masked_whiten), select_rows (sample), linear's packing and tiles, and the element loops (exp, kl_penalty,
gae, ppo_policy_loss, philox).
"""

import multiprocessing
import threading

import numpy as np
import pytest
import torch

import bitparity as bp
from bitparity.backends import cpu
from bitparity.backends import numpy as reference
from bitparity.compare.metrics import canonical_bits


def _randn(*shape, seed):
    return torch.from_numpy(np.random.default_rng([seed, *shape]).standard_normal(shape).astype(np.float32))


def _mask(*shape, seed):
    return torch.from_numpy(np.random.default_rng([seed, *shape, 1]).random(shape) < 0.7)


def _cases():
    """name -> fn(backend) giving a tensor or a tuple of tensors."""
    x = _randn(7, 20000, seed=0) * 3                 # 7 rows; two segments each (16384 + 3616)
    m = _mask(5, 33000, seed=1)
    y = _randn(5, 33000, seed=2)
    logp, ref = -_randn(40000, seed=3).abs(), -_randn(40000, seed=4).abs()
    r, v = _randn(9, 3000, seed=5), _randn(9, 3000, seed=6)
    adv, seq_mask = _randn(9, 3000, seed=7), _mask(9, 3000, seed=8)
    a, w = _randn(13, 64, seed=9), _randn(300, 64, seed=10) * 0.1
    seeds, positions = torch.arange(7), torch.full((7,), 17)
    counters = torch.from_numpy(np.random.default_rng(11).integers(0, 2**32, (5000, 4)))
    keys = torch.from_numpy(np.random.default_rng(12).integers(0, 2**32, (5000, 2)))
    return {
        "softmax": lambda backend: bp.softmax(x, temperature=0.7, backend=backend),
        "masked_whiten": lambda backend: bp.masked_whiten(y, m, backend=backend),
        "sample": lambda backend: bp.sample(x, seeds, positions, temperature=0.7, top_k=50, top_p=0.9,
                                            backend=backend),
        "linear": lambda backend: bp.linear(a, w, backend=backend),
        "exp": lambda backend: bp.exp(x, backend=backend),
        "kl_penalty": lambda backend: bp.kl_penalty(logp, ref, "k3", backend=backend),
        "gae": lambda backend: bp.gae(r, v, seq_mask, 0.99, 0.95, backend=backend),
        "ppo_policy_loss": lambda backend: bp.ppo_policy_loss(logp.reshape(8, 5000), ref.reshape(8, 5000),
                                                              _randn(8, 5000, seed=13), _mask(8, 5000, seed=14),
                                                              backend=backend),
        "philox": lambda backend: getattr(cpu if backend == "cpu" else reference, "philox")(counters, keys),
    }


CASES = _cases()


def _bits(result):
    return tuple(canonical_bits(t) for t in (result if isinstance(result, tuple) else (result,)))


def _equal(got, want):
    return len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want))


@pytest.fixture
def eager(monkeypatch):
    # Every call asks for threads however small its work, and every helper it asks for joins.
    monkeypatch.setattr(cpu, "_PARALLEL_WORK", 0)
    lib = cpu.build()._lib
    threads = torch.get_num_threads()
    lib.bp_set_eager_helpers(1)
    yield
    lib.bp_set_eager_helpers(0)
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", CASES)
def test_any_split_over_threads_gives_the_numpy_bits(name, eager):
    want = _bits(CASES[name]("numpy"))
    for threads in (2, 3):                          # 3: more threads than this machine's 2 cores
        torch.set_num_threads(threads)
        assert _equal(_bits(CASES[name]("cpu")), want), f"{name} on {threads} threads"


def test_concurrent_callers_give_the_numpy_bits(eager):
    # ctypes releases the GIL, so two Python threads call the C library at once: one job holds the helpers,
    # the other runs alone on its caller.
    torch.set_num_threads(2)
    want = _bits(CASES["softmax"]("numpy"))
    results = []

    def call():
        results.extend(_equal(_bits(CASES["softmax"]("cpu")), want) for _ in range(4))

    callers = [threading.Thread(target=call) for _ in range(2)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert results == [True] * 8


def _child(x, want):
    # The forked child has no helper thread: the pool must start new ones, or the eager call waits forever.
    # Only the C library runs here: torch's own OpenMP regions hang in a child forked after the parent
    # used them (GNU libgomp), which the comparison below would risk on tensors this large.
    raise SystemExit(0 if np.array_equal(cpu.exp(x).numpy().view(np.int32), want) else 1)


def test_a_forked_child_starts_its_own_helpers(eager):
    torch.set_num_threads(2)
    x = _randn(7, 20000, seed=0)
    want = reference.exp(x).numpy().view(np.int32)
    assert np.array_equal(cpu.exp(x).numpy().view(np.int32), want)     # the parent's helpers exist before the fork
    child = multiprocessing.get_context("fork").Process(target=_child, args=(x, want))
    child.start()
    child.join(timeout=120)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail("the forked child's parallel call did not return")
    assert child.exitcode == 0
