// Selection by value (spec 21) on Ascend C: the order keys that bisection walks,
// and the exact counting step both topk.cpp and sampling.cpp build their passes from.
//
// Order keys.  Spec 21 orders values numerically, -0.0 == +0.0, -inf below every
// finite value and NaN below -inf.  The scalar unit bisects over int32 keys with
// that order: key(v) = bits(v) for v >= +0.0 and -(bits(v) & 0x7FFFFFFF) for
// v <= -0.0 (both zeros are key 0), so key(-inf) = -0x7F800000 and key(+inf) =
// 0x7F800000; NaN is KEY_NAN, one below key(-inf).  KeyValue inverts key on
// non-NaN keys.  The vector unit never sees a key: it compares values with
// KeyValue(k) by IEEE Compares, which order them exactly as the keys do (a NaN
// value compares false with everything, which is below every non-NaN key).
//
// Counting.  A count is a lane-wise float sum of 1.0 (counted) and -0.0 (not),
// folded by TreeSum.  Every partial is an integer below 2^24 (rows hold at most
// 2^24 floats, tiling.h), so the count is exact whatever the order of additions.

#ifndef BITPARITY_SELECTION_H
#define BITPARITY_SELECTION_H

#include "canonical.h"

namespace bitparity {

constexpr int32_t KEY_NEG_INF = -0x7F800000;
constexpr int32_t KEY_POS_INF = 0x7F800000;
constexpr int32_t KEY_NAN = KEY_NEG_INF - 1;

// Scalar unit.  The key of a value (NaN: KEY_NAN).
__aicore__ inline int32_t OrderKey(float v)
{
    if (v != v) {
        return KEY_NAN;
    }
    union {
        float f;
        uint32_t u;
    } b;
    b.f = v;
    int32_t magnitude = static_cast<int32_t>(b.u & 0x7FFFFFFFu);
    return (b.u >> 31) != 0 ? -magnitude : magnitude;
}

// Scalar unit.  The value of a non-NaN key (key 0 is +0.0).
__aicore__ inline float KeyValue(int32_t key)
{
    return key >= 0 ? FloatFromBits(static_cast<uint32_t>(key))
                    : FloatFromBits(static_cast<uint32_t>(-key) | 0x80000000u);
}

// Scalar unit.  Whether keys lo < hi have a key between them, and that key's midpoint,
// computed in int64: the key range spans 2^32, so hi - lo overflows int32.
__aicore__ inline bool KeysApart(int32_t lo, int32_t hi)
{
    return static_cast<int64_t>(hi) - lo > 1;
}

__aicore__ inline int32_t MidKey(int32_t lo, int32_t hi)
{
    return static_cast<int32_t>(lo + (static_cast<int64_t>(hi) - lo) / 2);
}

// acc += (bit i ? 1.0 : -0.0) over n lanes: one counting step.  ones: n floats of 1.0; term: n floats.
__aicore__ inline void AddCount(const LocalTensor<float>& acc, const LocalTensor<uint8_t>& bits,
                                const LocalTensor<float>& ones, const LocalTensor<float>& term, uint32_t n)
{
    AscendC::Select(term, bits, ones, NegZero(), AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
    AscendC::Add(acc, acc, term, n);
}

}  // namespace bitparity

#endif  // BITPARITY_SELECTION_H
