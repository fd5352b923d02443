"""Pieces every demo topic uses: float32 bit patterns, ulp distances, the backends that run here."""

from fractions import Fraction

import numpy as np

from ..backends import backends as backend_rows

CANONICAL_BACKENDS = ("numpy", "cpu", "cuda", "ascend")


def hex32(v):
    """The binary32 bit pattern of v, as 0x........"""
    return f"0x{int(np.float32(v).view(np.uint32)):08x}"


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
