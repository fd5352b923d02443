"""compare/linear_bench.py (issue 24's linear benchmark of scripts/gpu_check.py): its record and table, exercised on
the `cpu` backend at the small shape. These runs time the CPU; no number here is a GPU's."""

import pytest
import torch

from bitparity.compare import linear_bench


def test_hardware_shapes_are_the_issues():
    # 4096³, the [128, 1024] x [32768, 1024] lm_head and Qwen3-0.6B's (hidden 1024, vocab 151936), as (M, K, N).
    assert linear_bench.SHAPES["hardware"] == ((4096, 4096, 4096), (128, 1024, 32768), (128, 1024, 151936))


def test_record_and_table_on_the_cpu():
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    rows = linear_bench.run("cpu", small=True, repeats=2)
    assert matmul.fp32_precision == before                   # the TF32 switch is restored
    (m, k, n), = linear_bench.SHAPES["small"]
    assert [(r["pass"], r["impl"]) for r in rows] == [(p, i) for p in ("forward", "forward+backward")
                                                      for i in ("bitparity", "torch bf16", "torch float32")]
    for r in rows:
        assert r["shape"] == [m, k, n] and r["device"] == "cpu" and r["clock"] == "perf_counter" and r["runs"] == 2
        assert r["where"] == ("CPU" if r["impl"] == "bitparity" else "torch")
        # y is one M·N·K product; forward + backward adds dx and dW.
        assert r["flop"] == 2 * m * n * k * (1 if r["pass"] == "forward" else 3)
        assert r["tflops"] == pytest.approx(r["flop"] / (r["median_ms"] * 1e9))
    table = linear_bench.render(rows, "github").splitlines()
    assert len(table) == 4 and table[2].startswith(f"| [{m}, {k}] × [{n}, {k}] | forward ")
    fwd = {r["impl"]: r["median_ms"] for r in rows if r["pass"] == "forward"}
    assert f"{fwd['bitparity'] / fwd['torch bf16']:.2f}×" in table[2]
    assert f"{fwd['bitparity'] / fwd['torch float32']:.2f}×" in table[2]


def test_a_shape_out_of_memory_is_recorded_and_the_others_run(monkeypatch):
    measured = linear_bench._rows

    def rows(backend, shape, device, repeats, seed):
        if shape[2] == 151936:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.27 GiB\nmore detail")
        return measured(backend, shape, device, repeats, seed)
    monkeypatch.setitem(linear_bench.SHAPES, "small", ((4, 32, 16), (4, 32, 151936), (2, 32, 8)))
    monkeypatch.setattr(linear_bench, "_rows", rows)
    found = linear_bench.run("cpu", small=True, repeats=1)
    assert [r["shape"] for r in found if "error" in r] == [[4, 32, 151936]]
    assert found[6]["error"] == "out of memory: CUDA out of memory. Tried to allocate 9.27 GiB"
    assert sum(r["shape"] == [2, 32, 8] for r in found) == 6        # the shape after it still ran
    lines = linear_bench.render(found, "github").splitlines()
    assert [i for i, line in enumerate(lines) if "| not run " in line and "| out of memory: CUDA" in line] == [4]
