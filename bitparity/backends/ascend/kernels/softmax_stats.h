// The softmax row statistics (spec 8.2) from values already in UB: the pieces
// that kernels/softmax.cpp (rows streamed from GM) and kernels/attention.cpp
// (scores computed in UB) share, so the order is written once.
//
//   SegmentStatistics: m_g from the lane-wise maxima, then SegmentSplitSums.
//   SegmentSplitSums: pass 2 of one segment.  e = exp(w - shift_g) chunk by chunk;
//     lane j accumulates count += (e == 1 ? 1 : -0.0) and rest += (e == 1 or
//     e == 0 ? -0.0 : e); n_g = TreeSum(count), t_g = TreeSum(rest) over the
//     spec's W lanes.
//   CombineSegments: the row.  c_g = exp(m_g - shift); count = tree over
//     (c_g == 1 ? n_g : -0.0), rest = tree over (c_g == 1 ? t_g : c_g * (n_g + t_g)),
//     both padded with -0.0 to a power of two; (total, err) = TwoSum(count, rest);
//     recip = (total == 0 ? 0 : 1/total); log_total = log(total) + err * recip.

#ifndef BITPARITY_SOFTMAX_STATS_H
#define BITPARITY_SOFTMAX_STATS_H

#include "canonical.h"
#include "tiling.h"

