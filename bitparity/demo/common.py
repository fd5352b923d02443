"""Pieces every demo topic uses: float32 bit patterns, ulp distances, the backends that run here."""

import math
from fractions import Fraction

import numpy as np

from ..backends import backends as backend_rows

CANONICAL_BACKENDS = ("numpy", "cpu", "cuda", "ascend")


def hex32(v):
    """The binary32 bit pattern of v, as 0x........"""
    return f"0x{int(np.float32(v).view(np.uint32)):08x}"


def round_to_float32(q):
    """The binary32 nearest to the rational q, ties to even (subnormals kept, overflow to inf)."""
    if q == 0:
        return np.float32(0.0)
    magnitude = abs(q)
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    if Fraction(2) ** exponent > magnitude:
        exponent -= 1                                  # now 2**exponent <= |q| < 2**(exponent + 1)
    quantum = max(exponent, -126) - 23                 # spacing of binary32 at |q|; fixed below 2**-126
    significand = round(magnitude / Fraction(2) ** quantum)   # Fraction rounds half to even
    value = math.ldexp(significand, quantum)
    with np.errstate(over="ignore"):
        return np.float32(math.copysign(value, q))


def exact_sum(x):
    """The exact sum of float32 values, as a Fraction: every float32 is an integer multiple of 2**-149."""
    scaled = x.astype(np.float64) * 2.0 ** 149          # exact: a power-of-two scaling within float64's range
    return Fraction(sum(int(v) for v in scaled), 2 ** 149)


def ulps_from(values, reference):
    """Signed distance of each float32 value from a float32 reference, in ulps of the reference."""
    values = np.asarray(values, dtype=np.float64)
    return (values - np.float64(reference)) / np.float64(np.spacing(np.abs(np.float32(reference))))


def available_canonical_backends():
    """[(name, how it runs here)] of the canonical backends that can run on this machine."""
    return [(row["name"], row["reason"]) for row in backend_rows()
            if row["name"] in CANONICAL_BACKENDS and row["available"]]


def heading(title, explanation):
    print(f"== {title} ==\n")
    print(explanation.strip() + "\n")
