"""Vocab-parallel token_logprobs, logsumexp, entropy and sample (spec 31.3) give one process's bits at world sizes
1, 2 and 4: forward and backward, on numpy and cpu in every world, and on cuda (Triton interpreter) and ascend
(host emulation) in a small two-segment case in the world of 2. The expected bits are the single-process ops',
computed in the parent. Negative control: Megatron's contiguous even split with a float all_reduce of the ranks'
sums changes bits between one and two ranks. Mismatched shards and arguments give the same error on every rank."""

import pytest
import torch
import torch.distributed as dist

import bitparity
from bitparity import parallel, spec
from bitparity.parallel import vocab_shard

from .world import outcome, run

S = spec.SEGMENT
WORLDS = (1, 2, 4)
BACKENDS = ("numpy", "cpu")
GRAD = torch.tensor([0.75, -1.5, 2.0, 0.5, 1.0])       # the upstream gradient, per row (the same on every rank)


def _rows(vocab, rows, seed):
    """Logits [rows, vocab] with the special rows of spec 9: random, a NaN, all -inf, a +inf, one dominant token."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g) * 4
    kinds = ("random", "nan", "all -inf", "+inf", "dominant")
    for r in range(rows):
        kind = kinds[r % len(kinds)]
        if kind == "nan":
            x[r, vocab // 3] = float("nan")
        elif kind == "all -inf":
            x[r] = float("-inf")
        elif kind == "+inf":
            x[r, vocab - 1] = float("inf")
        elif kind == "dominant":
            x[r, vocab // 2] = 60.0
        if kind in ("random", "dominant") and vocab > 8:
            x[r, ::7] = float("-inf")                    # masked entries inside a live row
    tokens = torch.randint(0, vocab, (rows,), generator=g)
    tokens[-1] = vocab // 2
    return x, tokens


# (name, vocab, rows, temperature, backends): a vocabulary smaller than a segment (ranks 1.. hold nothing), three
# segments and a short one (at 4 ranks, rank 3 holds nothing), and Qwen3's 151936 (10 segments, the last short).
CASES = [("small", 1000, 5, 1.0, BACKENDS), ("segments", 3 * S + 300, 5, 0.7, BACKENDS),
         ("qwen3", 151936, 2, 1.0, ("cpu",))]
# (temperature, top_k, top_p, min_p, logprobs) per sample call; "rows" is one temperature per row, the first 0
# (greedy). The interpreted and emulated backends run the last, unfiltered one; the others the first three.
SAMPLING = [(1.3, 0, 0.9, 0.0, "processed"), (0.7, 50, 1.0, 0.05, "processed"), ("rows", 3, 0.5, 0.1, "scaled"),
            (1.3, 0, 1.0, 0.0, "raw")]


def _temperature(t, rows):
    return torch.tensor([0.0, 0.5, 1.0, 2.0, 0.9][:rows]) if t == "rows" else t


def _case(name):
    _, vocab, rows, temperature, _ = next(c for c in CASES if c[0] == name)
    x, tokens = _rows(vocab, rows, seed=vocab)
    return x, tokens, temperature


def _seeds(rows):
    return torch.arange(rows, dtype=torch.int64) * 7919 - 3, torch.arange(rows, dtype=torch.int64) + 11


def _softmax_ops(x, tokens, temperature, backend, grad, op):
    """(forward, gradient) of each differentiable op on logits x (a shard, or the whole row with op = bitparity)."""
    out = {}
    for name, call in (("token_logprobs", lambda t: op.token_logprobs(t, tokens, temperature=temperature,
                                                                       backend=backend)),
                       ("logsumexp", lambda t: op.logsumexp(t, temperature=temperature, backend=backend)),
                       ("entropy", lambda t: op.entropy(t, temperature=temperature, backend=backend))):
        leaf = x.clone().requires_grad_(True)
        y = call(leaf)
        y.backward(grad[:x.shape[0]])
        out[name] = (y.detach(), leaf.grad)
    return out


def _samples(x, backend, sample, calls=SAMPLING[:3]):
    seeds, positions = _seeds(x.shape[0])
    return [sample(x, seeds, positions, temperature=_temperature(t, x.shape[0]), top_k=k, top_p=p, min_p=m,
                   logprobs=kind, backend=backend) for t, k, p, m, kind in calls]


class _Parallel:
    """The parallel ops with the keyword arguments of bitparity's (group=None: the default group)."""
    token_logprobs = staticmethod(lambda t, tokens, **kw: parallel.token_logprobs(t, tokens, **kw))
    logsumexp = staticmethod(lambda t, **kw: parallel.logsumexp(t, **kw))
    entropy = staticmethod(lambda t, **kw: parallel.entropy(t, **kw))


