"""Every input torch can build: views with the same values give the contiguous copy's bits on every backend,
and tensors the backends cannot read get a clear error naming the argument (ops.py's entry normalisation)."""

import numpy as np
import pytest
import torch

import bitparity as bp


def variants(x):
    """Tensors equal in value to x, each in a layout the backends must not misread."""
    out = {"transposed": x.t().contiguous().t() if x.dim() == 2 else x.flip(0).contiguous().flip(0),
           "neg-view": torch._neg_view(-x),
           "conj-imag": torch.complex(torch.zeros_like(x), -x).conj().imag}
    base = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype)
    base[..., ::2] = x
    out["step-sliced"] = base[..., ::2]
    flat = torch.cat([torch.zeros(7, dtype=x.dtype), x.reshape(-1)])
    out["storage-offset"] = flat[7:].view(x.shape)
    if x.dtype == torch.float32:
        buf = bytearray(x.numel() * 4 + 2)
        misaligned = torch.frombuffer(buf, dtype=torch.float32, offset=2, count=x.numel()).view(x.shape)
        misaligned.copy_(x)
        out["misaligned"] = misaligned
    if x.dim() == 2:
        out["expanded"] = x[:1].expand(x.shape)
    return out


def _same(a, b):
    a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
    for u, v in zip(a, b, strict=True):
        if u.is_floating_point():
            u, v = torch.nan_to_num(u, nan=0.5), torch.nan_to_num(v, nan=0.5)
            assert torch.equal(u.view(torch.int32), v.view(torch.int32))
        else:
            assert torch.equal(u, v)


G = torch.Generator().manual_seed(0)
X = torch.randn(4, 40, generator=G) * 3
MASK = torch.rand(4, 40, generator=G) < 0.8
TOKENS = torch.tensor([0, 7, 39, 3])
CALLS = {
    "logsumexp": lambda x, be: bp.logsumexp(x, MASK, 0.7, backend=be),
    "token_logprobs": lambda x, be: bp.token_logprobs(x, TOKENS, 0.7, backend=be),
    "exp": lambda x, be: bp.exp(x, backend=be),
    "sum": lambda x, be: bp.sum(x, backend=be),
    "masked_whiten": lambda x, be: bp.masked_whiten(x, MASK, backend=be),
    "kl_penalty": lambda x, be: bp.kl_penalty(x, X, "k3", backend=be),
    "topk": lambda x, be: bp.topk(x, 5, backend=be),
    "silu_mul": lambda x, be: bp.silu_mul(x, X, backend=be),
    "linear": lambda x, be: bp.linear(x, X[:3], backend=be),
}


@pytest.mark.parametrize("op", CALLS)
def test_views_give_the_contiguous_copys_bits(any_backend, op):
    call = CALLS[op]
    for name, x in variants(X).items():
        want = call(x.contiguous().clone() if name != "expanded" else x.contiguous(), any_backend)
        _same(call(x, any_backend), want)


def test_per_row_parameter_views_are_read_as_their_values(any_backend):
    """A stride-0 or column-sliced top_k / temperature reaches the kernels as the values it holds."""
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(3))
    seeds, positions = torch.arange(6), torch.zeros(6, dtype=torch.int64)
    dense = {"top_k": torch.full((6,), 5), "temperature": torch.full((6,), 0.7)}
    views = {"top_k": torch.tensor([5]).expand(6), "temperature": torch.full((6, 3), 0.7)[:, 1]}
    want = bp.sample(logits, seeds, positions, **dense, backend=any_backend)
    _same(bp.sample(logits, seeds, positions, **views, backend=any_backend), want)
    _same(bp.filter_logits(logits, **views, backend=any_backend), bp.filter_logits(logits, **dense, backend=any_backend))


def test_gradients_through_views_match_the_contiguous_copy():
    """The views are built from the leaf by differentiable torch ops, so the gradient reaches it through them."""
    views = {"transposed": lambda v: v.t().contiguous().t(),
             "step-sliced": lambda v: torch.stack([v, torch.zeros_like(v)], -1).reshape(4, 80)[:, ::2],
             "neg-view": lambda v: torch._neg_view(-v)}
    want = None
    for name, make in {"contiguous": lambda v: v, **views}.items():
        leaf = X.clone().requires_grad_()
        bp.token_logprobs(make(leaf), TOKENS, 0.7, backend="cpu").sum().backward()
        want = leaf.grad if want is None else want
        _same(leaf.grad, want)


@pytest.mark.parametrize("bad,error,match", [
    (torch.empty(4, 40, device="meta"), ValueError, "x must hold data; got a tensor on the meta device"),
    (X.to_sparse(), TypeError, r"x must be a dense \(strided\) tensor; got layout torch.sparse_coo"),
])
def test_tensors_without_dense_data_are_refused_by_name(bad, error, match):
    with pytest.raises(error, match=match):
        bp.logsumexp(bad)
    with pytest.raises(error, match=match):
        bp.exp(bad)


def test_bad_index_and_mask_layouts_name_the_argument():
    """A secondary tensor on another device (meta included) is named as such, before anything reads it."""
    meta_tokens = torch.empty(4, dtype=torch.int64, device="meta")
    with pytest.raises(ValueError, match="tokens must be on logits' device, cpu; got meta"):
        bp.token_logprobs(X, meta_tokens)
    with pytest.raises(ValueError, match="logits must hold data; got a tensor on the meta device"):
        bp.token_logprobs(X.to("meta"), meta_tokens)
    with pytest.raises(TypeError, match=r"mask must be a dense \(strided\) tensor"):
        bp.sum(X, MASK.to_sparse())
    with pytest.raises(ValueError, match="top_k must be on logits' device"):
        bp.filter_logits(X, top_k=torch.empty(4, dtype=torch.int64, device="meta"))


def test_numpy_reads_neg_views_too():
    """The numpy backend got the sign right before (torch's .numpy() refuses neg views); now it is the same path."""
    x = torch._neg_view(-X)
    assert np.array_equal(bp.exp(x, backend="numpy").numpy(), bp.exp(X, backend="numpy").numpy())


def test_use_backend_belongs_to_the_thread_that_set_it():
    import threading
    inside, seen = threading.Event(), []

    def holder():
        with bp.use_backend("numpy"):
            inside.set()
            done.wait(10)

    done = threading.Event()
    thread = threading.Thread(target=holder)
    thread.start()
    inside.wait(10)
    seen.append(bp.current_backend())
    done.set()
    thread.join(10)
    assert seen == [None] and bp.current_backend() is None
