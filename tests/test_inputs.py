"""Every input torch can build, for every public op (an OpInfo-style table): each tensor argument in each layout
torch can give it reads as its values on every canonical backend; tensors without dense data are refused by
name before anything reads them; inputs that require grad carry a gradient or are refused as documented."""

import threading

import pytest
import torch

import bitparity as bp
from bitparity.backends import _module
from bitparity.compare.metrics import canonical_bits

G = torch.Generator().manual_seed(0)


def _randn(*shape, scale=1.0):
    return torch.randn(*shape, generator=G) * scale


def _ints(low, high, *shape):
    return torch.randint(low, high, shape, generator=G)


# -- the layouts ------------------------------------------------------------------------------------------

KINDS = ("transposed", "step-sliced", "expanded", "storage-offset", "neg-view", "conj-imag", "misaligned")


def variant(t, kind):
    """t in the layout called kind, or None where that layout cannot hold t's dtype or shape.

    Every kind holds t's values except "expanded": a stride-0 dimension can only repeat one slice, so it is
    t's first slice repeated, and is compared with a fresh copy of those values."""
    if kind == "transposed" and t.dim() >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if kind == "step-sliced" and t.dim() >= 1:
        base = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
        base[..., ::2] = t
        return base[..., ::2]
    if kind == "expanded" and t.dim() >= 1 and t.shape[0] > 1:
        return t[:1].expand(t.shape)
    if kind == "storage-offset":
        return torch.cat([torch.zeros(7, dtype=t.dtype), t.reshape(-1)])[7:].view(t.shape)
    if kind == "neg-view" and t.dtype != torch.bool:
        return torch._neg_view(-t)                     # raw memory holds -t; is_neg() says to negate on read
    if kind == "conj-imag" and t.dtype == torch.float32:
        return torch.complex(torch.zeros_like(t), -t).conj().imag     # a real view with a pending negation
    if kind == "misaligned" and t.is_floating_point():
        size = t.element_size()
        buf = bytearray(t.numel() * size + size // 2)
        out = torch.frombuffer(buf, dtype=t.dtype, offset=size // 2, count=t.numel()).view(t.shape)
        return out.copy_(t)
    return None


def test_each_variant_is_the_layout_it_names():
    """The table below means something only if each variant really is that layout, with t's values."""
    x = _randn(3, 4)
    checks = {"transposed": lambda v: not v.is_contiguous(), "step-sliced": lambda v: v.stride(-1) == 2,
              "expanded": lambda v: v.stride(0) == 0, "storage-offset": lambda v: v.storage_offset() == 7,
              "neg-view": lambda v: v.is_neg(), "conj-imag": lambda v: v.is_neg() and v.stride(-1) == 2,
              "misaligned": lambda v: v.data_ptr() % 4 == 2}
    for kind in KINDS:
        v = variant(x, kind)
        assert checks[kind](v), kind
        assert torch.equal(v, x[:1].expand(x.shape) if kind == "expanded" else x), kind
    assert variant(torch.zeros(3, dtype=torch.bool), "neg-view") is None
    assert variant(torch.zeros(3, dtype=torch.int64), "misaligned") is None


# -- the table: op -> (function, tensor arguments by name, other arguments) -------------------------------

B, V, T = 3, 8, 5
X = _randn(B, V, scale=3.0)
MASK = torch.rand(B, V, generator=G) < 0.7
MASK[1] = False                                        # a fully masked row
TEMPERATURE = torch.tensor([0.7, 1.0, 1.3])
LOGP, OLD_LOGP = -_randn(B, T).abs(), -_randn(B, T).abs()
TOKEN_MASK = torch.rand(B, T, generator=G) < 0.8
ROLLOUT_LOGP = torch.where(torch.rand(B, T, generator=G) < 0.5, LOGP, LOGP - 0.01)
BEAM_TABLE = _randn(6, V, V, scale=2.0)


def _table_step(sequences):
    """A deterministic next-token table: the logits depend on (length, last token) only."""
    return BEAM_TABLE[sequences.shape[1]][sequences[:, -1]]


CASES = {
    "sum": (bp.sum, {"x": X, "mask": MASK}, {}),
    "logsumexp": (bp.logsumexp, {"x": X, "mask": MASK, "temperature": TEMPERATURE}, {}),
    "log_softmax": (bp.log_softmax, {"x": X, "mask": MASK, "temperature": TEMPERATURE}, {}),
    "softmax": (bp.softmax, {"x": X, "mask": MASK, "temperature": TEMPERATURE}, {}),
    "entropy": (bp.entropy, {"logits": X, "mask": MASK, "temperature": TEMPERATURE}, {}),
    "token_logprobs": (bp.token_logprobs, {"logits": X, "tokens": torch.tensor([0, 5, 7]),
                                           "temperature": TEMPERATURE}, {}),
    "exp": (bp.exp, {"x": X}, {}),
    "log": (bp.log, {"x": X.abs()}, {}),
    "gae": (bp.gae, {"rewards": _randn(B, T), "values": _randn(B, T), "mask": TOKEN_MASK, "bootstrap": _randn(B)},
            {"gamma": 0.9, "lam": 0.8}),
    "masked_mean": (bp.masked_mean, {"x": _randn(B, T), "mask": TOKEN_MASK}, {}),
    "masked_whiten": (bp.masked_whiten, {"x": _randn(B, T), "mask": TOKEN_MASK}, {}),
    "kl_penalty": (bp.kl_penalty, {"logp": LOGP, "ref_logp": OLD_LOGP}, {"kind": "k3", "log_ratio_clamp": 20.0}),
    "ppo_policy_loss": (bp.ppo_policy_loss, {"logp": LOGP, "old_logp": OLD_LOGP, "advantages": _randn(B, T),
                                             "mask": TOKEN_MASK}, {"dual_clip": 3.0}),
    "rollout_correction": (bp.rollout_correction, {"old_logp": LOGP, "rollout_logp": OLD_LOGP, "mask": TOKEN_MASK},
                           {"level": "geometric", "mode": "mask", "threshold_low": 0.5}),
    "topk": (bp.topk, {"x": X}, {"k": 3}),
    "filter_logits": (bp.filter_logits, {"logits": X, "temperature": TEMPERATURE, "top_k": torch.tensor([0, 3, 5]),
                                         "top_p": torch.tensor([0.9, 1.0, 0.5]),
                                         "min_p": torch.tensor([0.0, 0.1, 0.05])}, {}),
    "sample": (bp.sample, {"logits": X, "seeds": torch.tensor([3, 1, 4]), "positions": torch.tensor([0, 9, 2]),
                           "temperature": TEMPERATURE, "top_k": torch.tensor([0, 3, 5]),
                           "top_p": torch.tensor([0.9, 1.0, 0.5]), "min_p": torch.tensor([0.0, 0.1, 0.05])},
               {"logprobs": "scaled"}),             # not "processed": filter_logits has its own row, and cuda is slow
    "beam_search_step": (bp.beam_search_step, {"beam_scores": -_randn(2, 3).abs(), "logits": _randn(2, 3, V),
                                               "lengths": _ints(1, 6, 2, 3)}, {"beam_width": 4, "length_penalty": 1.5}),
    "beam_search": (bp.beam_search, {"input_ids": _ints(0, V, 2, 2)},
                    {"step_fn": _table_step, "num_beams": 2, "max_new_tokens": 2, "eos_token_id": 0}),
    "linear": (bp.linear, {"x": _randn(B, 4), "weight": _randn(5, 4), "bias": _randn(5)}, {}),
    "rms_norm": (bp.rms_norm, {"x": X, "weight": _randn(V)}, {}),
    "rotary": (bp.rotary, dict(zip(("x", "cos", "sin"), (X, *bp.rotary_tables(B, V)))), {}),
    "attention": (bp.attention, {"q": _randn(2, 2, 2, 4), "k": _randn(2, 2, 5, 4), "v": _randn(2, 2, 5, 4),
                                 "kv_lengths": torch.tensor([4, 5])}, {}),
    "silu_mul": (bp.silu_mul, {"gate": X, "up": _randn(B, V)}, {}),
    "moe": (bp.moe, {"x": _randn(B, 4), "router_weight": _randn(3, 4), "gate_proj": _randn(3, 6, 4),
                     "up_proj": _randn(3, 6, 4), "down_proj": _randn(3, 4, 6)}, {"top_k": 2}),
    "embedding": (bp.embedding, {"tokens": _ints(0, V, B, 2), "weight": _randn(V, 4)}, {}),
    "metrics.mismatch": (bp.metrics.mismatch, {"train_logp": LOGP, "rollout_logp": ROLLOUT_LOGP, "mask": TOKEN_MASK},
                         {"correction": {"level": "token", "mode": "mask", "threshold": 1.5}}),
}


def test_the_table_has_every_public_op():
    ops = {name for name in bp.__all__ if callable(getattr(bp, name)) and not isinstance(getattr(bp, name), type)}
    ops -= {"backends", "current_backend", "use_backend", "rotary_tables"}      # no tensor arguments
    ops -= {"patch", "unpatch"}              # take a model, not tensors (tests/test_hf.py)
    assert ops | {"metrics.mismatch"} == set(CASES)


def _bits(out):
    """An op's outputs as a flat list of tensors to compare exactly: floats as int32 bits, NaN canonicalised."""
    if isinstance(out, dict):
        return [t for key in sorted(out) for t in _bits(out[key])]
    if isinstance(out, tuple):
        return [t for item in out for t in _bits(item)]
    return [canonical_bits(out) if out.is_floating_point() else out]


def _run(op, backend, replaced):
    """CASES[op] on backend with the tensor arguments named in replaced swapped for the tensors given."""
    fn, tensors, others = CASES[op]
    return _bits(fn(**{**tensors, **replaced}, **others, backend=backend))


def _fresh(v):
    """v's values in a new contiguous tensor (v.contiguous() would keep a pending negation)."""
    return torch.empty(v.shape, dtype=v.dtype).copy_(v)


def _differs(op, backend, replaced):
    """Whether the views in replaced give other bits than fresh copies of their values."""
    got = _run(op, backend, replaced)
    want = _run(op, backend, {name: _fresh(v) for name, v in replaced.items()})
    return not all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def _each_alone(op, backend):
    """Each tensor argument alone in each layout: the (argument, layout) pairs that change the bits."""
    _, tensors, _ = CASES[op]
    views = {(name, kind): variant(t, kind) for name, t in tensors.items() for kind in KINDS}
    return [pair for pair, v in views.items() if v is not None and _differs(op, backend, {pair[0]: v})]


def _first_fitting_kind(t, start):
    """The first layout from KINDS[start] on, cyclically, that can hold t (storage-offset holds any tensor)."""
    return next(kind for kind in KINDS[start:] + KINDS[:start] if variant(t, kind) is not None)


def _all_at_once(op, backend):
    """Every tensor argument at once, argument i of the table's op j in the first layout that fits from
    KINDS[(i + j) % 7] on, so the table as a whole sends arguments through every layout: all the
    (argument, layout) pairs if the bits change, else none."""
    _, tensors, _ = CASES[op]
    shift = list(CASES).index(op)
    chosen = {name: _first_fitting_kind(t, (i + shift) % len(KINDS)) for i, (name, t) in enumerate(tensors.items())}
    replaced = {name: variant(tensors[name], kind) for name, kind in chosen.items()}
    return list(chosen.items()) if _differs(op, backend, replaced) else []


# The Triton interpreter takes 0.03 to 2 s a call (topk, filter_logits, sample and beam search the longest),
# so cuda gets one call per op, with every argument at once in some layout; the other backends take
# milliseconds a call and get every (argument, layout) pair alone.
@pytest.mark.parametrize("op", CASES)
def test_every_layout_of_every_argument_gives_the_bits_of_a_fresh_copy(any_backend, op):
    bad = (_all_at_once if any_backend == "cuda" else _each_alone)(op, any_backend)
    assert not bad, f"{op} on {any_backend}: the bits changed with these (argument, layout) pairs: {bad}"


def test_the_raw_memory_of_a_view_holds_other_values():
    """The negative control: the cpu backend handed a view's raw memory, as it was before ops.py made every
    input dense, computes other bits, so the table above can fail."""
    cpu = _module("cpu")
    negated = torch._neg_view(-X)                         # contiguous, and its memory holds -X
    repeated = X[:1].expand(X.shape)                      # its memory past the first row holds X's other rows
    assert not torch.equal(canonical_bits(cpu.exp(negated)), canonical_bits(cpu.exp(X)))
    want = canonical_bits(cpu.sum(repeated.contiguous(), None))
    assert not torch.equal(canonical_bits(cpu.sum(repeated, None)), want)
    assert torch.equal(canonical_bits(bp.exp(negated, backend="cpu")), canonical_bits(cpu.exp(X)))
    assert torch.equal(canonical_bits(bp.sum(repeated, backend="cpu")), want)


# -- tensors the backends cannot read ------------------------------------------------------------------------

@pytest.mark.parametrize("op", CASES)
def test_meta_and_sparse_arguments_are_refused_by_name(op):
    """Checked before anything reads a value (.item() on a meta tensor raises; a sparse tensor has no strides)."""
    fn, tensors, others = CASES[op]
    for name, t in tensors.items():
        with pytest.raises(ValueError, match=rf"^{name} must .*meta"):
            fn(**{**tensors, name: t.to("meta")}, **others, backend="numpy")
        with pytest.raises(TypeError, match=rf"^{name} must be a dense \(strided\) tensor; got layout torch.sparse"):
            fn(**{**tensors, name: t.to_sparse()}, **others, backend="numpy")


def test_mkldnn_and_nested_tensors_are_refused_by_name():
    with pytest.raises(TypeError, match=r"^x must be a dense \(strided\) tensor; got layout torch._mkldnn"):
        bp.exp(X.to_mkldnn())
    with pytest.raises(TypeError, match=r"^logits must be a dense \(strided\) tensor; got layout .* \(nested\)"):
        bp.token_logprobs(torch.nested.nested_tensor([X[0], X[1, :5]], layout=torch.jagged), torch.tensor([0, 1]))


# -- inputs that require grad ----------------------------------------------------------------------------------

# The (op, argument) pairs spec 26 and 29 differentiate (the model blocks' constant arguments, like rotary's
# tables, are refused by name); metrics.mismatch's outputs are logged numbers without a gradient; every other
# float argument is refused with a ValueError naming it.
DIFFERENTIABLE = {("sum", "x"), ("logsumexp", "x"), ("log_softmax", "x"), ("softmax", "x"), ("entropy", "logits"),
                  ("token_logprobs", "logits"), ("exp", "x"), ("masked_mean", "x"), ("masked_whiten", "x"),
                  ("kl_penalty", "logp"), ("kl_penalty", "ref_logp"), ("ppo_policy_loss", "logp"), ("topk", "x"),
                  ("embedding", "weight"), ("linear", "x"), ("linear", "weight"), ("linear", "bias"),
                  ("rms_norm", "x"), ("rms_norm", "weight"), ("rotary", "x"), ("attention", "q"), ("attention", "k"),
                  ("attention", "v"), ("silu_mul", "gate"), ("silu_mul", "up"), ("moe", "x"), ("moe", "router_weight"),
                  ("moe", "gate_proj"), ("moe", "up_proj"), ("moe", "down_proj")}


def _outputs(out):
    return list(out.values()) if isinstance(out, dict) else list(out) if isinstance(out, tuple) else [out]


def _gradient_flows(outs, leaf):
    outs = [o for o in outs if o.requires_grad]
    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    return leaf.grad is not None and leaf.grad.shape == leaf.shape


@pytest.mark.parametrize("op", CASES)
def test_each_float_argument_that_requires_grad_is_differentiated_or_refused_by_name_on_numpy(op):
    """The numpy backend reads tensors through .numpy(), which refuses a tensor that requires grad: every float
    argument, not only the first, reaches it detached inside an autograd node, or is refused by name."""
    fn, tensors, others = CASES[op]
    for name, t in tensors.items():
        if not t.is_floating_point():
            continue
        leaf = t.clone().requires_grad_()
        call = lambda: _outputs(fn(**{**tensors, name: leaf}, **others, backend="numpy"))     # noqa: E731
        names_it = rf"\b{name}\b.* requires grad|\b{name} is not differentiable"
        if (op, name) in DIFFERENTIABLE:
            assert _gradient_flows(call(), leaf), (op, name)
        elif op == "metrics.mismatch":
            assert not any(o.requires_grad for o in call()), name
        else:
            with pytest.raises(ValueError, match=names_it):
                call()


def test_gradients_through_views_match_the_contiguous_copy():
    """The views are built from the leaf by differentiable torch ops, so the gradient reaches it through them."""
    views = {"transposed": lambda v: v.t().contiguous().t(),
             "step-sliced": lambda v: torch.stack([v, torch.zeros_like(v)], -1).reshape(B, 2 * V)[:, ::2],
             "neg-view": lambda v: torch._neg_view(-v)}
    tokens = torch.tensor([0, 5, 7])
    want = None
    for name, make in {"contiguous": lambda v: v, **views}.items():
        leaf = X.clone().requires_grad_()
        bp.token_logprobs(make(leaf), tokens, 0.7, backend="cpu").sum().backward()
        want = leaf.grad if want is None else want
        assert torch.equal(canonical_bits(leaf.grad), canonical_bits(want)), name


def test_use_backend_belongs_to_the_thread_that_set_it():
    inside, done, seen = threading.Event(), threading.Event(), []

    def holder():
        with bp.use_backend("numpy"):
            inside.set()
            done.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    inside.wait(10)
    seen.append(bp.current_backend())
    done.set()
    thread.join(10)
    assert seen == [None] and bp.current_backend() is None
