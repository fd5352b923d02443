"""spec.py's constants: what they must be, and that docs/spec.md and every kernel source carry the same bits."""

import math
import re
from pathlib import Path

import numpy as np
import pytest

from bitparity import spec

ROOT = Path(__file__).resolve().parents[1]
BIT_CONSTANTS = {name: value for name, value in vars(spec).items()
                 if name.endswith(("_BITS", "_MAGIC")) and isinstance(value, (int, tuple))}


def _hexes(value):
    return value if isinstance(value, tuple) else (value,)


def test_structure_parameters():
    assert spec.LANES & (spec.LANES - 1) == 0
    assert spec.SEGMENT % spec.LANES == 0
    assert spec.f32(spec.NEG_ZERO_BITS) == 0.0 and math.copysign(1.0, spec.f32(spec.NEG_ZERO_BITS)) < 0


def test_exp_constants():
    assert spec.f32(spec.ROUND_MAGIC_BITS) == 1.5 * 2**23
    assert spec.bits_of(1 / math.log(2)) == spec.LOG2E_BITS
    hi = spec.f32(spec.LN2_HI_BITS)
    assert (spec.LN2_HI_BITS & 0x1FF) == 0            # 15 significant bits: k * hi is exact for |k| <= 256
    assert spec.bits_of(math.log(2) - hi) == spec.LN2_LO_BITS
    # EXP_HI is the largest float32 whose exp is finite; EXP_LO the largest whose exp rounds to 0.
    assert np.float32(math.exp(spec.f32(spec.EXP_HI_BITS))) < np.inf
    assert math.exp(spec.f32(spec.EXP_HI_BITS + 1)) > float(np.finfo(np.float32).max) + 2.0**103
    assert math.exp(spec.f32(spec.EXP_LO_BITS)) < 2.0**-150 < math.exp(spec.f32(spec.EXP_LO_BITS - 1))


def test_log_and_reciprocal_constants():
    assert spec.bits_of(math.sqrt(0.5)) == spec.LOG_SQRTHALF_BITS
    assert spec.f32(spec.LOG_LN2_HI_BITS) == 0.693359375
    assert spec.f32(spec.SPLIT_BITS) == 2**12 + 1
    assert spec.f32(spec.MIN_NORMAL_BITS) == 2.0**-126
    assert spec.f32(spec.LOG_SUBNORMAL_SCALE_BITS) == 2.0**23


def test_docs_spec_states_every_constant():
    text = (ROOT / "docs" / "spec.md").read_text().upper()
    missing = [f"{name}=0x{v:08X}" for name, value in BIT_CONSTANTS.items() for v in _hexes(value)
               if f"0X{v:08X}" not in text and not (v in (0x3F800000, 0x40000000))]
    assert not missing, f"docs/spec.md does not state: {missing}"
    assert f"SPEC_VERSION {spec.SPEC_VERSION}" in (ROOT / "docs" / "spec.md").read_text()


def _needed_bits():
    return {v for value in BIT_CONSTANTS.values() for v in _hexes(value)} - {
        spec.NEG_ZERO_BITS, spec.ONE_BITS, spec.TWO_BITS, spec.HALF_BITS, spec.MIN_NORMAL_BITS}


def test_ascend_sources_carry_the_spec_bits():
    """The NPU build compiles without Python, so the Ascend kernels carry the constants in a generated
    header; its copies must be the same bits as spec.py."""
    text = " ".join(p.read_text() for p in (ROOT / "bitparity/backends/ascend/kernels").glob("*.[ch]*")).upper()
    found = {int(h, 16) for h in re.findall(r"0X([0-9A-F]{8})", text)}
    missing = _needed_bits() - found
    assert not missing, f"ascend kernels lack: {[hex(v) for v in sorted(missing)]}"


def test_cpu_build_receives_every_spec_constant():
    """The cpu backend's C source holds no constants: every one arrives as a -D flag made from spec.py."""
    from bitparity.backends import cpu
    passed = {int(flag.split("=")[1].rstrip("uU"), 16) for flag in cpu._spec_defines() if "=0x" in flag}
    missing = _needed_bits() - passed
    assert not missing, f"cpu -D flags lack: {[hex(v) for v in sorted(missing)]}"
