"""`bitparity demo`, run through the CLI: each topic's key number is real, and --plots draws a figure.

Each topic runs once, with --plots and --json; the tests read the numbers
back from the JSON and check the PNG (size, and more than a few colours, so
it is not blank).
"""

import json
from fractions import Fraction

import numpy as np
import pytest

from bitparity.cli import main
from bitparity.compare.probe import round_to_float32

CANONICAL = {"numpy", "cpu", "cuda", "ascend"}   # all four run on the test machine (conftest.py)


def _demo(topic, tmp_path):
    numbers = tmp_path / "demo.json"
    assert main(["demo", topic, "--plots", str(tmp_path), "--json", str(numbers)]) == 0
    _check_png(tmp_path / f"{topic}.png")
    return json.loads(numbers.read_text())[topic]


def _check_png(path):
    """A figure of a readable size in which the data are drawn: at least two of the palette's colours
    (bitparity blue, native red, other orange) cover 100 pixels or more each."""
    from matplotlib import colors, image

    from bitparity.demo import plots

    pixels = image.imread(path)[..., :3]
    assert pixels.shape[0] >= 300 and pixels.shape[1] >= 500, pixels.shape
    drawn = [name for name in (plots.CANONICAL, plots.NATIVE, plots.OTHER)
             if (np.abs(pixels - colors.to_rgb(name)).max(axis=-1) < 0.02).sum() >= 100]
    assert len(drawn) >= 2, f"{path}: only {drawn} drawn"


def test_order_many_results_across_orders_one_across_canonical_runs(tmp_path):
    r = _demo("order", tmp_path)
    assert r["distinct_across_orders"] > 1
    assert r["spread_ulps"] >= 1
    assert set(r["canonical_backends"]) == CANONICAL
    assert r["canonical_runs"] == 3 * len(CANONICAL)
    assert r["distinct_across_canonical_runs"] == 1
    # The demo's parameterised tree, at the spec's (LANES, SEGMENT), is the spec's sum.
    assert r["spec_variant_bits"] == r["canonical_bits"][0]


def test_batch_bitparity_rows_do_not_depend_on_batch_size(tmp_path):
    r = _demo("batch", tmp_path)
    assert r["bitparity_dot"]["distinct_row0"] == 1
    assert r["bitparity_log_softmax"]["distinct_row0"] == 1
    assert not any(r["bitparity_dot"]["share_differing"] + r["bitparity_log_softmax"]["share_differing"])
    assert r["split_reduction"]["distinct_row0"] > 1


def test_fma_one_rounding_differs_from_two(tmp_path):
    r = _demo("fma", tmp_path)
    # (1 + 2^-12)^2 - (1 + 2^-11) = 2^-24 exactly (0x33800000); RN(a*b) loses the 2^-24 (a tie to even).
    first = r["crafted"][0]
    assert (first["fused_bits"], first["unfused_bits"]) == ("0x33800000", "0x00000000")
    assert r["cancelling_differ_share"] == 1.0
    assert 0 < r["random_differ_share"] < 1
    assert any(line.startswith("fma.rn.f32") for line in r["ptx_fusion_on"])
    assert not any("fma" in line for line in r["ptx_fusion_off"])
    assert {line.split()[0] for line in r["ptx_fusion_off"]} == {"mul.rn.f32", "add.rn.f32"}


@pytest.mark.parametrize("q, bits", [
    (Fraction(1) + Fraction(1, 2 ** 24), 0x3F800000),            # tie: to even, 1.0
    (Fraction(1) + Fraction(3, 2 ** 25), 0x3F800001),            # above the tie: 1 + 2^-23
    (-(Fraction(1) + Fraction(3, 2 ** 24)), 0xBF800002),         # tie between 1+2^-23 and 1+2^-22: even
    (Fraction(1, 2 ** 149), 0x00000001),                         # smallest subnormal
    (Fraction(1, 2 ** 150), 0x00000000),                         # half of it: tie to even, 0
    (Fraction(3, 2 ** 151), 0x00000001),                         # 0.75 of it: rounds up
    (Fraction(2) ** 128, 0x7F800000),                            # beyond the largest float32: inf
])
def test_round_to_float32_rounds_exact_rationals_once(q, bits):
    assert int(round_to_float32(q).view(np.uint32)) == bits


def test_exp_bitparity_below_one_ulp_and_the_same_bits_everywhere(tmp_path):
    r = _demo("exp", tmp_path)
    for name in ("exp", "log"):
        assert r[name]["max_ulp"]["bitparity"] < 1.0
        assert set(r[name]["backend_mismatches"]) == CANONICAL
        assert not any(r[name]["backend_mismatches"].values())
        assert r[name]["numpy_torch_differ_share"] > 0      # two libraries, one CPU, different bits


def test_rl_only_the_canonical_order_keeps_ratios_at_one(tmp_path):
    r = _demo("rl", tmp_path)
    assert r["bitparity"]["tokens_differing"] == 0
    assert r["bitparity"]["max_abs_ratio_minus_1"] == 0 and r["bitparity"]["loss_bias"] == 0
    assert r["native_log_softmax"]["tokens_differing"] > 0
    assert r["bf16_lm_head"]["max_abs_logdiff"] > r["native_log_softmax"]["max_abs_logdiff"] > 0


def test_guide_diagrams_are_drawn(tmp_path):
    from matplotlib import image

    from bitparity.demo import diagrams

    for draw in (diagrams.reduction_tree, diagrams.one_order_three_machines):
        pixels = image.imread(draw(tmp_path))[..., :3]
        assert pixels.shape[0] >= 400 and pixels.shape[1] >= 1000, pixels.shape
        # Boxes fill the figure: far more than a title's worth of non-white pixels.
        assert (pixels.min(axis=-1) < 0.95).mean() > 0.1
