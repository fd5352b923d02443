// Generated from bitparity/spec.py by bitparity/backends/ascend/spec_header.py: do not edit.
// SPEC_VERSION 2.1.0.  Float constants are IEEE-754 binary32 bit patterns;
// the kernels turn them into floats with FloatFromBits (canonical.h).
#ifndef BITPARITY_SPEC_CONSTANTS_H
#define BITPARITY_SPEC_CONSTANTS_H

#include <cstdint>

namespace bitparity {

constexpr uint32_t LANES = 1024u;
constexpr uint32_t LINEAR_BW = 29u;
constexpr uint32_t LINEAR_BX = 39u;
constexpr uint32_t LINEAR_GRAD_BLOCK = 32u;
constexpr uint32_t PHILOX_M0 = 3528531795u;
constexpr uint32_t PHILOX_M1 = 3449720151u;
constexpr uint32_t PHILOX_ROUNDS = 10u;
constexpr uint32_t PHILOX_W0 = 2654435769u;
constexpr uint32_t PHILOX_W1 = 3144134277u;
constexpr uint32_t RECIP_NEWTON_STEPS = 4u;
constexpr uint32_t RSQRT_NEWTON_STEPS = 4u;
constexpr uint32_t SAMPLE_STREAM = 0u;
constexpr uint32_t SEGMENT = 16384u;
constexpr uint32_t UNIFORM_COARSE_MIN = 65536u;

constexpr uint32_t EXP_CLAMP_HI_BITS = 0x42B20000u;  // 89.0
constexpr uint32_t EXP_CLAMP_LO_BITS = 0xC2D00000u;  // -104.0
constexpr uint32_t EXP_HI_BITS = 0x42B17217u;  // 88.72283172607422
constexpr uint32_t EXP_LO_BITS = 0xC2CFF1B5u;  // -103.97208404541016
constexpr uint32_t HALF_BITS = 0x3F000000u;  // 0.5
constexpr uint32_t K3_SERIES_LIMIT_BITS = 0x3F800000u;  // 1.0
constexpr uint32_t LN2_HI_BITS = 0x3F317200u;  // 0.693145751953125
constexpr uint32_t LN2_LO_BITS = 0x35BFBE8Eu;  // 1.428606765330187e-06
constexpr uint32_t LOG2E_BITS = 0x3FB8AA3Bu;  // 1.4426950216293335
constexpr uint32_t LOG_LN2_HI_BITS = 0x3F318000u;  // 0.693359375
constexpr uint32_t LOG_LN2_LO_BITS = 0xB95E8083u;  // -0.00021219444170128554
constexpr uint32_t LOG_SQRTHALF_BITS = 0x3F3504F3u;  // 0.7071067690849304
constexpr uint32_t LOG_SUBNORMAL_SCALE_BITS = 0x4B000000u;  // 8388608.0
constexpr uint32_t MIN_NORMAL_BITS = 0x00800000u;  // 1.1754943508222875e-38
constexpr uint32_t NEG_ZERO_BITS = 0x80000000u;  // -0.0
constexpr uint32_t ONE_BITS = 0x3F800000u;  // 1.0
constexpr uint32_t RECIP_MAGIC = 0x7EF311C3u;  // 1.6154731354610118e+38
constexpr uint32_t ROUND_MAGIC_BITS = 0x4B400000u;  // 12582912.0
constexpr uint32_t RSQRT_MAGIC = 0x5F3759DFu;  // 1.3211836172961055e+19
constexpr uint32_t SPLIT_BITS = 0x45800800u;  // 4097.0
constexpr uint32_t THIRD_BITS = 0x3EAAAAABu;  // 0.3333333432674408
constexpr uint32_t THREE_HALVES_BITS = 0x3FC00000u;  // 1.5
constexpr uint32_t TWO_BITS = 0x40000000u;  // 2.0
constexpr uint32_t TWO_M24_BITS = 0x33800000u;  // 5.960464477539063e-08
constexpr uint32_t TWO_M48_BITS = 0x27800000u;  // 3.552713678800501e-15
constexpr uint32_t TWO_M64_BITS = 0x1F800000u;  // 5.421010862427522e-20
constexpr uint32_t TWO_P64_BITS = 0x5F800000u;  // 1.8446744073709552e+19

// EXP_POLY_BITS, in spec.py's order
constexpr uint32_t EXP_POLY_TERMS = 6u;
constexpr uint32_t EXP_POLY_BITS[EXP_POLY_TERMS] = {
    0x39506967u,  // 0.00019875691214110702
    0x3AB743CEu,  // 0.001398199936375022
    0x3C088908u,  // 0.008333452045917511
    0x3D2AA9C1u,  // 0.04166579619050026
    0x3E2AAAAAu,  // 0.1666666567325592
    0x3F000000u,  // 0.5
};

// K3_SERIES_BITS, in spec.py's order
constexpr uint32_t K3_SERIES_TERMS = 11u;
constexpr uint32_t K3_SERIES_BITS[K3_SERIES_TERMS] = {
    0x310F76C7u,  // 2.0876755879584152e-09
    0x32D7322Bu,  // 2.5052107943679403e-08
    0x3493F27Eu,  // 2.755731998149713e-07
    0x3638EF1Du,  // 2.7557318844628753e-06
    0x37D00D01u,  // 2.4801587642286904e-05
    0x39500D01u,  // 0.00019841270113829523
    0x3AB60B61u,  // 0.0013888889225199819
    0x3C088889u,  // 0.008333333767950535
    0x3D2AAAABu,  // 0.0416666679084301
    0x3E2AAAABu,  // 0.1666666716337204
    0x3F000000u,  // 0.5
};

// LOG_POLY_BITS, in spec.py's order
constexpr uint32_t LOG_POLY_TERMS = 9u;
constexpr uint32_t LOG_POLY_BITS[LOG_POLY_TERMS] = {
    0x3D9021BBu,  // 0.07037683576345444
    0xBDEBD1B8u,  // -0.11514610052108765
    0x3DEF251Au,  // 0.11676998436450958
    0xBDFE5D4Fu,  // -0.12420140951871872
    0x3E11E9BFu,  // 0.14249323308467865
    0xBE2AAE50u,  // -0.16668057441711426
    0x3E4CCEACu,  // 0.2000071406364441
    0xBE7FFFFCu,  // -0.24999994039535522
    0x3EAAAAAAu,  // 0.3333333134651184
};

}  // namespace bitparity

#endif  // BITPARITY_SPEC_CONSTANTS_H