namespace bitparity {

struct SoftmaxStats {
    float shift;
    float total;
    float logTotal;
    float recip;
};

// The vector scratch both pieces use: acc, acc2, e, term of LANES floats each (at
// least the tile's lanes), work of 4 x LANES floats, bits of LANES / 8 bytes.
struct SoftmaxScratch {
    LocalTensor<float> acc;
    LocalTensor<float> acc2;
    LocalTensor<float> e;
    LocalTensor<float> term;
    LocalTensor<float> work;
    LocalTensor<uint8_t> bits;
};

struct SplitSums {
    float count;
    float rest;
};

// n_g and t_g of one segment whose w (masked and padding lanes -inf) lies in
// segment[c * LANES ...] for c < dataChunks, each chunk `lanes` wide.  Subtracts
// segShift from the cached w in place.  Leaves the scalar unit owning acc and
// acc2: the caller syncs (ScalarToVectorSync) before vector reuse.
__aicore__ inline SplitSums SegmentSplitSums(const LocalTensor<float>& segment, uint32_t dataChunks, uint32_t lanes,
                                             uint32_t treeWidth, float segShift, const SoftmaxScratch& s)
{
    AscendC::Duplicate(s.acc, NegZero(), lanes);
    AscendC::Duplicate(s.acc2, NegZero(), lanes);
    for (uint32_t c = 0; c < dataChunks; ++c) {
        LocalTensor<float> w = segment[c * LANES];
        AscendC::Adds(w, w, -segShift, lanes);        // w + (-shift) == w - shift in IEEE
        CanonicalExp(s.e, w, s.work, s.bits, lanes);
        // e == 1 exactly where the spec's "one" holds, so e itself is the 1.0 it counts.
        AscendC::Compares(s.bits, s.e, 1.0f, AscendC::CMPMODE::EQ, lanes);
        AscendC::Select(s.term, s.bits, s.e, NegZero(), AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, lanes);
        AscendC::Add(s.acc, s.acc, s.term, lanes);
        AscendC::Compares(s.bits, s.e, 1.0f, AscendC::CMPMODE::NE, lanes);
        AscendC::Select(s.term, s.bits, s.e, NegZero(), AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, lanes);
        AscendC::Compares(s.bits, s.e, 0.0f, AscendC::CMPMODE::NE, lanes);
        AscendC::Select(s.term, s.bits, s.term, NegZero(), AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, lanes);
        AscendC::Add(s.acc2, s.acc2, s.term, lanes);
    }
    SplitSums sums;
    sums.count = TreeSum(s.acc, treeWidth);
    sums.rest = TreeSum(s.acc2, treeWidth);
    return sums;
}

// Segment g's m_g (TreeMax of the lane-wise maxima in s.acc), then n_g and t_g (SegmentSplitSums of its w,
// cached in segment[c * LANES ...], left as w - shift_g), stored at lane g of segMax, segCount and segRest.
// Returns m_g.  Ends with the vector pipe owning every buffer again.
__aicore__ inline float SegmentStatistics(const LocalTensor<float>& segment, const RowGeometry& geo, uint32_t g,
                                          const LocalTensor<float>& segMax, const LocalTensor<float>& segCount,
                                          const LocalTensor<float>& segRest, const SoftmaxScratch& s)
{
    const float m = TreeMax(s.acc, geo.lanes, s.e, s.bits);
    const float segShift = m == NegInf() ? 0.0f : m;
    ScalarToVectorSync();
    // Pass 2: exponentials, split into exact ones (counted) and the rest (summed).
    const SplitSums sums = SegmentSplitSums(segment, geo.DataChunks(g), geo.lanes, geo.treeWidth, segShift, s);
    segMax.SetValue(g, m);
    segCount.SetValue(g, sums.count);
    segRest.SetValue(g, sums.rest);
    ScalarToVectorSync();
    return m;
}

// The row statistics from the per-segment m_g, n_g, t_g (segMax, segCount, segRest:
// partialLanes = max(64, next_pow2(segments)) lanes, absent segments -inf, -0.0,
// -0.0) and the row's maximum rowMax (already + 0.0).  laneIndex: FillLaneIndex's.
// Ends with the vector pipe owning the scratch again.
__aicore__ inline SoftmaxStats CombineSegments(const LocalTensor<float>& segMax, const LocalTensor<float>& segCount,
                                               const LocalTensor<float>& segRest, uint32_t segments, float rowMax,
                                               const LocalTensor<float>& laneIndex, const SoftmaxScratch& s)
{
    uint32_t partialLanes = NextPow2(segments);
    partialLanes = partialLanes < FLOATS_PER_REPEAT ? FLOATS_PER_REPEAT : partialLanes;
    SoftmaxStats st;
    st.shift = rowMax == NegInf() ? 0.0f : rowMax;

    // c_g = exp(m_g - shift), top_g = (c_g == 1).
    AscendC::Adds(s.acc, segMax, -st.shift, partialLanes);
    CanonicalExp(s.e, s.acc, s.work, s.bits, partialLanes);
    AscendC::Compares(s.bits, s.e, 1.0f, AscendC::CMPMODE::EQ, partialLanes);
    AscendC::Add(s.acc2, segCount, segRest, partialLanes);
    AscendC::Mul(s.acc2, s.e, s.acc2, partialLanes);
    AscendC::Select(s.acc2, s.bits, segRest, s.acc2, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, partialLanes);
    AscendC::Select(s.acc, s.bits, segCount, NegZero(), AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, partialLanes);
    SelectValidLanes(s.acc, s.acc, laneIndex, s.bits, segments, partialLanes, NegZero());
    SelectValidLanes(s.acc2, s.acc2, laneIndex, s.bits, segments, partialLanes, NegZero());
    float count = TreeSum(s.acc, NextPow2(segments));
    float rest = TreeSum(s.acc2, NextPow2(segments));
    float err;
    TwoSum(count, rest, st.total, err);

    // log(total) and 1/total on one 64-lane vector (lane 0 is the row's).
    s.acc.SetValue(0, st.total);
    ScalarToVectorSync();
    CanonicalLog(s.e, s.acc, s.work, s.bits, FLOATS_PER_REPEAT);
    CanonicalReciprocal(s.acc2, s.acc, s.work, FLOATS_PER_REPEAT);
    VectorToScalarSync();
    float logTotal = s.e.GetValue(0);
    st.recip = st.total == 0.0f ? 0.0f : s.acc2.GetValue(0);
    float correction = err * st.recip;
    st.logTotal = logTotal + correction;
    ScalarToVectorSync();
    return st;
}

}  // namespace bitparity

#endif  // BITPARITY_SOFTMAX_STATS_H
