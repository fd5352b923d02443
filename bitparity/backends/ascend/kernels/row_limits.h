// The row limit (and attention's key and head-dim limits) that the kernels are sized for and that the launching host code checks, and the
// philox kernel's tile, by which the host sizes that kernel's launch.
//
// Plain C++ with no Ascend C in it: the CANN 8.x build compiles the torch_npu
// binding as host C++, which cannot include kernel_operator.h, and still checks
// rows against this limit before a launch (npu/bitparity_npu.cpp).

#ifndef BITPARITY_ROW_LIMITS_H
#define BITPARITY_ROW_LIMITS_H

#include "spec_constants.h"

namespace bitparity {

constexpr uint32_t MAX_SEGMENTS = 1024;                 // per-segment partials fit in one 4 KB tile
constexpr uint32_t MAX_ROW = MAX_SEGMENTS * SEGMENT;    // 2^24 floats, which keeps float32 counts exact
constexpr uint32_t ATTENTION_MAX_SEGMENTS = 16;         // attention.cpp: per-segment partial rows of d floats fit in UB
constexpr uint32_t ATTENTION_MAX_KEYS = ATTENTION_MAX_SEGMENTS * SEGMENT;   // 262,144 keys
constexpr uint32_t ATTENTION_MAX_DIM = 256;             // attention.cpp: the score dots' tiles and partial rows fit in UB
constexpr uint32_t FOLD_MAX_DEPTH = 25;                 // row_fold.h: a row fold over at most MAX_ROW leaves keeps
                                                        // at most bitlen(MAX_ROW - 1) + 1 subtrees in UB
constexpr uint32_t PHILOX_TILE = 256;                   // counters per tile of the philox kernel: 4 KB of counter words

}  // namespace bitparity

#endif  // BITPARITY_ROW_LIMITS_H
