"""`bitparity bench`: its rows, byte counts and spread, end to end through the CLI.

Times themselves are not asserted (speed is measured in benchmarks, never in timed tests);
what is asserted is the structure a reader relies on."""

import json
import time

import pytest
import torch

from bitparity.backends.ascend import npu_ops
from bitparity.cli import main
from bitparity.compare import bench, cases, timing


def _check_rows(rows, ops, backends, shapes):
    assert [(r["op"], r["backend"]) for r in rows] == [(op, b) for op in ops for b in ("native", *backends)]
    for r in rows:
        assert r["shape"] == list(shapes[r["op"]])
        assert r["min_ms"] <= r["q1_ms"] <= r["median_ms"] <= r["q3_ms"] <= r["max_ms"]
        assert r["clock"] == "perf_counter" and r["device"] == "cpu"
        assert r["copy_gb_per_s"] > 0
        assert r["gb_per_s"] == pytest.approx(r["bytes"] / (r["median_ms"] * 1e6))
        native = next(n for n in rows if n["op"] == r["op"] and n["backend"] == "native")
        assert r["ratio_to_native"] == pytest.approx(r["median_ms"] / native["median_ms"])


@pytest.mark.skipif(npu_ops.npu_present(), reason="an NPU is here: scripts/npu_check.py benchmarks ascend on it")
def test_bench_cli_rows_bytes_and_progress(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "--backend", "cpu", "--backend", "ascend", "--op", "exp", "--op", "gae",
                 "--repeats", "3", "--warmup", "0", "--format", "json", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    n, (b, t) = bench.SHAPES["quick"]["elementwise"][0][0], bench.SHAPES["quick"]["rl"][0]
    _check_rows(rows, ("exp", "gae"), ("cpu", "ascend"), {"exp": (n,), "gae": (b, t)})
    # bytes moved: exp reads and writes its input's floats (n plus the specials make_elementwise
    # puts first); GAE reads rewards, values (float32) and the mask (bool), and writes advantages
    # and returns (float32)
    n_exp = cases.make_elementwise("exp", n).numel()
    assert {r["op"]: r["bytes"] for r in rows} == {"exp": 8 * n_exp, "gae": 17 * b * t}
    assert {r["runs"] for r in rows} == {3}
    assert {r["where"] for r in rows} == {"torch", "CPU", "host emulation (CPU)"}
    progress = [line for line in capsys.readouterr().err.splitlines() if line.startswith("bench")]
    assert " 6/6 " in progress[-1] and "gae [64, 512] ascend" in progress[-1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: scripts/gpu_check.py benchmarks cuda on it")
def test_bench_api_explicit_shapes_on_the_interpreter():
    shapes = {"token_logprobs": [(3, 1500)], "masked_whiten": [(4, 100)]}
    rows = bench.run(["cuda"], ["token_logprobs", "masked_whiten"], shapes=shapes, repeats=3, warmup=1,
                     progress=False)
    _check_rows(rows, ("token_logprobs", "masked_whiten"), ("cuda",),
                {k: v[0] for k, v in shapes.items()})
    assert rows[1]["where"] == "Triton interpreter (CPU)"
    # token_logprobs reads logits and int64 tokens and writes one float per row
    assert rows[0]["bytes"] == 4 * 3 * 1500 + 8 * 3 + 4 * 3
    assert "| token_logprobs | 3x1500" in bench.render(rows, "markdown")
    assert "cpu copy bandwidth" in bench.render(rows, "table")


def test_measure_runs_warmup_then_repeats_and_stops_on_budget():
    calls = []
    t = timing.measure(lambda: calls.append(1), "cpu", warmup=2, repeats=5)
    assert len(calls) == 7 and t.runs == 5 and t.clock == "perf_counter"
    calls.clear()
    t = timing.measure(lambda: calls.append(1), "cpu", warmup=0, repeats=100, budget_s=0.0, min_runs=3)
    assert len(calls) == 3 and t.runs == 3


def test_measure_interleaved_alternates_the_calls_and_budgets_each_alone():
    calls = []
    timings = timing.measure_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                                         warmup=1, repeats=3)
    assert calls == ["a", "b"] * 4 and {t.runs for t in timings.values()} == {3}
    # A slow call stops once its own runs pass the budget; the fast one's runs do not count against it.
    timings = timing.measure_interleaved({"slow": lambda: time.sleep(0.02), "fast": lambda: None},
                                         warmup=0, repeats=50, budget_s=0.05, min_runs=1)
    assert 1 <= timings["slow"].runs < 50 == timings["fast"].runs


def test_busy_reads_the_median_spread():
    def spread(s):
        return timing.Timing(1.0, 1.0 - s / 2, 1.0 + s / 2, 0.5, 2.0, 9, "perf_counter")
    calm = [spread(0.02)] * 3 + [spread(0.5)] * 2          # two noisy timings do not make a busy machine
    assert timing.busy(calm) is None and timing.busy([]) is None
    warning = timing.busy([spread(0.02)] * 2 + [spread(0.3)] * 3)
    assert warning.startswith("the machine looks busy") and "is 30%" in warning and "3 of 5" in warning


def test_bench_rejects_bad_arguments(capsys):
    with pytest.raises(ValueError, match="backends must be among cpu, cuda, ascend; got 'numpy'"):
        bench.run(["numpy"], ["exp"])
    with pytest.raises(ValueError, match="ops must be among"):
        bench.run(["cpu"], ["argmax"])
    with pytest.raises(ValueError, match="tier must be one of quick, full"):
        bench.run(["cpu"], ["exp"], tier="huge")
    with pytest.raises(ValueError, match="repeats must be an integer >= 1; got 0"):
        bench.run(["cpu"], ["exp"], repeats=0)
    with pytest.raises(ValueError, match="warmup must be an integer >= 0; got -1"):
        bench.run(["cpu"], ["exp"], warmup=-1)
    with pytest.raises(SystemExit):
        main(["bench", "--op", "argmax"])
    assert "invalid choice" in capsys.readouterr().err


def test_make_call_builds_inputs_on_the_device_from_the_case_generators():
    args, kwargs = bench.make_call("token_logprobs", (2, 50), "cpu")
    x, tokens = args
    assert x.shape == (2, 50) and x.dtype == torch.float32 and tokens.dtype == torch.int64
    assert tokens[0] == torch.argmax(x[0])                    # cases.make_tokens: even rows take the argmax
    args, kwargs = bench.make_call("kl_penalty", (2, 8), "cpu")
    assert args[2] == "k3" and kwargs == {}


def test_where_labels_the_interpreter_even_on_a_gpu(monkeypatch):
    cuda = pytest.importorskip("bitparity.backends.cuda")
    monkeypatch.setattr(bench, "device_type", lambda backend: "cuda")
    monkeypatch.setattr(cuda, "_INTERPRETED", True)
    assert bench.where("cuda") == "Triton interpreter (CPU, GPU tensors)"
    monkeypatch.setattr(cuda, "_INTERPRETED", False)
    assert bench.where("cuda") == "GPU"


def test_make_call_builds_model_inputs_on_the_device():
    args, kwargs = bench.make_call("attention", (1, 2, 3, 5, 4), "cpu")
    assert [tuple(a.shape) for a in args] == [(1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4)]
    assert kwargs["causal"] is True and kwargs["kv_lengths"].shape == (1,)
    args, _ = bench.make_call("moe", (4, 8, 8, 6, 2), "cpu")
    assert [tuple(a.shape) for a in args[:5]] == [(4, 8), (8, 8), (8, 6, 8), (8, 6, 8), (8, 8, 6)] and args[5] == 2
    assert bench.default_shapes("linear", "full") == bench.SHAPES["full"]["linear"]


def test_bench_times_the_backward_against_torch_autograd():
    """A gradient op's row: the backward alone on a graph built once (the steps: their case), native being torch
    autograd through torch's op (torch.optim); bytes are the inputs and upstream read, the gradients written."""
    rows = bench.run(["cpu"], ["rms_norm.backward", "SGD.step"], shapes={"rms_norm.backward": [(8, 256)]},
                     repeats=3, warmup=1, progress=False)
    _check_rows(rows, ("rms_norm.backward", "SGD.step"), ("cpu",),
                {"rms_norm.backward": (8, 256), "SGD.step": (1000,)})
    # rms_norm: x [8, 256], weight [256] and the upstream [8, 256] read; dx and dweight written
    assert rows[0]["bytes"] == rows[1]["bytes"] == 4 * (3 * 8 * 256 + 2 * 256)
    assert rows[2]["bytes"] > 0 and {r["where"] for r in rows} == {"torch", "CPU"}