class _One:
    token_logprobs = staticmethod(lambda t, tokens, temperature, backend: bitparity.token_logprobs(
        t, tokens, temperature, backend=backend))
    logsumexp = staticmethod(lambda t, temperature, backend: bitparity.logsumexp(t, None, temperature,
                                                                                 backend=backend))
    entropy = staticmethod(lambda t, temperature, backend: bitparity.entropy(t, None, temperature,
                                                                             backend=backend))


def _numpy(value):
    """Tensors as numpy arrays (a rank's tensors must not outlive it in shared memory), recursively."""
    if isinstance(value, torch.Tensor):
        return value.detach().numpy()
    if isinstance(value, dict):
        return {k: _numpy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_numpy(v) for v in value)
    return value


def _shard(x, world, rank):
    held = vocab_shard(x.shape[-1], world, rank)
    return x[..., held.start:held.stop].contiguous()


def _megatron_logsumexp(x):
    """Megatron's vocab-parallel logsumexp (the negative control): an even contiguous split V / W, the maximum by
    all_reduce MAX, each rank's sum of exponentials (bitparity's canonical sum of its shard), all_reduce SUM of the
    float partials, then max + log."""
    world, rank = dist.get_world_size(), dist.get_rank()
    width = x.shape[1] // world
    mine = x[:, rank * width:(rank + 1) * width]
    top = mine.amax(dim=1)
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    total = bitparity.sum(bitparity.exp(mine - top[:, None], backend="cpu"), backend="cpu")
    dist.all_reduce(total)                                  # float addition inside the collective
    return top + bitparity.log(total, backend="cpu")


def _control_rows():
    g = torch.Generator().manual_seed(5)
    return torch.randn(16, 2 * S + 2 * 300, generator=g) * 3


