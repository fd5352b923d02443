"""Constants of the canonical float32 evaluation order (docs/spec.md).

Every backend reads its constants from here (Python backends) or from a copy
generated into its kernel source and checked against this file by a test
(tests/test_spec.py).  Float constants are given as IEEE-754 binary32 bit
patterns: the bits are the definition, the decimal in the comment is a label.
"""

import struct

SPEC_VERSION = "2.1.0"

# -- Reduction structure (spec section 3) ------------------------------------
LANES = 1024          # L: lane j of a segment sums x[j], x[j+L], ... in sequence
SEGMENT = 16384       # S: elements per segment, a multiple of LANES
NEG_ZERO_BITS = 0x80000000   # -0.0, the exact additive identity used as padding

# -- linear (spec sections 24.1, 29.2) -------------------------------------------
LINEAR_BX = 39        # bits of a quantised x entry (sign included): RNE(x * 2^(BX-2-E)), |Q| <= 2^(BX-1)
LINEAR_BW = 29        # the same for a weight entry (x's outlier channels need more bits than weights: spec 24.1)
LINEAR_GRAD_BLOCK = 32   # T_b: dW and db are exact over blocks of this many rows, then row-folded across blocks

# -- exp (spec section 5) -----------------------------------------------------
EXP_HI_BITS = 0x42B17217     # 88.7228317: largest x with finite exp(x)
EXP_LO_BITS = 0xC2CFF1B5     # -103.972084: exp(x) rounds to 0 at and below
EXP_CLAMP_HI_BITS = 0x42B20000   # 89.0: clamp before range reduction
EXP_CLAMP_LO_BITS = 0xC2D00000   # -104.0
LOG2E_BITS = 0x3FB8AA3B      # 1.44269502 = round(1/ln 2)
ROUND_MAGIC_BITS = 0x4B400000    # 12582912.0 = 1.5 * 2**23
LN2_HI_BITS = 0x3F317200     # 0.693145752 (15 significant bits: k*hi is exact)
LN2_LO_BITS = 0x35BFBE8E     # 1.42860677e-06 = ln 2 - hi, rounded
# Cephes expf polynomial, highest degree first: P(r) = ((((c0 r + c1) r + c2) r + c3) r + c4) r + c5
EXP_POLY_BITS = (
    0x39506967,   # 1.9875691500e-4
    0x3AB743CE,   # 1.3981999507e-3
    0x3C088908,   # 8.3334519073e-3
    0x3D2AA9C1,   # 4.1665795894e-2
    0x3E2AAAAA,   # 1.6666665459e-1
    0x3F000000,   # 5.0000001201e-1 (rounds to exactly 0.5)
)

# -- log (spec section 6) -----------------------------------------------------
LOG_SQRTHALF_BITS = 0x3F3504F3   # 0.707106769 = sqrt(1/2): mantissa range [sqrt(1/2), sqrt(2))
LOG_SUBNORMAL_SCALE_BITS = 0x4B000000   # 8388608.0 = 2**23
MIN_NORMAL_BITS = 0x00800000     # 1.17549435e-38
# Cephes logf polynomial, highest degree first
LOG_POLY_BITS = (
    0x3D9021BB,   # 7.0376836292e-2
    0xBDEBD1B8,   # -1.1514610310e-1
    0x3DEF251A,   # 1.1676998740e-1
    0xBDFE5D4F,   # -1.2420140846e-1
    0x3E11E9BF,   # 1.4249322787e-1
    0xBE2AAE50,   # -1.6668057665e-1
    0x3E4CCEAC,   # 2.0000714765e-1
    0xBE7FFFFC,   # -2.4999993993e-1
    0x3EAAAAAA,   # 3.3333331174e-1
)
LOG_LN2_LO_BITS = 0xB95E8083     # -2.12194440e-4
LOG_LN2_HI_BITS = 0x3F318000     # 0.693359375
HALF_BITS = 0x3F000000           # 0.5

# -- reciprocal (spec section 7) ----------------------------------------------
RECIP_MAGIC = 0x7EF311C3         # initial guess: bits(r0) = RECIP_MAGIC - bits(s)
RECIP_NEWTON_STEPS = 4
SPLIT_BITS = 0x45800800          # 4097.0 = 2**12 + 1, Veltkamp splitter
TWO_BITS = 0x40000000            # 2.0
ONE_BITS = 0x3F800000            # 1.0


# -- AdamW's square (spec 29.12) ---------------------------------------------------
TWO_M64_BITS = 0x1F800000        # 2**-64: g * g overflows from |g| = 2**64; there h = g * 2**-64 is squared ...
TWO_P64_BITS = 0x5F800000        # 2**64: ... and c2 * (h * h) scaled back by 2**64 twice (exact powers of two)

# -- RL operators (spec sections 14-17) -----------------------------------------
RSQRT_MAGIC = 0x5F3759DF         # initial guess: bits(r0) = RSQRT_MAGIC - (bits(y) >> 1)
RSQRT_NEWTON_STEPS = 4
THREE_HALVES_BITS = 0x3FC00000   # 1.5
K3_SERIES_LIMIT_BITS = 0x3F800000   # |d| < 1: k3 = d*d * phi(d) by its series; else (exp(d) - 1) - d
# phi(d) = (e^d - 1 - d) / d^2 = sum_k d^k / (k + 2)!, Horner from the highest degree: RN32(1/(k+2)!) for k = 10 .. 0
K3_SERIES_BITS = (
    0x310F76C7,   # 1/12!
    0x32D7322B,   # 1/11!
    0x3493F27E,   # 1/10!
    0x3638EF1D,   # 1/9!
    0x37D00D01,   # 1/8!
    0x39500D01,   # 1/7!
    0x3AB60B61,   # 1/6!
    0x3C088889,   # 1/5!
    0x3D2AAAAB,   # 1/4!
    0x3E2AAAAB,   # 1/3!
    0x3F000000,   # 1/2!
)

# -- Sampling (spec 19-22) -------------------------------------------------------
# Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11;
# the constants of Random123 and of Triton's tl.philox).
PHILOX_ROUNDS = 10
PHILOX_M0 = 0xD2511F53           # multiplier of counter word 0
PHILOX_M1 = 0xCD9E8D57           # multiplier of counter word 2
PHILOX_W0 = 0x9E3779B9           # key word 0 increment (golden ratio)
PHILOX_W1 = 0xBB67AE85           # key word 1 increment (sqrt(3) - 1)
SAMPLE_STREAM = 0                # counter word 3 of the sampling noise: other streams use other values
# Uniform and exponential variates of the race (spec 20)
UNIFORM_COARSE_MIN = 1 << 16     # a >= 2**16 (V >= 2**-8): V = a * 2**-24 exactly; below, 23 more bits
TWO_M24_BITS = 0x33800000        # 2**-24
TWO_M48_BITS = 0x27800000        # 2**-48
THIRD_BITS = 0x3EAAAAAB          # RN32(1/3): -log(1 - V) = V + V**2/2 + V**3/3 + ... for V < 2**-8


def f32(bits: int) -> float:
    """The binary32 value with the given bit pattern, as a Python float (exact)."""
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def bits_of(value: float) -> int:
    """Bit pattern of value rounded to binary32."""
    return struct.unpack("<I", struct.pack("<f", value))[0]
