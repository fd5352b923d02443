// The canonical float32 building blocks (docs/spec.md) on Ascend C LocalTensors.
//
// Written once and used by every kernel: the portable exp and log, the
// reciprocal (of a vector or of one scalar) and rsqrt, the optimizer's sqrt and
// general reciprocal, the k3 series and its derivative, the NaN-propagating max,
// min and clamp,
// the halving trees, and the cross-pipe syncs around the scalar unit.  They use
// only these vector instructions: Add/Sub/Mul/Adds/Muls/Max/Min/Maxs/Mins,
// Compare/Compares, Select, Duplicate, int32 Add/Sub/Adds, uint32 ShiftLeft,
// int32 ShiftRight, int32 -> float Cast, and ReinterpretCast.  Every float32 instruction is one IEEE binary32
// operation rounded to nearest even; none is fused.  No vendor transcendental,
// division or reduction instruction appears: their rounding and their
// reduction trees are the vendor's, not the spec's.
//
// Vector operand rules followed throughout (A2): every operand starts on a
// 32-byte boundary; Compare/Compares counts are whole 256-byte repeats (64
// floats), so every routine here takes counts that are multiples of 64; a
// source is either the destination itself or disjoint from it.
//
// The scalar unit finishes the halving trees below 8 lanes (a vector operand
// cannot start 4, 2 or 1 floats into a 32-byte block).  Assumed of it, and to
// be checked on hardware (docs/ascend.md): float add, compare and select are
// IEEE binary32 with round-to-nearest-even and subnormals kept, and bisheng
// emits no contraction (-ffp-contract=off).

#ifndef BITPARITY_CANONICAL_H
#define BITPARITY_CANONICAL_H

#include "kernel_operator.h"
#include "spec_constants.h"