def _faults(rank, world):
    """Each fault on every rank: the (type, message) every rank reports."""
    x, tokens, _ = _case("segments")
    mine = _shard(x, world, rank)
    short = mine[:, :-1] if rank == 0 else mine            # the last rank's shard may be short; rank 0's may not
    other_tokens = tokens + (1 if rank == world - 1 else 0)
    seeds, positions = _seeds(x.shape[0])
    return {
        "short shard": outcome(lambda: parallel.token_logprobs(short, tokens)),
        "even split": outcome(lambda: parallel.entropy(x[:, rank * (x.shape[1] // world):
                                                         (rank + 1) * (x.shape[1] // world)])),
        "tokens differ": outcome(lambda: parallel.token_logprobs(mine, other_tokens)),
        "temperature differs": outcome(lambda: parallel.entropy(mine, temperature=1.0 + (rank == world - 1))),
        "seeds differ": outcome(lambda: parallel.sample(mine, seeds + (rank == world - 1), positions)),
        "token range": outcome(lambda: parallel.token_logprobs(mine, tokens + x.shape[1])),
    }


def _rank_checks(rank, world):
    # One thread per rank: the ranks share the machine's cores, where torch's spinning intra-op threads of several
    # ranks would compete (measured: 8x the CPU time of one thread on a loaded two-core machine).
    torch.set_num_threads(1)
    out = {}
    for name, _, _, _, backends in CASES:
        x, tokens, temperature = _case(name)
        mine = _shard(x, world, rank)
        for backend in backends:
            out[name, backend] = (_softmax_ops(mine, tokens, temperature, backend, GRAD, _Parallel),
                                  _samples(mine, backend, parallel.sample))
    if world == 2:
        x, tokens = _rows(S + 200, 2, seed=3)
        mine = _shard(x, world, rank)
        for backend in ("cuda", "ascend"):
            out["two segments", backend] = (_softmax_ops(mine, tokens, 0.8, backend, GRAD, _Parallel),
                                            _samples(mine, backend, parallel.sample, SAMPLING[3:]))
        out["control"] = _megatron_logsumexp(_control_rows())
        out["control, vocab-parallel"] = parallel.logsumexp(_shard(_control_rows(), world, rank), backend="cpu")
    if world > 1:
        out["faults"] = _faults(rank, world)
    return _numpy(out)


def _single(name, backend):
    x, tokens, temperature = _case(name)
    return _softmax_ops(x, tokens, temperature, backend, GRAD, _One), _samples(x, backend, bitparity.sample)


def _single_two_segments(backend):
    x, tokens = _rows(S + 200, 2, seed=3)
    return _softmax_ops(x, tokens, 0.8, backend, GRAD, _One), _samples(x, backend, bitparity.sample, SAMPLING[3:])


@pytest.fixture(scope="module")
def singles():
    """The single-process results, computed first: this also builds the cpu and ascend libraries here, once, before
    the ranks would each build them."""
    out = {(name, backend): _single(name, backend) for name, _, _, _, backends in CASES for backend in backends}
    out.update({("two segments", backend): _single_two_segments(backend) for backend in ("cuda", "ascend")})
    return out


@pytest.fixture(scope="module")
def worlds(singles):
    """{world size: every rank's results}: one world per size for the whole module (spawning costs seconds)."""
    return {size: run(_rank_checks, size) for size in WORLDS}


def _bits(t):
    t = torch.as_tensor(t)
    if t.dtype != torch.float32:
        return t
    return torch.where(t != t, float("nan"), t).view(torch.int32)        # NaN payloads are not specified


def _same(got, want, what):
    assert torch.equal(_bits(got), _bits(want)), what


def _check(world, got, single, what):
    """Every rank's forward equals one process's; the ranks' gradients, concatenated in rank order, equal its."""
    (ops_one, samples_one) = single
    for op, (y, dx) in ops_one.items():
        for rank in range(world):
            _same(got[rank][0][op][0], y, f"{what}: {op} on rank {rank}")
        _same(torch.cat([torch.as_tensor(got[rank][0][op][1]) for rank in range(world)], dim=1), dx,
              f"{what}: {op}'s gradient")
    for i, (tokens, logprobs) in enumerate(samples_one):
        for rank in range(world):
            _same(got[rank][1][i][0], tokens, f"{what}: sample call {i}'s tokens on rank {rank}")
            _same(got[rank][1][i][1], logprobs, f"{what}: sample call {i}'s logprobs on rank {rank}")


@pytest.mark.parametrize("case, backend", [(c[0], b) for c in CASES for b in c[4]])
@pytest.mark.parametrize("size", WORLDS)
def test_matches_one_process(singles, worlds, size, case, backend):
    _check(size, [g[case, backend] for g in worlds[size]], singles[case, backend], f"world {size}, {case}, {backend}")


@pytest.mark.parametrize("backend", ("cuda", "ascend"))
def test_two_segments_on_interpreted_and_emulated_backends(singles, worlds, backend):
    """cuda runs in the Triton interpreter and ascend in the g++ host emulation, in the world of 2 only."""
    _check(2, [g["two segments", backend] for g in worlds[2]], singles["two segments", backend],
           f"world 2, two segments, {backend}")


def test_float_all_reduce_of_partials_is_not_world_size_invariant(worlds):
    """Negative control: Megatron's even split V / 2 cuts a segment and adds two float partials in all_reduce;
    its logsumexp differs from one process's on some row, where the vocab-parallel one does not."""
    got = worlds[2]
    x = _control_rows()
    top = x.amax(dim=1)
    one = top + bitparity.log(bitparity.sum(bitparity.exp(x - top[:, None], backend="cpu"), backend="cpu"),
                              backend="cpu")
    megatron = torch.as_tensor(got[0]["control"])
    assert not torch.equal(_bits(megatron), _bits(one))
    _same(got[0]["control, vocab-parallel"], bitparity.logsumexp(x, backend="cpu"), "vocab-parallel logsumexp")


@pytest.mark.parametrize("size", WORLDS[1:])
def test_bad_arguments_give_the_same_error_on_every_rank(worlds, size):
    faults = [g["faults"] for g in worlds[size]]
    for name in faults[0]:
        assert all(f[name] == faults[0][name] for f in faults), name
    expected = {"short shard": ("ValueError", "must hold vocab_shard("),
                "even split": ("ValueError", "must hold vocab_shard("),
                "tokens differ": ("ValueError", "tokens must be the same on every rank"),
                "temperature differs": ("ValueError", "temperature must be the same on every rank"),
                "seeds differ": ("ValueError", "seeds must be the same on every rank"),
                "token range": ("ValueError", "tokens must lie in [0, ")}
    for name, (kind, fragment) in expected.items():
        assert faults[0][name][0] == kind and fragment in faults[0][name][1], (name, faults[0][name])


def test_vocab_shard_is_whole_segments_in_rank_order():
    for vocab in (1, 1000, S, S + 1, 151936, 10 * S):
        for size in (1, 2, 3, 4, 8):
            held = [vocab_shard(vocab, size, r) for r in range(size)]
            assert [i for r in held for i in r] == list(range(vocab))
            segments = -(-vocab // S)
            counts = [-(-len(r) // S) for r in held]
            assert max(counts) - min(counts) <= 1 and sum(counts) == segments
            assert all(r.start % S == 0 for r in held if len(r))
    assert [len(vocab_shard(151936, 4, r)) for r in range(4)] == [3 * S, 3 * S, 2 * S, S + 4480]
    with pytest.raises(ValueError, match="rank must be < world_size"):
        vocab_shard(10, 2, 2)
    with pytest.raises(TypeError, match="vocab_size must be an integer"):
        vocab_shard(10.0, 2, 0)
