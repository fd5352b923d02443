"""The conformance suite: named, deterministic, tiered, built lazily, and open to new ops."""

import numpy as np
import pytest
import torch

from bitparity import ops
from bitparity.compare import cases, golden
from bitparity.compare.run import OPS


def test_every_op_is_in_the_suite_with_unique_names():
    quick, full = cases.suite("quick"), cases.suite("full")
    assert set(cases.registered_ops()) == set(OPS) == {c.op for c in quick}
    assert len({c.name for c in full}) == len(full)
    assert [c.name for c in quick] == [c.name for c in full if c.tier == "quick"]      # quick is a subset, in order
    assert all(c.name.startswith(c.op + "/") for c in full)


def test_full_tier_has_rl_workload_shapes():
    shapes = {tuple(c.shapes["x"]) for c in cases.suite("full", ["log_softmax"])}
    assert {(256, 32000), (64, 128256), (256, 151936)} <= shapes
    rl = {tuple(c.shapes["logp"]) for c in cases.suite("full", ["ppo_policy_loss"])}
    assert (256, 8192) in rl and max(t for _, t in rl) == 8192


def test_cases_rebuild_to_the_same_inputs_and_shapes():
    for case in cases.suite("quick", ["token_logprobs", "gae", "exp"]):
        (args1, kw1), (args2, kw2) = case.inputs(), case.inputs()
        assert kw1 == kw2
        tensors = [a for a in args1 if isinstance(a, torch.Tensor)]
        assert [list(t.shape) for t in tensors] == list(case.shapes.values())
        for a, b in zip(args1, args2):
            assert (golden.digest(a) == golden.digest(b)) if isinstance(a, torch.Tensor) else a == b


def test_seed_changes_the_inputs_not_the_names():
    a, b = cases.suite("quick", ["sum"], seed=0), cases.suite("quick", ["sum"], seed=1)
    assert [c.name for c in a] == [c.name for c in b]
    assert golden.digest(a[0].inputs()[0][0]) != golden.digest(b[0].inputs()[0][0])


def test_adversarial_kinds_hold_what_they_claim():
    bits = lambda x: x.view(torch.int32)  # noqa: E731
    sub = cases.make_adversarial("subnormal", 4, 1000)
    mag = sub.abs()
    assert ((mag > 0) & (mag < torch.finfo(torch.float32).tiny)).float().mean() > 0.5
    assert cases.make_adversarial("huge", 2, 100).abs().min() > 0.85e38
    tied = cases.make_adversarial("tied_max", 3, 100)
    assert [(row == row.max()).sum().item() for row in tied] == [2, 3, 4]
    zeros = cases.make_adversarial("signed_zero", 3, 50)
    assert (zeros == 0).all() and (bits(zeros[0]) == 0).all() and (bits(zeros[1]) != 0).all()
    assert 0 < (bits(zeros[2]) != 0).sum() < 50
    ninf = cases.make_adversarial("neg_inf", 4, 10)
    assert torch.isneginf(ninf[0]).all() and torch.isfinite(ninf[1]).sum() == 1
    assert torch.isposinf(ninf[2]).sum() == 1 and torch.isfinite(ninf[3]).sum() == 5
    rl = cases.make_rl_adversarial(4, 64)
    assert not rl["mask"][1].any() and (rl["logp"] - rl["old_logp"]).abs().max() > 20


def test_elementwise_subnormal_cases():
    x = cases.make_subnormal_elementwise("log", 1000)
    assert ((x > 0) & (x < torch.finfo(torch.float32).tiny)).all()
    y = np.exp(cases.make_subnormal_elementwise("exp", 1000).double().numpy())
    assert (y < np.finfo(np.float32).tiny).mean() > 0.5


def test_a_new_op_registers_with_a_few_lines(monkeypatch):
    monkeypatch.setitem(cases._REGISTRY, "twice", None)        # removed again after the test
    make = lambda: ((torch.arange(4.0),), {})  # noqa: E731

    def twice_cases(seed):
        yield cases.Case("twice/ramp/4", "twice", "quick", {"x": [4]}, make)
        yield cases.Case("twice/ramp/4-full", "twice", "full", {"x": [4]}, make)

    cases.register("twice", twice_cases, lambda tier, seed: next(twice_cases(seed)))
    assert [c.name for c in cases.suite("quick", ["twice"])] == ["twice/ramp/4"]
    assert len(cases.suite("full", ["twice"])) == 2
    assert cases.timing_case("twice").name == "twice/ramp/4"


def test_suite_rejects_unknown_tier_and_op():
    with pytest.raises(ValueError, match="tier must be one of quick, full"):
        cases.suite("medium")
    with pytest.raises(ValueError, match="ops must be among"):
        cases.suite("quick", ["softplus"])