namespace bitparity {

using AscendC::LocalTensor;

constexpr uint32_t FLOATS_PER_REPEAT = 64;   // one 256-byte vector repeat
constexpr uint32_t FLOATS_PER_BLOCK = 8;     // one 32-byte UB block

__aicore__ inline float FloatFromBits(uint32_t bits)
{
    union {
        uint32_t u;
        float f;
    } v;
    v.u = bits;
    return v.f;
}

__aicore__ inline float NegZero() { return FloatFromBits(NEG_ZERO_BITS); }
__aicore__ inline float PosInf() { return FloatFromBits(0x7F800000u); }
__aicore__ inline float NegInf() { return FloatFromBits(0xFF800000u); }
__aicore__ inline float QuietNaN() { return FloatFromBits(0x7FC00000u); }

// ---- Syncs between the vector pipe, the scalar unit and MTE3 --------------------

// One producer->consumer barrier: the consumer pipe waits until the producer's queued work is done.
template <AscendC::HardEvent EVENT>
__aicore__ inline void PipeSync()
{
    AscendC::TEventID id = AscendC::GetTPipePtr()->FetchEventID(EVENT);
    AscendC::SetFlag<EVENT>(id);
    AscendC::WaitFlag<EVENT>(id);
}

__aicore__ inline void VectorToScalarSync() { PipeSync<AscendC::HardEvent::V_S>(); }
__aicore__ inline void ScalarToVectorSync() { PipeSync<AscendC::HardEvent::S_V>(); }
__aicore__ inline void ScalarToMte3Sync() { PipeSync<AscendC::HardEvent::S_MTE3>(); }
__aicore__ inline void Mte3ToScalarSync() { PipeSync<AscendC::HardEvent::MTE3_S>(); }

// ---- Scalar pieces --------------------------------------------------------------

// NaN-propagating max (spec 4).  Which zero it returns for max(+0, -0) does not
// matter: every maximum is canonicalised by adding +0.0.
__aicore__ inline float ScalarNanMax(float a, float b)
{
    if (a != a) {
        return a;
    }
    if (b != b) {
        return b;
    }
    return a > b ? a : b;
}

// Knuth's TwoSum: s = RN(a + b) and its exact rounding error, in this order.
__aicore__ inline void TwoSum(float a, float b, float& s, float& err)
{
    s = a + b;
    float bb = s - a;
    float ra = a - (s - bb);
    float rb = b - bb;
    err = ra + rb;
}

// ---- Vector pieces --------------------------------------------------------------

// dst = NaN-propagating max(a, b) over n floats (n a multiple of 64).  Max
// alone is not trusted with NaN (undocumented on A2): a NaN in b, then a NaN
// in a, is selected explicitly.  dst may be a.  tmp: n floats; bits: n/8 bytes.
__aicore__ inline void NanMax(const LocalTensor<float>& dst, const LocalTensor<float>& a, const LocalTensor<float>& b,
                              const LocalTensor<float>& tmp, const LocalTensor<uint8_t>& bits, uint32_t n)
{
    AscendC::Max(tmp, a, b, n);
    AscendC::Compare(bits, b, b, AscendC::CMPMODE::NE, n);
    AscendC::Select(tmp, bits, b, tmp, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
    AscendC::Compare(bits, a, a, AscendC::CMPMODE::NE, n);
    AscendC::Select(dst, bits, a, tmp, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
}

// dst = NaN-propagating min(a, b), as NanMax.  tmp: n floats; bits: n/8 bytes.
__aicore__ inline void NanMin(const LocalTensor<float>& dst, const LocalTensor<float>& a, const LocalTensor<float>& b,
                              const LocalTensor<float>& tmp, const LocalTensor<uint8_t>& bits, uint32_t n)
{
    AscendC::Min(tmp, a, b, n);
    AscendC::Compare(bits, b, b, AscendC::CMPMODE::NE, n);
    AscendC::Select(tmp, bits, b, tmp, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
    AscendC::Compare(bits, a, a, AscendC::CMPMODE::NE, n);
    AscendC::Select(dst, bits, a, tmp, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
}

// dst = min(max(v, low), high) with NaN propagated (spec 16, 17: the clamps), over n
// floats, for bounds low < high that are not NaN.  Maxs/Mins are not trusted with
// NaN, so a NaN v is selected back at the end.  The bounds are never zero in the
// ops (every clamp is positive), so which zero Maxs/Mins return on a tie does not
// arise; a bound of +-inf clamps nothing, which is how an unset clamp is passed.
// dst may be v or tmp; tmp must not be v.  tmp: n floats; bits: n/8 bytes.
__aicore__ inline void NanClamp(const LocalTensor<float>& dst, const LocalTensor<float>& v, float low, float high,
                                const LocalTensor<float>& tmp, const LocalTensor<uint8_t>& bits, uint32_t n)
{
    AscendC::Maxs(tmp, v, low, n);
    AscendC::Mins(tmp, tmp, high, n);
    AscendC::Compare(bits, v, v, AscendC::CMPMODE::NE, n);
    AscendC::Select(dst, bits, v, tmp, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
}

// dst = src, bits unchanged: src + (-0.0) is src for every binary32 (spec 3.1).  dst may be src.
__aicore__ inline void CopyFloats(const LocalTensor<float>& dst, const LocalTensor<float>& src, uint32_t n)
{
    AscendC::Adds(dst, src, NegZero(), n);
}

// The halving tree (spec 3): acc[i] += acc[i + h] for h = width/2, width/4, ..., 1,
// and acc[0] is the result.  width is a power of two (1 .. 1024).  Levels with
// h >= 8 are vector Adds on 32-byte-aligned halves; the last three (h = 4, 2, 1)
// run on the scalar unit in the same order.  Destroys acc.  Leaves the scalar
// unit owning acc: the caller syncs (ScalarToVectorSync) before vector reuse.
__aicore__ inline float TreeSum(const LocalTensor<float>& acc, uint32_t width)
{
    uint32_t h = width / 2;
    for (; h >= FLOATS_PER_BLOCK; h /= 2) {
        AscendC::Add(acc, acc, acc[h], h);
    }
    VectorToScalarSync();
    float lane[FLOATS_PER_BLOCK] = {};   // every lane read below is written first; zeroed for -Wmaybe-uninitialized
    uint32_t live = width < FLOATS_PER_BLOCK ? width : FLOATS_PER_BLOCK;
    for (uint32_t i = 0; i < live; ++i) {
        lane[i] = acc.GetValue(i);
    }
    for (h = live / 2; h >= 1; h /= 2) {
        for (uint32_t i = 0; i < h; ++i) {
            lane[i] = lane[i] + lane[i + h];
        }
    }
    return lane[0];
}

// The halving tree (spec 3) over many sums at once: lane j of each sum is row j of
// acc, a [width][rowLen] tile (row j at acc[j * rowLen]), so lane j of sum i is
// acc[j * rowLen + i].  Level h is one Add of rows [0, h) with rows [h, 2h):
// acc[i] += acc[i + h] for every sum, in the spec's order; row 0 is the result.
// width a power of two; rowLen a multiple of 8 (rows start 32-byte aligned).
// All on the vector unit, since each level is whole rows.  Destroys acc.
__aicore__ inline void TreeSumRows(const LocalTensor<float>& acc, uint32_t width, uint32_t rowLen)
{
    for (uint32_t h = width / 2; h >= 1; h /= 2) {
        AscendC::Add(acc, acc, acc[h * rowLen], h * rowLen);
    }
}

// The NaN-propagating maximum of acc[0 .. width) plus +0.0 (spec 4: a zero
// maximum is +0.0).  The maximum is order-free, so the tree's shape is
// free: vector NanMax halving down to 64 lanes (the smallest Compare), then
// the scalar unit.  width is a power of two >= 64.  Destroys acc; caller syncs
// (ScalarToVectorSync) before vector reuse.  tmp: width/2 floats; bits: width/16 bytes.
__aicore__ inline float TreeMax(const LocalTensor<float>& acc, uint32_t width, const LocalTensor<float>& tmp,
                                const LocalTensor<uint8_t>& bits)
{
    for (uint32_t h = width / 2; h >= FLOATS_PER_REPEAT; h /= 2) {
        NanMax(acc, acc, acc[h], tmp, bits, h);
    }
    VectorToScalarSync();
    float m = acc.GetValue(0);
    for (uint32_t i = 1; i < FLOATS_PER_REPEAT; ++i) {
        m = ScalarNanMax(m, acc.GetValue(i));
    }
    return m + 0.0f;
}

// y = exp(x) over n floats (spec 5), n a multiple of 64.  y must not be x or
// inside work.  work: 4n floats; bits: n/8 bytes.
__aicore__ inline void CanonicalExp(const LocalTensor<float>& y, const LocalTensor<float>& x,
                                    const LocalTensor<float>& work, const LocalTensor<uint8_t>& bits, uint32_t n)
{
    LocalTensor<float> r = work;            // clamped x, then the reduced argument r
    LocalTensor<float> t = work[n];         // x/ln2 + 1.5*2^23, whose low bits are k; then 2^k2
    LocalTensor<float> kf = work[2 * n];    // k as a float; then 2^k1
    LocalTensor<float> tmp = work[3 * n];
    LocalTensor<int32_t> k = t.ReinterpretCast<int32_t>();
    LocalTensor<int32_t> k1 = kf.ReinterpretCast<int32_t>();

    // xc = min(max(x, -104), 89)
    AscendC::Maxs(r, x, FloatFromBits(EXP_CLAMP_LO_BITS), n);
    AscendC::Mins(r, r, FloatFromBits(EXP_CLAMP_HI_BITS), n);
    // t = xc * (1/ln2) + 1.5*2^23 rounds x/ln2 to the integer k in t's low mantissa bits;
    // kf = t - 1.5*2^23 is k exactly; k = bits(t) - bits(1.5*2^23) needs no float->int conversion.
    AscendC::Muls(t, r, FloatFromBits(LOG2E_BITS), n);
    AscendC::Adds(t, t, FloatFromBits(ROUND_MAGIC_BITS), n);
    AscendC::Adds(kf, t, -FloatFromBits(ROUND_MAGIC_BITS), n);   // t + (-m) == t - m in IEEE
    AscendC::Adds(k, k, -static_cast<int32_t>(ROUND_MAGIC_BITS), n);
    // r = (xc - kf*ln2_hi) - kf*ln2_lo (Cody-Waite: kf*ln2_hi is exact)
    AscendC::Muls(tmp, kf, FloatFromBits(LN2_HI_BITS), n);
    AscendC::Sub(r, r, tmp, n);
    AscendC::Muls(tmp, kf, FloatFromBits(LN2_LO_BITS), n);
    AscendC::Sub(r, r, tmp, n);
    // p = ((((c0 r + c1) r + c2) r + c3) r + c4) r + c5; c0 * 1 == c0, so p starts as c0 * r
    AscendC::Muls(y, r, FloatFromBits(EXP_POLY_BITS[0]), n);
    AscendC::Adds(y, y, FloatFromBits(EXP_POLY_BITS[1]), n);
    for (uint32_t i = 2; i < EXP_POLY_TERMS; ++i) {
        AscendC::Mul(y, y, r, n);
        AscendC::Adds(y, y, FloatFromBits(EXP_POLY_BITS[i]), n);
    }
    // y = (p * (r*r) + r) + 1
    AscendC::Mul(tmp, r, r, n);
    AscendC::Mul(y, y, tmp, n);
    AscendC::Add(y, y, r, n);
    AscendC::Adds(y, y, 1.0f, n);
    // y * 2^k1 * 2^k2 with k1 = k >> 1 (floor), k2 = k - k1: one rounding into the subnormals.
    // 2^j is the float whose bits are (j + 127) << 23 (a logical shift: j + 127 > 0 here).
    AscendC::ShiftRight(k1, k, static_cast<int32_t>(1), n);
    AscendC::Sub(k, k, k1, n);
    AscendC::Adds(k1, k1, static_cast<int32_t>(127), n);
    AscendC::Adds(k, k, static_cast<int32_t>(127), n);
    AscendC::ShiftLeft(kf.ReinterpretCast<uint32_t>(), kf.ReinterpretCast<uint32_t>(), static_cast<uint32_t>(23), n);
    AscendC::ShiftLeft(t.ReinterpretCast<uint32_t>(), t.ReinterpretCast<uint32_t>(), static_cast<uint32_t>(23), n);
    AscendC::Mul(y, y, kf, n);
    AscendC::Mul(y, y, t, n);
    // Specials by compare/select, in the spec's order: x > hi -> +inf; x <= lo -> 0; NaN -> x.
    // Each select keeps y where the complement holds; the complements differ from the spec's
    // conditions only at NaN x, which the last select overrides.
    AscendC::Compares(bits, x, FloatFromBits(EXP_HI_BITS), AscendC::CMPMODE::LE, n);
    AscendC::Select(y, bits, y, PosInf(), AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
    AscendC::Compares(bits, x, FloatFromBits(EXP_LO_BITS), AscendC::CMPMODE::GT, n);
    AscendC::Select(y, bits, y, 0.0f, AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
    AscendC::Compare(bits, x, x, AscendC::CMPMODE::NE, n);
    AscendC::Select(y, bits, x, y, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
}

// y = log(x) over n floats (spec 6), n a multiple of 64.  y must not be x or
// inside work.  work: 4n floats; bits: n/8 bytes.  Lanes with x < 0 or NaN may
// overflow in the int32 mantissa reduction; their results are selected away.
__aicore__ inline void CanonicalLog(const LocalTensor<float>& y, const LocalTensor<float>& x,
                                    const LocalTensor<float>& work, const LocalTensor<uint8_t>& bits, uint32_t n)
{
    LocalTensor<float> xs = work;           // x scaled out of the subnormals; then ef
    LocalTensor<float> z = work[n];         // the exponent e (int32); then f*f
    LocalTensor<float> f = work[2 * n];     // the mantissa m; then f = m - 1
    LocalTensor<float> tmp = work[3 * n];
    LocalTensor<int32_t> ix = xs.ReinterpretCast<int32_t>();
    LocalTensor<int32_t> e = z.ReinterpretCast<int32_t>();
    LocalTensor<int32_t> mi = f.ReinterpretCast<int32_t>();

    // xs = x < 2^-126 ? x * 2^23 : x.  bits keeps "subnormal" until ef below.
    AscendC::Muls(xs, x, FloatFromBits(LOG_SUBNORMAL_SCALE_BITS), n);
    AscendC::Compares(bits, x, FloatFromBits(MIN_NORMAL_BITS), AscendC::CMPMODE::LT, n);
    AscendC::Select(xs, bits, xs, x, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
    // e = (bits(xs) - bits(sqrt(1/2))) >> 23 (arithmetic); m = bits(xs) - (e << 23) lies in [sqrt(1/2), sqrt(2)).
    AscendC::Adds(e, ix, -static_cast<int32_t>(LOG_SQRTHALF_BITS), n);
    AscendC::ShiftRight(e, e, static_cast<int32_t>(23), n);
    AscendC::ShiftLeft(mi.ReinterpretCast<uint32_t>(), e.ReinterpretCast<uint32_t>(), static_cast<uint32_t>(23), n);
    AscendC::Sub(mi, ix, mi, n);
    AscendC::Adds(f, f, -1.0f, n);   // f = m - 1, exact (Sterbenz)
    // ef = float(e) - (subnormal ? 23 : 0); both exact
    AscendC::Cast(xs, e, AscendC::RoundMode::CAST_NONE, n);
    AscendC::Adds(tmp, xs, -23.0f, n);
    AscendC::Select(xs, bits, tmp, xs, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
    LocalTensor<float> ef = xs;
    AscendC::Mul(z, f, f, n);
    // y = c0; y = y*f + c_i for the other eight coefficients; c0 * f starts it (c0 * 1 == c0)
    AscendC::Muls(y, f, FloatFromBits(LOG_POLY_BITS[0]), n);
    AscendC::Adds(y, y, FloatFromBits(LOG_POLY_BITS[1]), n);
    for (uint32_t i = 2; i < LOG_POLY_TERMS; ++i) {
        AscendC::Mul(y, y, f, n);
        AscendC::Adds(y, y, FloatFromBits(LOG_POLY_BITS[i]), n);
    }
    // y = ((y*f)*z + ef*ln2_lo) - 0.5*z; out = (f + y) + ef*ln2_hi
    AscendC::Mul(y, y, f, n);
    AscendC::Mul(y, y, z, n);
    AscendC::Muls(tmp, ef, FloatFromBits(LOG_LN2_LO_BITS), n);
    AscendC::Add(y, y, tmp, n);
    AscendC::Muls(tmp, z, FloatFromBits(HALF_BITS), n);
    AscendC::Sub(y, y, tmp, n);
    AscendC::Add(y, f, y, n);
    AscendC::Muls(tmp, ef, FloatFromBits(LOG_LN2_HI_BITS), n);
    AscendC::Add(y, y, tmp, n);
    // Specials in the spec's order: +inf -> +inf; +-0 -> -inf; x < 0 -> NaN; NaN -> x.  The kept
    // complements differ from the spec's conditions only at NaN x, which the last select overrides.
    AscendC::Compares(bits, x, PosInf(), AscendC::CMPMODE::NE, n);
    AscendC::Select(y, bits, y, PosInf(), AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
    AscendC::Compares(bits, x, 0.0f, AscendC::CMPMODE::NE, n);
    AscendC::Select(y, bits, y, NegInf(), AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
    AscendC::Compares(bits, x, 0.0f, AscendC::CMPMODE::GE, n);
    AscendC::Select(y, bits, y, QuietNaN(), AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
    AscendC::Compare(bits, x, x, AscendC::CMPMODE::NE, n);
    AscendC::Select(y, bits, x, y, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
}

// Veltkamp's split a = hi + lo over n floats, exact: c = 4097 a; hi = c - (c - a); lo = a - hi (spec 7).
// hi, lo and t (scratch) are distinct from a and from each other.
__aicore__ inline void VeltkampSplit(const LocalTensor<float>& hi, const LocalTensor<float>& lo,
                                     const LocalTensor<float>& a, const LocalTensor<float>& t, uint32_t n)
{
    AscendC::Muls(hi, a, FloatFromBits(SPLIT_BITS), n);
    AscendC::Sub(t, hi, a, n);
    AscendC::Sub(hi, hi, t, n);
    AscendC::Sub(lo, a, hi, n);
}

// r = 1/s over n floats (spec 7) for s in [1, 2^31]: RECIP_NEWTON_STEPS Newton
// steps r = r * (2 - s*r) from bits(r0) = RECIP_MAGIC - bits(s), then one
// correction r + r*e with e = 1 - s*r computed exactly by Dekker's product.
// n a multiple of 64.  r must not be s or inside work.  work: 7n floats.
__aicore__ inline void CanonicalReciprocal(const LocalTensor<float>& r, const LocalTensor<float>& s,
                                           const LocalTensor<float>& work, uint32_t n)
{
    LocalTensor<float> t = work;
    LocalTensor<float> p = work[n];
    LocalTensor<float> sh = work[2 * n];
    LocalTensor<float> sl = work[3 * n];
    LocalTensor<float> rh = work[4 * n];
    LocalTensor<float> rl = work[5 * n];
    LocalTensor<float> err = work[6 * n];
    LocalTensor<int32_t> ri = r.ReinterpretCast<int32_t>();

    AscendC::Duplicate(ri, static_cast<int32_t>(RECIP_MAGIC), n);
    AscendC::Sub(ri, ri, s.ReinterpretCast<int32_t>(), n);
    AscendC::Duplicate(sh, FloatFromBits(TWO_BITS), n);   // the constant 2 until the split below
    for (uint32_t i = 0; i < RECIP_NEWTON_STEPS; ++i) {
        AscendC::Mul(t, s, r, n);
        AscendC::Sub(t, sh, t, n);
        AscendC::Mul(r, r, t, n);
    }
    AscendC::Mul(p, s, r, n);
    VeltkampSplit(sh, sl, s, t, n);
    VeltkampSplit(rh, rl, r, t, n);
    // err = (((sh*rh - p) + sh*rl) + sl*rh) + sl*rl, which is s*r - p exactly
    AscendC::Mul(err, sh, rh, n);
    AscendC::Sub(err, err, p, n);
    AscendC::Mul(t, sh, rl, n);
    AscendC::Add(err, err, t, n);
    AscendC::Mul(t, sl, rh, n);
    AscendC::Add(err, err, t, n);
    AscendC::Mul(t, sl, rl, n);
    AscendC::Add(err, err, t, n);
    // e = (1 - p) - err; r = r + r*e
    AscendC::Duplicate(t, FloatFromBits(ONE_BITS), n);
    AscendC::Sub(t, t, p, n);
    AscendC::Sub(t, t, err, n);
    AscendC::Mul(t, r, t, n);
    AscendC::Add(r, r, t, n);
}

// 1/s (spec 7) of one scalar s in [1, 2^31], on a 64-lane vector holding s in every lane:
// in and out 64 floats each, work 7 x 64 floats.  Ends with the vector pipe owning the buffers.
__aicore__ inline float ReciprocalOfScalar(float s, const LocalTensor<float>& in, const LocalTensor<float>& out,
                                           const LocalTensor<float>& work)
{
    AscendC::Duplicate(in, s, FLOATS_PER_REPEAT);
    CanonicalReciprocal(out, in, work, FLOATS_PER_REPEAT);
    VectorToScalarSync();
    float r = out.GetValue(0);
    ScalarToVectorSync();
    return r;
}

// r = 1/sqrt(y) over n floats (spec 15.2) for y > 0: RSQRT_NEWTON_STEPS Newton steps
// r = r * (1.5 - (h*r)*r), h = 0.5*y, from bits(r0) = RSQRT_MAGIC - (bits(y) >> 1); then
// 0 where y is +inf (NaN propagates through the steps by itself).  n a multiple of 64.
// r must not be y or inside work.  work: 3n floats; bits: n/8 bytes.
__aicore__ inline void CanonicalRsqrt(const LocalTensor<float>& r, const LocalTensor<float>& y,
                                      const LocalTensor<float>& work, const LocalTensor<uint8_t>& bits, uint32_t n)
{
    LocalTensor<float> h = work;
    LocalTensor<float> t = work[n];
    LocalTensor<float> threeHalves = work[2 * n];
    LocalTensor<int32_t> ri = r.ReinterpretCast<int32_t>();
    LocalTensor<int32_t> ti = t.ReinterpretCast<int32_t>();

    // bits(y) >> 1 is arithmetic in the spec; y > 0 (or NaN, whose result is NaN anyway).
    AscendC::ShiftRight(ti, y.ReinterpretCast<int32_t>(), static_cast<int32_t>(1), n);
    AscendC::Duplicate(ri, static_cast<int32_t>(RSQRT_MAGIC), n);
    AscendC::Sub(ri, ri, ti, n);
    AscendC::Muls(h, y, FloatFromBits(HALF_BITS), n);
    AscendC::Duplicate(threeHalves, FloatFromBits(THREE_HALVES_BITS), n);
    for (uint32_t i = 0; i < RSQRT_NEWTON_STEPS; ++i) {
        AscendC::Mul(t, h, r, n);
        AscendC::Mul(t, t, r, n);
        AscendC::Sub(t, threeHalves, t, n);
        AscendC::Mul(r, r, t, n);
    }
    AscendC::Compares(bits, y, PosInf(), AscendC::CMPMODE::NE, n);
    AscendC::Select(r, bits, r, 0.0f, AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
}

// s = sqrt32(y) over n floats (spec 29.10): r = rsqrt(y) (spec 15.2), s = y * r, then one correction
// s = s + ((y - p) - err) * (0.5 * r) with p = s * s and err = s*s - p exactly, by spec 7's split:
// (sh, sl) = split(s), err = ((sh*sh - p) + (sh*sl + sh*sl)) + sl*sl.  y < 2^-126 (zeros, subnormals,
// negatives) gives +0.0 and runs the steps on 1.0 instead; +inf gives +inf; NaN propagates.  n a multiple
// of 64.  s must not be y or inside work.  work: 6n floats; bits: n/8 bytes.
__aicore__ inline void CanonicalSqrt(const LocalTensor<float>& s, const LocalTensor<float>& y,
                                     const LocalTensor<float>& work, const LocalTensor<uint8_t>& bits, uint32_t n)
{
    LocalTensor<float> safe = work;
    LocalTensor<float> r = work[n];
    LocalTensor<float> p = work[2 * n];     // p, sh, sl: first the rsqrt's work
    LocalTensor<float> sh = work[3 * n];
    LocalTensor<float> sl = work[4 * n];
    LocalTensor<float> t = work[5 * n];
    const float minNormal = FloatFromBits(MIN_NORMAL_BITS);

    // safe = (y < 2^-126 ? 1 : y); NaN stays.
    AscendC::Duplicate(t, 1.0f, n);
    AscendC::Compares(bits, y, minNormal, AscendC::CMPMODE::LT, n);
    AscendC::Select(safe, bits, t, y, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
    CanonicalRsqrt(r, safe, p, bits, n);
    AscendC::Mul(s, safe, r, n);
    AscendC::Mul(p, s, s, n);
    VeltkampSplit(sh, sl, s, t, n);
    // t = err = ((sh*sh - p) + (sh*sl + sh*sl)) + sl*sl
    AscendC::Mul(t, sh, sh, n);
    AscendC::Sub(t, t, p, n);
    AscendC::Mul(sh, sh, sl, n);
    AscendC::Add(sh, sh, sh, n);
    AscendC::Add(t, t, sh, n);
    AscendC::Mul(sl, sl, sl, n);
    AscendC::Add(t, t, sl, n);
    // s = s + ((safe - p) - err) * (0.5 * r)
    AscendC::Sub(p, safe, p, n);
    AscendC::Sub(p, p, t, n);
    AscendC::Muls(r, r, FloatFromBits(HALF_BITS), n);
    AscendC::Mul(p, p, r, n);
    AscendC::Add(s, s, p, n);
    // +inf where y is +inf (the steps gave inf * 0 = NaN); then +0.0 where y < 2^-126.  The kept
    // complements differ from these conditions only at NaN y, whose s is NaN already.
    AscendC::Compares(bits, y, PosInf(), AscendC::CMPMODE::NE, n);
    AscendC::Select(s, bits, s, PosInf(), AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
    AscendC::Duplicate(t, 0.0f, n);
    AscendC::Compares(bits, y, minNormal, AscendC::CMPMODE::LT, n);
    AscendC::Select(s, bits, t, s, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
}

constexpr uint32_t TWO_POW_127_BITS = 0x7F000000u;   // 2^127: the binade of exponent e = 127 (spec 29.11)

// out = recip(d) over n floats (spec 29.11), for d in [2^-126, +inf] or NaN (AdamW's denominator):
// e = (bits(d) >> 23) - 127 and m = float(bits(d) - (e << 23)), which is (bits(d) & 0x007FFFFF) |
// 0x3F800000 (the exponent replaced by 127's, so m is in [1, 2)); out = reciprocal(m) (spec 7) *
// float((127 - e) << 23), the exact scaling by 2^-e, and where e == 127 (2^127 <= d < +inf)
// (reciprocal(m) * 0.5) * 2^-126; +0.0 where d is +inf (whose e = 128 would scale by -inf), and d
// itself where d is NaN.
// n a multiple of 64.  out must not be d or inside work.  work: 9n floats; bits: n/8 bytes.
__aicore__ inline void GeneralReciprocal(const LocalTensor<float>& out, const LocalTensor<float>& d,
                                         const LocalTensor<float>& work, const LocalTensor<uint8_t>& bits,
                                         uint32_t n)
{
    LocalTensor<int32_t> e = work.ReinterpretCast<int32_t>();
    LocalTensor<float> m = work[n];         // the mantissa m, then 2^-e, then reciprocal(m) * 2^-e
    LocalTensor<float> low = work[2 * n];   // first the reciprocal's work (7n)
    LocalTensor<int32_t> mi = m.ReinterpretCast<int32_t>();

    AscendC::ShiftRight(e, d.ReinterpretCast<int32_t>(), static_cast<int32_t>(23), n);
    AscendC::Adds(e, e, static_cast<int32_t>(-127), n);
    AscendC::ShiftLeft(mi.ReinterpretCast<uint32_t>(), e.ReinterpretCast<uint32_t>(), static_cast<uint32_t>(23), n);
    AscendC::Sub(mi, d.ReinterpretCast<int32_t>(), mi, n);
    CanonicalReciprocal(out, m, low, n);
    // low = (reciprocal(m) * 0.5) * 2^-126
    AscendC::Muls(low, out, FloatFromBits(HALF_BITS), n);
    AscendC::Muls(low, low, FloatFromBits(MIN_NORMAL_BITS), n);
    // m = reciprocal(m) * float((127 - e) << 23)
    AscendC::Duplicate(mi, static_cast<int32_t>(127), n);
    AscendC::Sub(mi, mi, e, n);
    AscendC::ShiftLeft(mi.ReinterpretCast<uint32_t>(), mi.ReinterpretCast<uint32_t>(), static_cast<uint32_t>(23), n);
    AscendC::Mul(m, out, m, n);
    // e == 127 as 2^127 <= d; +inf (e = 128) is replaced below and NaN fails the compare.
    AscendC::Compares(bits, d, FloatFromBits(TWO_POW_127_BITS), AscendC::CMPMODE::GE, n);
    AscendC::Select(out, bits, low, m, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
    AscendC::Compares(bits, d, PosInf(), AscendC::CMPMODE::NE, n);
    AscendC::Select(out, bits, out, 0.0f, AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
    AscendC::Compare(bits, d, d, AscendC::CMPMODE::EQ, n);            // false only where d is NaN
    AscendC::Select(out, bits, out, d, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
}

// phi(d) = sum_k d^k / (k + 2)! of spec 16's k3 over n floats: phi = c0; phi = phi * d + c_i for the
// other K3_SERIES_BITS (Horner from the highest degree); c0 * 1 == c0, so phi starts as c0 * d + c1.
// phi must not be d.  n a multiple of 64.
__aicore__ inline void K3Series(const LocalTensor<float>& phi, const LocalTensor<float>& d, uint32_t n)
{
    AscendC::Muls(phi, d, FloatFromBits(K3_SERIES_BITS[0]), n);
    AscendC::Adds(phi, phi, FloatFromBits(K3_SERIES_BITS[1]), n);
    for (uint32_t i = 2; i < K3_SERIES_TERMS; ++i) {
        AscendC::Mul(phi, phi, d, n);
        AscendC::Adds(phi, phi, FloatFromBits(K3_SERIES_BITS[i]), n);
    }
}

// k = e^d - 1 - d over n floats (spec 16, k3) without cancellation: for |d| < 1,
// (d*d) * phi(d) with phi = c0; phi = phi*d + c_i (K3_SERIES_BITS, Horner from the
// highest degree); otherwise (exp(d) - 1) - d; +inf where d is +inf.  n a multiple
// of 64.  k must not be d or inside work.  work: 6n floats; bits: n/8 bytes.
__aicore__ inline void CanonicalK3(const LocalTensor<float>& k, const LocalTensor<float>& d,
                                   const LocalTensor<float>& work, const LocalTensor<uint8_t>& bits, uint32_t n)
{
    LocalTensor<float> direct = work;
    LocalTensor<float> sq = work[n];
    LocalTensor<float> expWork = work[2 * n];   // 4n floats, free again after CanonicalExp

    K3Series(k, d, n);
    AscendC::Mul(sq, d, d, n);
    AscendC::Mul(k, sq, k, n);
    // direct = (exp(d) - 1) - d; d + (-1) == d - 1 in IEEE.
    CanonicalExp(direct, d, expWork, bits, n);
    AscendC::Adds(direct, direct, -1.0f, n);
    AscendC::Sub(direct, direct, d, n);
    // |d| < 1 as (d > -1) and (d < 1): the series where both hold, direct elsewhere (NaN included).
    const float limit = FloatFromBits(K3_SERIES_LIMIT_BITS);
    AscendC::Compares(bits, d, -limit, AscendC::CMPMODE::GT, n);
    AscendC::Select(k, bits, k, direct, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
    AscendC::Compares(bits, d, limit, AscendC::CMPMODE::LT, n);
    AscendC::Select(k, bits, k, direct, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
    AscendC::Compares(bits, d, PosInf(), AscendC::CMPMODE::NE, n);
    AscendC::Select(k, bits, k, PosInf(), AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
}

// k' = e^d - 1 over n floats (spec 26.9, k3's derivative) without cancellation: for |d| < 1,
// d + (d*d) * phi(d) with k3's series phi; otherwise exp(d) - 1 (so +inf at +inf, -1 at -inf,
// NaN at NaN).  n a multiple of 64.  k must not be d or inside work.  work: 6n floats; bits: n/8 bytes.
__aicore__ inline void CanonicalK3Derivative(const LocalTensor<float>& k, const LocalTensor<float>& d,
                                             const LocalTensor<float>& work, const LocalTensor<uint8_t>& bits,
                                             uint32_t n)
{
    LocalTensor<float> direct = work;
    LocalTensor<float> sq = work[n];
    LocalTensor<float> expWork = work[2 * n];   // 4n floats

    K3Series(k, d, n);
    AscendC::Mul(sq, d, d, n);
    AscendC::Mul(k, sq, k, n);
    AscendC::Add(k, d, k, n);
    CanonicalExp(direct, d, expWork, bits, n);
    AscendC::Adds(direct, direct, -1.0f, n);
    // |d| < 1 as (d > -1) and (d < 1), as in CanonicalK3.
    const float limit = FloatFromBits(K3_SERIES_LIMIT_BITS);
    AscendC::Compares(bits, d, -limit, AscendC::CMPMODE::GT, n);
    AscendC::Select(k, bits, k, direct, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
    AscendC::Compares(bits, d, limit, AscendC::CMPMODE::LT, n);
    AscendC::Select(k, bits, k, direct, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
}

}  // namespace bitparity

#endif  // BITPARITY_CANONICAL_H