class _Recorder:
    """Stands in for bitparity.ops: every op records the devices of the tensors it is given."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, op):
        def call(*args, backend, **kwargs):
            devices = {str(v.device) for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)}
            self.calls.append((op, devices, sorted(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))))
        return call


def test_case_run_moves_positional_and_keyword_tensors_to_the_backends_device(monkeypatch):
    # The per-row sampling cases pass temperature, top_k, top_p as tensors by keyword; on a GPU or
    # NPU ops.py refuses them unless they sit on the logits' device.
    recorder = _Recorder()
    monkeypatch.setattr(cases, "ops", recorder)
    monkeypatch.setattr(cases, "backend_device", lambda backend: "meta")
    for case in cases.suite("quick", ["filter_logits", "sample", "token_logprobs", "gae"]):
        case.run("cuda")
    assert {op for op, _, _ in recorder.calls} == {"filter_logits", "sample", "token_logprobs", "gae"}
    assert all(devices == {"meta"} for _, devices, _ in recorder.calls)
    assert any(keywords for _, _, keywords in recorder.calls)       # some tensors did come by keyword


def test_native_runs_on_the_accelerator_when_there_is_one(monkeypatch):
    monkeypatch.setattr(cases, "device_type", {"cuda": "cpu", "ascend": "npu", "cpu": "cpu"}.get)
    assert cases.backend_device("native") == "npu" and cases.backend_device("cpu") == "cpu"
    monkeypatch.setattr(cases, "device_type", {"cuda": "cuda", "ascend": "cpu", "cpu": "cpu"}.get)
    assert cases.backend_device("native") == "cuda"
    monkeypatch.setattr(cases, "device_type", lambda name: "cpu")
    assert cases.backend_device("native") == "cpu"


def test_model_cases_rebuild_to_their_shapes_keyword_tensors_included():
    for case in cases.suite("quick", list(cases.MODEL_OPS)):
        (args1, kw1), (args2, kw2) = case.inputs(), case.inputs()
        tensors = [a for a in (*args1, *kw1.values()) if isinstance(a, torch.Tensor)]
        assert [list(t.shape) for t in tensors] == list(case.shapes.values()), case.name
        assert [golden.digest(t) for t in tensors] == [
            golden.digest(t) for t in (*args2, *kw2.values()) if isinstance(t, torch.Tensor)]


def _inputs(name):
    return next(c for c in cases.suite("full") if c.name == name).inputs()


def test_model_cases_hold_what_they_claim():
    # decode: the cache slots past each row's length hold NaN keys and inf values, which spec 24.4 ignores
    (q, k, v), kw = _inputs("attention/decode/3x2x1x40x16")
    lengths = kw["kv_lengths"]
    assert kw["causal"] and lengths[0] == 40 and bool((lengths < 40).any())
    for b, n in enumerate(lengths.tolist()):
        assert k[b, :, n:].isnan().all() and v[b, :, n:].isinf().all() and k[b, :, :n].isfinite().all()
    assert _inputs("attention/noncausal/2x2x5x11x8")[1]["causal"] is False
    # moe tied: some token's k-th and (k+1)-th router logits are equal, so the tie rule decides which expert
    # counts; token 0 is zero (every logit ties)
    (x, router, *_, top_k), _ = _inputs("moe/tied/5x16x8x12x2")
    ranked, _ = ops.topk(ops.linear(x, router, backend="numpy"), top_k + 1, backend="numpy")
    assert bool((ranked[1:, top_k - 1] == ranked[1:, top_k]).any()) and not x[0].any()     # beyond token 0
    # linear K crosses the 1024-lane chunk and a segment; signed_zero has an all -0.0 row against a
    # non-negative weight row: every product is -0.0, and the exact zero is +0.0 (spec 24.1, 2.0.0; 1.x: -0.0)
    full_k = {c.shapes["x"][1] for c in cases.suite("full", ["linear"])}
    assert max(c.shapes["x"][1] for c in cases.suite("quick", ["linear"])) > 1024 and 16385 in full_k
    case = next(c for c in cases.suite("quick", ["linear"]) if c.name == "linear/signed_zero/4x64x9")
    (x, w, _), _ = case.inputs()
    negative_zero = torch.tensor(-0.0).view(torch.int32)
    assert (x[1].view(torch.int32) == negative_zero).all() and (w[0] >= 0).all()
    assert case.run("numpy")[1, 0].view(torch.int32) == 0
    # rotary tables: on the unit circle to float32 rounding, position 0 the identity
    (_, cos, sin), _ = _inputs("rotary/random/5x4x16")
    assert (cos[0] == 1).all() and (sin[0] == 0).all()
    assert ((cos.double() ** 2 + sin.double() ** 2 - 1).abs() < 1e-6).all()
