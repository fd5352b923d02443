// torch_npu binding of the Ascend C kernels: torch.ops.bitparity_ascend.* on NPU (PrivateUse1) tensors.
//
// Written to CANN's documented conventions but NEVER COMPILED BY BISHENG OR RUN
// ON AN NPU in this project (docs/ascend.md); the tests compile its CANN 8.x
// form against stand-ins for torch_npu and CANN.  ../CMakeLists.txt builds this
// one file in one of two ways and generates the header it includes, bitparity_kernels.h:
//   * CANN >= 9.1 (ASC language, bisheng): the header #includes every kernel
//     source, so kernels and launches are one translation unit (no relocatable
//     device code, -dc, is needed), and a launch is <<<blocks, nullptr, stream>>>.
//   * CANN 8.x (ascendc_library): the kernels are compiled into their own
//     library, which generates a host launcher aclrtlaunch_<kernel> per kernel;
//     the header #includes their aclrtlaunch_<kernel>.h, this file is host C++
//     (BITPARITY_ACLRT_LAUNCH=1), and a launch is ACLRT_LAUNCH_KERNEL(kernel)(blocks, stream, ...).
// Both launch on the current NPU stream (Stream()).
//
// One op is one schema line in TORCH_LIBRARY, one impl line in
// TORCH_LIBRARY_IMPL and one function below; tests/backends/test_ascend_build.py
// checks that these, the kernels' entry points, the host emulation's launches
// (emulation/launch.cpp) and the backend's calls (../__init__.py) name the same ops.

// ATen and the op registry only: torch/extension.h would pull in Python.h, which this library never needs.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "torch_npu/csrc/core/npu/NPUStream.h"

#include "bitparity_kernels.h"
#include "row_limits.h"
#include "spec_constants.h"

#if BITPARITY_ACLRT_LAUNCH
using GmAddress = void*;
// The generated launcher returns 0 when the launch was queued.
#define BITPARITY_LAUNCH(kernel, blocks, ...)                                                      \
    TORCH_CHECK(ACLRT_LAUNCH_KERNEL(kernel)(blocks, Stream(), __VA_ARGS__) == 0,                   \
                "bitparity (ascend): launching " #kernel " failed")
#else
using GmAddress = GM_ADDR;
#define BITPARITY_LAUNCH(kernel, blocks, ...) kernel<<<blocks, nullptr, Stream()>>>(__VA_ARGS__)
#endif

namespace bitparity_npu {

// Vector cores of an Atlas 800T A2 (910B3; a 910B1/B2 has 48).  Using fewer
// cores than the chip has costs time, never bits: each row is computed by one
// core in the spec's order.
constexpr int64_t MAX_BLOCKS = 40;

uint32_t Blocks(int64_t items) { return static_cast<uint32_t>(std::max<int64_t>(1, std::min(items, MAX_BLOCKS))); }

// The current stream of the current device, which each op first sets to its
// first input's NPU (a DeviceGuard), so inputs on npu:1 launch on npu:1.
// stream(true) flushes torch_npu's task queue first, so the launch is ordered
// after the work torch_npu has queued but not yet submitted.
aclrtStream Stream() { return c10_npu::getCurrentNPUStream().stream(true); }

GmAddress Gm(const at::Tensor& t) { return reinterpret_cast<GmAddress>(const_cast<void*>(t.data_ptr())); }

void CheckX(const at::Tensor& x, int64_t dim)
{
    TORCH_CHECK(x.device().type() == c10::DeviceType::PrivateUse1, "bitparity (ascend): x must be an NPU tensor");
    TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == dim && x.is_contiguous(),
                "bitparity (ascend): x must be a contiguous float32 tensor of dimension ", dim);
    TORCH_CHECK(x.numel() < (int64_t(1) << 32), "bitparity (ascend): fewer than 2**32 elements");
    TORCH_CHECK(dim == 1 || x.size(1) <= int64_t(bitparity::MAX_ROW), "bitparity (ascend): rows of at most ",
                bitparity::MAX_ROW, " floats");
}

GmAddress MaskAddress(const at::Tensor& x, const c10::optional<at::Tensor>& mask)
{
    if (!mask.has_value()) {
        return nullptr;
    }
    TORCH_CHECK(mask->scalar_type() == at::kBool && mask->sizes() == x.sizes() && mask->is_contiguous() &&
                    mask->device() == x.device(),
                "bitparity (ascend): mask must be a contiguous bool tensor shaped like x, on x's device");
    return Gm(*mask);
}

float Scale(double scale)
{
    // The contract passes attention's float32 scale as a Python float: exact in float.
    return static_cast<float>(scale);
}

// A contiguous per-row parameter tensor of x's rows, dtype and device.
void CheckRowParameter(const at::Tensor& t, const at::Tensor& x, at::ScalarType dtype, const char* name)
{
    TORCH_CHECK(t.scalar_type() == dtype && t.dim() == 1 && t.size(0) == x.size(0) && t.is_contiguous() &&
                    t.device() == x.device(),
                "bitparity (ascend): ", name, " must be a contiguous ", c10::toString(dtype),
                " tensor [rows] on x's device");
}

// The softmax family's scale: float32 [rows], each row's inverse temperature.
GmAddress RowScales(const at::Tensor& scale, const at::Tensor& x)
{
    CheckRowParameter(scale, x, at::kFloat, "scale");
    return Gm(scale);
}

// The RL ops' constants (gamma, clamps, ratio bounds, eps) are float32 values passed as
// Python floats, or +inf for an unset bound: exact in float.
float Float32(double value) { return static_cast<float>(value); }

void CheckLike(const at::Tensor& t, const at::Tensor& x, const char* name)
{
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.sizes() == x.sizes() && t.is_contiguous() && t.device() == x.device(),
                "bitparity (ascend): ", name, " must be a contiguous float32 tensor shaped like the first, on its device");
}

GmAddress RequiredMask(const at::Tensor& x, const at::Tensor& mask)
{
    return MaskAddress(x, c10::optional<at::Tensor>(mask));
}

uint32_t Tiles(int64_t n) { return Blocks((n + bitparity::LANES - 1) / bitparity::LANES); }

at::Tensor SumOp(const at::Tensor& x, const c10::optional<at::Tensor>& mask)
{
    const c10::DeviceGuard guard(x.device());
    CheckX(x, 2);
    const int64_t rows = x.size(0), cols = x.size(1);
    at::Tensor out = at::empty({rows}, x.options());
    BITPARITY_LAUNCH(bitparity_sum, Blocks(rows), Gm(x), MaskAddress(x, mask), Gm(out), rows, cols,
                     mask.has_value());
    return out;
}

at::Tensor LogsumexpOp(const at::Tensor& x, const c10::optional<at::Tensor>& mask, const at::Tensor& scale)
{
    const c10::DeviceGuard guard(x.device());
    CheckX(x, 2);
    const int64_t rows = x.size(0), cols = x.size(1);
    at::Tensor out = at::empty({rows}, x.options());
    BITPARITY_LAUNCH(bitparity_logsumexp, Blocks(rows), Gm(x), MaskAddress(x, mask), RowScales(scale, x), Gm(out), rows,
                     cols, mask.has_value());
    return out;
}

at::Tensor LogSoftmaxOp(const at::Tensor& x, const c10::optional<at::Tensor>& mask, const at::Tensor& scale)
{
    const c10::DeviceGuard guard(x.device());
    CheckX(x, 2);
    const int64_t rows = x.size(0), cols = x.size(1);
    at::Tensor out = at::empty_like(x);
    BITPARITY_LAUNCH(bitparity_log_softmax, Blocks(rows), Gm(x), MaskAddress(x, mask), RowScales(scale, x), Gm(out),
                     rows, cols, mask.has_value());
    return out;
}

at::Tensor SoftmaxOp(const at::Tensor& x, const c10::optional<at::Tensor>& mask, const at::Tensor& scale)
{
    const c10::DeviceGuard guard(x.device());
    CheckX(x, 2);
    const int64_t rows = x.size(0), cols = x.size(1);
    at::Tensor out = at::empty_like(x);
    BITPARITY_LAUNCH(bitparity_softmax, Blocks(rows), Gm(x), MaskAddress(x, mask), RowScales(scale, x), Gm(out), rows,
                     cols, mask.has_value());
    return out;
}

at::Tensor EntropyOp(const at::Tensor& x, const c10::optional<at::Tensor>& mask, const at::Tensor& scale)
{
    const c10::DeviceGuard guard(x.device());
    CheckX(x, 2);
    const int64_t rows = x.size(0), cols = x.size(1);
    at::Tensor out = at::empty({rows}, x.options());
    BITPARITY_LAUNCH(bitparity_entropy, Blocks(rows), Gm(x), MaskAddress(x, mask), RowScales(scale, x), Gm(out), rows,
                     cols, mask.has_value());
    return out;
}

at::Tensor TokenLogprobsOp(const at::Tensor& x, const at::Tensor& tokens, const at::Tensor& scale)
{
    const c10::DeviceGuard guard(x.device());
    CheckX(x, 2);
    const int64_t rows = x.size(0), cols = x.size(1);
    TORCH_CHECK(tokens.scalar_type() == at::kLong && tokens.dim() == 1 && tokens.size(0) == rows &&
                    tokens.is_contiguous() && tokens.device() == x.device(),
                "bitparity (ascend): tokens must be a contiguous int64 tensor [rows] on x's device");
    at::Tensor out = at::empty({rows}, x.options());
    BITPARITY_LAUNCH(bitparity_token_logprobs, Blocks(rows), Gm(x), Gm(tokens), RowScales(scale, x), Gm(out), rows,
                     cols);
    return out;
}

at::Tensor ExpOp(const at::Tensor& x)
{
    const c10::DeviceGuard guard(x.device());
    CheckX(x, 1);
    at::Tensor out = at::empty_like(x);
    const int64_t n = x.numel();
    BITPARITY_LAUNCH(bitparity_exp, Tiles(n), Gm(x), Gm(out), n);
    return out;
}

at::Tensor LogOp(const at::Tensor& x)
{
    const c10::DeviceGuard guard(x.device());
    CheckX(x, 1);
    at::Tensor out = at::empty_like(x);
    const int64_t n = x.numel();
    BITPARITY_LAUNCH(bitparity_log, Tiles(n), Gm(x), Gm(out), n);
    return out;
}

at::Tensor MaskedMeanOp(const at::Tensor& x, const c10::optional<at::Tensor>& mask)
{
    const c10::DeviceGuard guard(x.device());
    CheckX(x, 2);
    const int64_t rows = x.size(0), cols = x.size(1);
    at::Tensor out = at::empty({rows}, x.options());
    BITPARITY_LAUNCH(bitparity_masked_mean, Blocks(rows), Gm(x), MaskAddress(x, mask), Gm(out), rows, cols,
                     mask.has_value());
    return out;
}

// eps_mode as kernels/masked.cpp's EpsMode code: 0 "add", 1 "clamp".
void CheckEpsMode(int64_t epsMode)
{
    TORCH_CHECK(epsMode == 0 || epsMode == 1, "bitparity (ascend): eps_mode is an EpsMode code (kernels/masked.cpp)");
}

at::Tensor MaskedWhitenOp(const at::Tensor& x, const at::Tensor& mask, bool shiftMean, bool unbiased, double eps,
                          int64_t epsMode)
{
    const c10::DeviceGuard guard(x.device());
    CheckX(x, 2);
    CheckEpsMode(epsMode);
    const int64_t rows = x.size(0), cols = x.size(1);
    at::Tensor out = at::empty_like(x);
    BITPARITY_LAUNCH(bitparity_masked_whiten, Blocks(rows), Gm(x), RequiredMask(x, mask), Gm(out), rows, cols,
                     shiftMean, unbiased, Float32(eps), static_cast<uint32_t>(epsMode));
    return out;
}

at::Tensor KlPenaltyOp(const at::Tensor& logp, const at::Tensor& refLogp, int64_t kind, double clamp,
                       double logRatioClamp)
{
    const c10::DeviceGuard guard(logp.device());
    CheckX(logp, 1);
    CheckLike(refLogp, logp, "ref_logp");
    TORCH_CHECK(kind >= 0 && kind <= 3, "bitparity (ascend): kind is a KlKind code (kernels/kl.cpp)");
    at::Tensor out = at::empty_like(logp);
    const int64_t n = logp.numel();
    BITPARITY_LAUNCH(bitparity_kl_penalty, Tiles(n), Gm(logp), Gm(refLogp), Gm(out), n, kind, Float32(clamp),
                     Float32(logRatioClamp));
    return out;
}

std::tuple<at::Tensor, at::Tensor> GaeOp(const at::Tensor& rewards, const at::Tensor& values, const at::Tensor& mask,
                                         const at::Tensor& bootstrap, double gamma, double gammaLambda, bool zeroMode)
{
    const c10::DeviceGuard guard(rewards.device());
    CheckX(rewards, 2);
    CheckLike(values, rewards, "values");
    const int64_t rows = rewards.size(0), cols = rewards.size(1);
    TORCH_CHECK(bootstrap.scalar_type() == at::kFloat && bootstrap.dim() == 1 && bootstrap.size(0) == rows &&
                    bootstrap.is_contiguous() && bootstrap.device() == rewards.device(),
                "bitparity (ascend): bootstrap must be a contiguous float32 tensor [rows] on rewards' device");
    at::Tensor adv = at::empty_like(rewards);
    at::Tensor ret = at::empty_like(rewards);
    BITPARITY_LAUNCH(bitparity_gae, Blocks(rows), Gm(rewards), Gm(values), RequiredMask(rewards, mask),
                     Gm(bootstrap), Gm(adv), Gm(ret), rows, cols, Float32(gamma),
                     Float32(gammaLambda), zeroMode);
    return {adv, ret};
}

std::tuple<at::Tensor, at::Tensor> PpoTokenLossesOp(const at::Tensor& logp, const at::Tensor& oldLogp,
                                                    const at::Tensor& advantages, double ratioLow, double ratioHigh,
                                                    double dualClip, double ratioClamp)
{
    const c10::DeviceGuard guard(logp.device());
    CheckX(logp, 2);
    CheckLike(oldLogp, logp, "old_logp");
    CheckLike(advantages, logp, "advantages");
    at::Tensor loss = at::empty_like(logp);
    at::Tensor clipped = at::empty_like(logp);
    const int64_t n = logp.numel();
    BITPARITY_LAUNCH(bitparity_ppo_token_losses, Tiles(n), Gm(logp), Gm(oldLogp), Gm(advantages), Gm(loss),
                     Gm(clipped), n, Float32(ratioLow), Float32(ratioHigh),
                     Float32(dualClip), Float32(ratioClamp));
    return {loss, clipped};
}

at::Tensor PhiloxOp(const at::Tensor& counters, const at::Tensor& keys)
{
    const c10::DeviceGuard guard(counters.device());
    TORCH_CHECK(counters.device().type() == c10::DeviceType::PrivateUse1 && counters.scalar_type() == at::kInt &&
                    counters.dim() == 2 && counters.size(1) == 4 && counters.is_contiguous(),
                "bitparity (ascend): counters must be a contiguous int32 NPU tensor [n, 4] of uint32 words");
    TORCH_CHECK(keys.scalar_type() == at::kInt && keys.dim() == 2 && keys.size(0) == counters.size(0) &&
                    keys.size(1) == 2 && keys.is_contiguous() && keys.device() == counters.device(),
                "bitparity (ascend): keys must be a contiguous int32 tensor [n, 2] on the counters' device");
    TORCH_CHECK(counters.numel() < (int64_t(1) << 32), "bitparity (ascend): fewer than 2**32 counter words");
    const int64_t n = counters.size(0);
    at::Tensor out = at::empty_like(counters);
    BITPARITY_LAUNCH(bitparity_philox, Blocks((n + bitparity::PHILOX_TILE - 1) / bitparity::PHILOX_TILE),
                     Gm(counters), Gm(keys), Gm(out), n);
    return out;
}

std::tuple<at::Tensor, at::Tensor> TopkOp(const at::Tensor& x, int64_t k)
{
    const c10::DeviceGuard guard(x.device());
    CheckX(x, 2);
    const int64_t rows = x.size(0), cols = x.size(1);
    TORCH_CHECK(k >= 1 && k <= cols, "bitparity (ascend): k must be in [1, ", cols, "], got ", k);
    at::Tensor values = at::empty({rows, k}, x.options());
    at::Tensor indices = at::empty({rows, k}, x.options().dtype(at::kLong));
    BITPARITY_LAUNCH(bitparity_topk, Blocks(rows), Gm(x), Gm(values), Gm(indices), rows, cols, k);
    return {values, indices};
}

// x and the per-row filter parameters of filter_logits and sample (the backend contract's dtypes).
void CheckFilterParameters(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& topK, const at::Tensor& topP,
                           const at::Tensor& minP)
{
    CheckX(x, 2);
    CheckRowParameter(scale, x, at::kFloat, "scale");
    CheckRowParameter(topK, x, at::kLong, "top_k");
    CheckRowParameter(topP, x, at::kFloat, "top_p");
    CheckRowParameter(minP, x, at::kFloat, "min_p");
}

at::Tensor FilterLogitsOp(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& topK,
                          const at::Tensor& topP, const at::Tensor& minP)
{
    const c10::DeviceGuard guard(x.device());
    CheckFilterParameters(x, scale, topK, topP, minP);
    const int64_t rows = x.size(0), cols = x.size(1);
    at::Tensor out = at::empty_like(x);
    BITPARITY_LAUNCH(bitparity_filter_logits, Blocks(rows), Gm(x), Gm(scale), Gm(topK), Gm(topP), Gm(minP),
                     Gm(out), rows, cols);
    return out;
}

at::Tensor SampleOp(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& topK, const at::Tensor& topP,
                    const at::Tensor& minP, const at::Tensor& greedy, const at::Tensor& seeds,
                    const at::Tensor& positions)
{
    const c10::DeviceGuard guard(x.device());
    CheckFilterParameters(x, scale, topK, topP, minP);
    CheckRowParameter(greedy, x, at::kBool, "greedy");
    CheckRowParameter(seeds, x, at::kLong, "seeds");
    CheckRowParameter(positions, x, at::kLong, "positions");
    const int64_t rows = x.size(0), cols = x.size(1);
    at::Tensor tokens = at::empty({rows}, x.options().dtype(at::kLong));
    BITPARITY_LAUNCH(bitparity_sample, Blocks(rows), Gm(x), Gm(scale), Gm(topK), Gm(topP), Gm(minP), Gm(greedy),
                     Gm(seeds), Gm(positions), Gm(tokens), rows, cols);
    return tokens;
}

// A contiguous float32 tensor of the given sizes on x's device.
void CheckShaped(const at::Tensor& t, const at::Tensor& x, at::IntArrayRef sizes, const char* name)
{
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.sizes() == sizes && t.is_contiguous() && t.device() == x.device(),
                "bitparity (ascend): ", name, " must be a contiguous float32 tensor of sizes ", sizes,
                " on x's device");
}

// linear (spec 24.1): kernels/linear.cpp's four launches in order on the stream, as the emulation's bp_linear:
// x's rows and the weight's rows to int8 digits (rows padded to 16, K to 32), the Cube unit's digit products
// (int32 partials per chunk of LINEAR_CHUNK_K terms and digit weight), the rounding and the bias.  The
// workspaces are NPU tensors of this call.  Each kernel spreads its items over the cores it is given; the count
// changes no bit.
// Balanced int8 digits of x's and the weight's quantised values (kernels/linear.cpp, spec_constants.h).
constexpr int64_t LINEAR_DIGITS_X = (bitparity::LINEAR_BX + 8) / 8;
constexpr int64_t LINEAR_DIGITS_W = (bitparity::LINEAR_BW + 8) / 8;
constexpr int64_t LINEAR_DIAGONALS = LINEAR_DIGITS_X + LINEAR_DIGITS_W - 1;
constexpr int64_t LINEAR_CHUNK_K = 8192;

at::Tensor LinearOp(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias)
{
    const c10::DeviceGuard guard(x.device());
    TORCH_CHECK(x.device().type() == c10::DeviceType::PrivateUse1, "bitparity (ascend): x must be an NPU tensor");
    TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(),
                "bitparity (ascend): x must be a contiguous float32 tensor [M, K]");
    const int64_t m = x.size(0), k = x.size(1);
    TORCH_CHECK(weight.dim() == 2, "bitparity (ascend): weight must be [N, K]");
    const int64_t n = weight.size(0);
    CheckShaped(weight, x, {n, k}, "weight");
    if (bias.has_value()) {
        CheckShaped(*bias, x, {n}, "bias");
    }
    const int64_t mPad = (m + 15) / 16 * 16, nPad = (n + 15) / 16 * 16, kPad = (k + 31) / 32 * 32;
    const int64_t chunks = (kPad + LINEAR_CHUNK_K - 1) / LINEAR_CHUNK_K;
    TORCH_CHECK(std::max(mPad, nPad) * kPad * LINEAR_DIGITS_X < (int64_t(1) << 32) &&
                    chunks * LINEAR_DIAGONALS * mPad * nPad < (int64_t(1) << 32),
                "bitparity (ascend): linear's operands and partials must have fewer than 2**32 elements");
    const at::TensorOptions bytes = x.options().dtype(at::kChar), words = x.options().dtype(at::kInt);
    at::Tensor digitsX = at::empty({LINEAR_DIGITS_X * mPad * kPad}, bytes);
    at::Tensor digitsW = at::empty({LINEAR_DIGITS_W * nPad * kPad}, bytes);
    at::Tensor metaX = at::empty({mPad, 8}, words);
    at::Tensor metaW = at::empty({nPad, 8}, words);
    at::Tensor partials = at::empty({chunks, LINEAR_DIAGONALS, mPad, nPad}, words);
    at::Tensor out = at::empty({m, n}, x.options());
    const uint32_t blocks = Blocks(std::max(mPad, nPad));
    BITPARITY_LAUNCH(bitparity_linear_quantise, blocks, Gm(x), Gm(digitsX), Gm(metaX), m, k, mPad, kPad, 0);
    BITPARITY_LAUNCH(bitparity_linear_quantise, blocks, Gm(weight), Gm(digitsW), Gm(metaW), n, k, nPad, kPad, 1);
    BITPARITY_LAUNCH(bitparity_linear_digits, blocks, Gm(digitsX), Gm(digitsW), Gm(partials), mPad, nPad, kPad);
    BITPARITY_LAUNCH(bitparity_linear_round, blocks, Gm(partials), Gm(metaX), Gm(metaW), Gm(x), Gm(weight),
                     bias.has_value() ? Gm(*bias) : nullptr, Gm(out), m, n, k, mPad, nPad, bias.has_value());
    return out;
}

// The tensor-parallel linear's exact partial (spec 31.1): LinearOp's first three launches, without the rounding.
// Returns the Cube unit's int32 partials [chunks, 8, mPad, nPad]; ascend/__init__.py adds the chunks in int64 and
// carries the diagonals into two limbs, as for the emulation's bp_linear_exact.
at::Tensor LinearExactOp(const at::Tensor& x, const at::Tensor& weight)
{
    const c10::DeviceGuard guard(x.device());
    TORCH_CHECK(x.device().type() == c10::DeviceType::PrivateUse1, "bitparity (ascend): x must be an NPU tensor");
    TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(),
                "bitparity (ascend): x must be a contiguous float32 tensor [M, K]");
    const int64_t m = x.size(0), k = x.size(1);
    TORCH_CHECK(weight.dim() == 2, "bitparity (ascend): weight must be [N, K]");
    const int64_t n = weight.size(0);
    CheckShaped(weight, x, {n, k}, "weight");
    const int64_t mPad = (m + 15) / 16 * 16, nPad = (n + 15) / 16 * 16, kPad = (k + 31) / 32 * 32;
    const int64_t chunks = (kPad + LINEAR_CHUNK_K - 1) / LINEAR_CHUNK_K;
    TORCH_CHECK(std::max(mPad, nPad) * kPad * LINEAR_DIGITS_X < (int64_t(1) << 32) &&
                    chunks * LINEAR_DIAGONALS * mPad * nPad < (int64_t(1) << 32),
                "bitparity (ascend): linear's operands and partials must have fewer than 2**32 elements");
    const at::TensorOptions bytes = x.options().dtype(at::kChar), words = x.options().dtype(at::kInt);
    at::Tensor digitsX = at::empty({LINEAR_DIGITS_X * mPad * kPad}, bytes);
    at::Tensor digitsW = at::empty({LINEAR_DIGITS_W * nPad * kPad}, bytes);
    at::Tensor metaX = at::empty({mPad, 8}, words);
    at::Tensor metaW = at::empty({nPad, 8}, words);
    at::Tensor partials = at::empty({chunks, LINEAR_DIAGONALS, mPad, nPad}, words);
    const uint32_t blocks = Blocks(std::max(mPad, nPad));
    BITPARITY_LAUNCH(bitparity_linear_quantise, blocks, Gm(x), Gm(digitsX), Gm(metaX), m, k, mPad, kPad, 0);
    BITPARITY_LAUNCH(bitparity_linear_quantise, blocks, Gm(weight), Gm(digitsW), Gm(metaW), n, k, nPad, kPad, 1);
    BITPARITY_LAUNCH(bitparity_linear_digits, blocks, Gm(digitsX), Gm(digitsW), Gm(partials), mPad, nPad, kPad);
    return partials;
}

at::Tensor RmsNormOp(const at::Tensor& x, const at::Tensor& weight, double eps)
{
    const c10::DeviceGuard guard(x.device());
    CheckX(x, 2);
    const int64_t rows = x.size(0), cols = x.size(1);
    CheckShaped(weight, x, {cols}, "weight");
    at::Tensor out = at::empty_like(x);
    BITPARITY_LAUNCH(bitparity_rms_norm, Blocks(rows), Gm(x), Gm(weight), Gm(out), rows, cols, Float32(eps));
    return out;
}

at::Tensor RotaryOp(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin)
{
    const c10::DeviceGuard guard(x.device());
    CheckX(x, 2);
    const int64_t rows = x.size(0), cols = x.size(1);
    TORCH_CHECK(cols % 2 == 0, "bitparity (ascend): rotary needs an even row length");
    CheckShaped(cos, x, {rows, cols / 2}, "cos");
    CheckShaped(sin, x, {rows, cols / 2}, "sin");
    at::Tensor out = at::empty_like(x);
    BITPARITY_LAUNCH(bitparity_rotary, Blocks(rows), Gm(x), Gm(cos), Gm(sin), Gm(out), rows, cols);
    return out;
}

// The kernel reads k as [G, D, Tk]: the transpose is a copy on the NPU (no arithmetic).
at::Tensor AttentionOp(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& kvLengths,
                       bool causal, double scale)
{
    const c10::DeviceGuard guard(q.device());
    CheckX(q, 3);
    const int64_t groups = q.size(0), tq = q.size(1), d = q.size(2);
    TORCH_CHECK(k.dim() == 3, "bitparity (ascend): k must be [G, Tk, D]");
    const int64_t tk = k.size(1);
    CheckShaped(k, q, {groups, tk, d}, "k");
    CheckShaped(v, q, {groups, tk, d}, "v");
    TORCH_CHECK(tk <= int64_t(bitparity::ATTENTION_MAX_KEYS) && d <= int64_t(bitparity::ATTENTION_MAX_DIM),
                "bitparity (ascend): attention takes at most ", bitparity::ATTENTION_MAX_KEYS, " keys (",
                bitparity::ATTENTION_MAX_SEGMENTS, " segments: one partial row each in UB) and head dimensions of "
                "at most ", bitparity::ATTENTION_MAX_DIM, "; got Tk = ", tk, ", D = ", d);
    TORCH_CHECK(!causal || tq <= tk, "bitparity (ascend): causal attention needs Tq <= Tk");
    TORCH_CHECK(groups * std::max(tq, tk) * d < (int64_t(1) << 32), "bitparity (ascend): fewer than 2**32 elements");
    CheckRowParameter(kvLengths, q, at::kLong, "kv_lengths");
    at::Tensor kT = k.transpose(1, 2).contiguous();
    at::Tensor out = at::empty_like(q);
    BITPARITY_LAUNCH(bitparity_attention, Blocks(groups * tq), Gm(q), Gm(kT), Gm(v), Gm(kvLengths), Gm(out), groups,
                     tq, tk, d, causal, Scale(scale));
    return out;
}

at::Tensor SiluMulOp(const at::Tensor& gate, const at::Tensor& up)
{
    const c10::DeviceGuard guard(gate.device());
    CheckX(gate, 1);
    CheckLike(up, gate, "up");
    at::Tensor out = at::empty_like(gate);
    const int64_t n = gate.numel();
    BITPARITY_LAUNCH(bitparity_silu_mul, Tiles(n), Gm(gate), Gm(up), Gm(out), n);
    return out;
}

// ---- Backward (spec 26) --------------------------------------------------------------

// The contract's per-row g (and entropy's h) of the softmax family: float32 [rows] on x's device.
at::Tensor LogsumexpBackwardOp(const at::Tensor& x, const c10::optional<at::Tensor>& mask, const at::Tensor& scale,
                               const at::Tensor& g)
{
    const c10::DeviceGuard guard(x.device());
    CheckX(x, 2);
    const int64_t rows = x.size(0), cols = x.size(1);
    CheckShaped(g, x, {rows}, "g");
    at::Tensor out = at::empty_like(x);
    BITPARITY_LAUNCH(bitparity_logsumexp_backward, Blocks(rows), Gm(x), MaskAddress(x, mask), RowScales(scale, x),
                     Gm(g), Gm(out), rows, cols, mask.has_value());
    return out;
}

// y: the forward's output; g shaped like it.
at::Tensor LogSoftmaxBackwardOp(const at::Tensor& y, const c10::optional<at::Tensor>& mask, const at::Tensor& scale,
                                const at::Tensor& g)
{
    const c10::DeviceGuard guard(y.device());
    CheckX(y, 2);
    CheckLike(g, y, "g");
    const int64_t rows = y.size(0), cols = y.size(1);
    at::Tensor out = at::empty_like(y);
    BITPARITY_LAUNCH(bitparity_log_softmax_backward, Blocks(rows), Gm(y), MaskAddress(y, mask), RowScales(scale, y),
                     Gm(g), Gm(out), rows, cols, mask.has_value());
    return out;
}

// p: the forward's output; g shaped like it.
at::Tensor SoftmaxBackwardOp(const at::Tensor& p, const c10::optional<at::Tensor>& mask, const at::Tensor& scale,
                             const at::Tensor& g)
{
    const c10::DeviceGuard guard(p.device());
    CheckX(p, 2);
    CheckLike(g, p, "g");
    const int64_t rows = p.size(0), cols = p.size(1);
    at::Tensor out = at::empty_like(p);
    BITPARITY_LAUNCH(bitparity_softmax_backward, Blocks(rows), Gm(p), MaskAddress(p, mask), RowScales(scale, p),
                     Gm(g), Gm(out), rows, cols, mask.has_value());
    return out;
}

at::Tensor EntropyBackwardOp(const at::Tensor& x, const c10::optional<at::Tensor>& mask, const at::Tensor& scale,
                             const at::Tensor& h, const at::Tensor& g)
{
    const c10::DeviceGuard guard(x.device());
    CheckX(x, 2);
    const int64_t rows = x.size(0), cols = x.size(1);
    CheckShaped(h, x, {rows}, "h");
    CheckShaped(g, x, {rows}, "g");
    at::Tensor out = at::empty_like(x);
    BITPARITY_LAUNCH(bitparity_entropy_backward, Blocks(rows), Gm(x), MaskAddress(x, mask), RowScales(scale, x),
                     Gm(h), Gm(g), Gm(out), rows, cols, mask.has_value());
    return out;
}

at::Tensor TokenLogprobsBackwardOp(const at::Tensor& x, const at::Tensor& tokens, const at::Tensor& scale,
                                   const at::Tensor& g)
{
    const c10::DeviceGuard guard(x.device());
    CheckX(x, 2);
    const int64_t rows = x.size(0), cols = x.size(1);
    CheckRowParameter(tokens, x, at::kLong, "tokens");
    CheckShaped(g, x, {rows}, "g");
    at::Tensor out = at::empty_like(x);
    BITPARITY_LAUNCH(bitparity_token_logprobs_backward, Blocks(rows), Gm(x), Gm(tokens), RowScales(scale, x), Gm(g),
                     Gm(out), rows, cols);
    return out;
}

// mask: bool [rows, cols], the only input shaped like the result; g: float32 [rows].
at::Tensor MaskedMeanBackwardOp(const at::Tensor& mask, const at::Tensor& g)
{
    const c10::DeviceGuard guard(mask.device());
    TORCH_CHECK(mask.device().type() == c10::DeviceType::PrivateUse1 && mask.scalar_type() == at::kBool &&
                    mask.dim() == 2 && mask.is_contiguous(),
                "bitparity (ascend): mask must be a contiguous bool NPU tensor [rows, cols]");
    TORCH_CHECK(mask.numel() < (int64_t(1) << 32), "bitparity (ascend): fewer than 2**32 elements");
    TORCH_CHECK(mask.size(1) <= int64_t(bitparity::MAX_ROW), "bitparity (ascend): rows of at most ",
                bitparity::MAX_ROW, " floats");
    const int64_t rows = mask.size(0), cols = mask.size(1);
    CheckShaped(g, mask, {rows}, "g");
    at::Tensor out = at::empty(mask.sizes(), mask.options().dtype(at::kFloat));
    BITPARITY_LAUNCH(bitparity_masked_mean_backward, Blocks(rows), Gm(mask), Gm(g), Gm(out), rows, cols);
    return out;
}

at::Tensor MaskedWhitenBackwardOp(const at::Tensor& x, const at::Tensor& mask, bool shiftMean, bool unbiased,
                                  double eps, int64_t epsMode, const at::Tensor& g)
{
    const c10::DeviceGuard guard(x.device());
    CheckX(x, 2);
    CheckEpsMode(epsMode);
    CheckLike(g, x, "g");
    const int64_t rows = x.size(0), cols = x.size(1);
    at::Tensor out = at::empty_like(x);
    BITPARITY_LAUNCH(bitparity_masked_whiten_backward, Blocks(rows), Gm(x), RequiredMask(x, mask), Gm(g), Gm(out),
                     rows, cols, shiftMean, unbiased, Float32(eps), static_cast<uint32_t>(epsMode));
    return out;
}

// The gradient w.r.t. ref_logp; the backend flips its sign for logp.
at::Tensor KlPenaltyBackwardOp(const at::Tensor& logp, const at::Tensor& refLogp, int64_t kind, double clamp,
                               double logRatioClamp, const at::Tensor& g)
{
    const c10::DeviceGuard guard(logp.device());
    CheckX(logp, 1);
    CheckLike(refLogp, logp, "ref_logp");
    CheckLike(g, logp, "g");
    TORCH_CHECK(kind >= 0 && kind <= 3, "bitparity (ascend): kind is a KlKind code (kernels/kl.cpp)");
    at::Tensor out = at::empty_like(logp);
    const int64_t n = logp.numel();
    BITPARITY_LAUNCH(bitparity_kl_penalty_backward, Tiles(n), Gm(logp), Gm(refLogp), Gm(g), Gm(out), n, kind,
                     Float32(clamp), Float32(logRatioClamp));
    return out;
}

// Two launches on the stream, in order: the per-sequence token weights (one core for token-mean, which
// counts the whole mask), then the per-token gradient w.r.t. logp.  g: the loss's gradient, float32 [1].
at::Tensor PpoPolicyLossBackwardOp(const at::Tensor& logp, const at::Tensor& oldLogp, const at::Tensor& advantages,
                                   const at::Tensor& mask, double ratioLow, double ratioHigh, double dualClip,
                                   double ratioClamp, int64_t agg, const at::Tensor& g)
{
    const c10::DeviceGuard guard(logp.device());
    CheckX(logp, 2);
    CheckLike(oldLogp, logp, "old_logp");
    CheckLike(advantages, logp, "advantages");
    CheckShaped(g, logp, {1}, "g");
    TORCH_CHECK(agg >= 0 && agg <= 3, "bitparity (ascend): agg is a PpoAgg code (kernels/ppo.cpp)");
    const int64_t rows = logp.size(0), cols = logp.size(1);
    const int64_t longest = agg == 0 ? rows * cols : std::max(rows, cols);
    TORCH_CHECK(longest <= int64_t(bitparity::MAX_ROW), "bitparity (ascend): rows of at most ", bitparity::MAX_ROW,
                " floats (the PPO mean runs over all B * T tokens for token-mean, over B sequences otherwise)");
    at::Tensor weights = at::empty({rows}, logp.options());
    at::Tensor out = at::empty_like(logp);
    BITPARITY_LAUNCH(bitparity_ppo_token_weights, agg == 0 ? 1u : Blocks(rows), RequiredMask(logp, mask), Gm(g),
                     Gm(weights), rows, cols, agg);
    BITPARITY_LAUNCH(bitparity_ppo_policy_loss_backward, Blocks(rows), Gm(logp), Gm(oldLogp), Gm(advantages),
                     RequiredMask(logp, mask), Gm(weights), Gm(out), rows, cols, Float32(ratioLow),
                     Float32(ratioHigh), Float32(dualClip), Float32(ratioClamp));
    return out;
}

// ---- Training (spec 29) --------------------------------------------------------------

// A contiguous float32 NPU tensor of dimension 2 and fewer than 2**32 elements, rows of any length (the row fold
// and the weight gradient tile their columns).
void CheckMatrix(const at::Tensor& t, const char* name)
{
    TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1 && t.scalar_type() == at::kFloat && t.dim() == 2 &&
                    t.is_contiguous(),
                "bitparity (ascend): ", name, " must be a contiguous float32 NPU tensor of dimension 2");
    TORCH_CHECK(t.numel() < (int64_t(1) << 32), "bitparity (ascend): fewer than 2**32 elements");
}

// A contiguous int64 tensor [size] on x's device.
void CheckIndices(const at::Tensor& t, const at::Tensor& x, int64_t size, const char* name)
{
    TORCH_CHECK(t.scalar_type() == at::kLong && t.dim() == 1 && t.size(0) == size && t.is_contiguous() &&
                    t.device() == x.device(),
                "bitparity (ascend): ", name, " must be a contiguous int64 tensor [", size, "] on x's device");
}

void CheckFoldRows(int64_t rows)
{
    TORCH_CHECK(rows >= 0 && rows <= int64_t(bitparity::MAX_ROW), "bitparity (ascend): a row fold over at most ",
                bitparity::MAX_ROW, " rows (row_fold.h keeps at most ", bitparity::FOLD_MAX_DEPTH,
                " subtrees in UB); got ", rows);
}

// order, positions: the rows of c in (segment, position) order and their positions; starts [segments + 1]: where
// each segment's rows start (the backend's sorts, ascend/__init__.py).
at::Tensor FoldRowsOp(const at::Tensor& c, const at::Tensor& order, const at::Tensor& positions,
                      const at::Tensor& starts, int64_t rows)
{
    const c10::DeviceGuard guard(c.device());
    CheckMatrix(c, "c");
    CheckFoldRows(rows);
    const int64_t m = c.size(0), f = c.size(1);
    CheckIndices(order, c, m, "order");
    CheckIndices(positions, c, m, "positions");
    TORCH_CHECK(starts.dim() == 1 && starts.size(0) >= 1, "bitparity (ascend): starts must be [segments + 1]");
    const int64_t segments = starts.size(0) - 1;
    CheckIndices(starts, c, segments + 1, "starts");
    TORCH_CHECK(segments * f < (int64_t(1) << 32), "bitparity (ascend): fewer than 2**32 elements");
    at::Tensor out = at::empty({segments, f}, c.options());
    const int64_t tiles = (f + 1023) / 1024;   // row_fold.h's FOLD_TILE_FLOATS columns per tile
    BITPARITY_LAUNCH(bitparity_fold_rows, Blocks(segments * tiles), Gm(c), Gm(order), Gm(positions), Gm(starts),
                     Gm(out), m, f, segments, rows);
    return out;
}

std::tuple<at::Tensor, at::Tensor> RmsNormBackwardOp(const at::Tensor& x, const at::Tensor& weight, double eps,
                                                     const at::Tensor& g)
{
    const c10::DeviceGuard guard(x.device());
    CheckX(x, 2);
    const int64_t rows = x.size(0), cols = x.size(1);
    CheckShaped(weight, x, {cols}, "weight");
    CheckLike(g, x, "g");
    at::Tensor dx = at::empty_like(x);
    at::Tensor terms = at::empty_like(x);
    BITPARITY_LAUNCH(bitparity_rms_norm_backward, Blocks(rows), Gm(x), Gm(weight), Gm(g), Gm(dx), Gm(terms), rows,
                     cols, Float32(eps));
    return {dx, terms};
}

std::tuple<at::Tensor, at::Tensor> SiluMulBackwardOp(const at::Tensor& gate, const at::Tensor& up,
                                                     const at::Tensor& g)
{
    const c10::DeviceGuard guard(gate.device());
    CheckX(gate, 1);
    CheckLike(up, gate, "up");
    CheckLike(g, gate, "g");
    at::Tensor dGate = at::empty_like(gate);
    at::Tensor dUp = at::empty_like(gate);
    const int64_t n = gate.numel();
    BITPARITY_LAUNCH(bitparity_silu_mul_backward, Tiles(n), Gm(gate), Gm(up), Gm(g), Gm(dGate), Gm(dUp), n);
    return {dGate, dUp};
}

// Two launches on the stream, in order: per query, dq and the statistics (shift, recip, G) into a workspace; then
// per key, dk and dv.  The kernels read k and v also as [G, D, Tk], q and g also as [G, D, Tq]: the transposes are
// copies on the NPU (no arithmetic).
std::tuple<at::Tensor, at::Tensor, at::Tensor> AttentionBackwardOp(const at::Tensor& q, const at::Tensor& k,
                                                                   const at::Tensor& v, const at::Tensor& kvLengths,
                                                                   bool causal, double scale, const at::Tensor& g)
{
    const c10::DeviceGuard guard(q.device());
    CheckX(q, 3);
    const int64_t groups = q.size(0), tq = q.size(1), d = q.size(2);
    TORCH_CHECK(k.dim() == 3, "bitparity (ascend): k must be [G, Tk, D]");
    const int64_t tk = k.size(1);
    CheckShaped(k, q, {groups, tk, d}, "k");
    CheckShaped(v, q, {groups, tk, d}, "v");
    CheckLike(g, q, "g");
    TORCH_CHECK(std::max(tq, tk) <= int64_t(bitparity::ATTENTION_MAX_KEYS) &&
                    d <= int64_t(bitparity::ATTENTION_MAX_DIM),
                "bitparity (ascend): the attention backward takes at most ", bitparity::ATTENTION_MAX_KEYS,
                " keys and queries (", bitparity::ATTENTION_MAX_SEGMENTS, " segments of either: one partial row each "
                "in UB) and head dimensions of at most ", bitparity::ATTENTION_MAX_DIM, "; got Tq = ", tq, ", Tk = ",
                tk, ", D = ", d);
    TORCH_CHECK(!causal || tq <= tk, "bitparity (ascend): causal attention needs Tq <= Tk");
    TORCH_CHECK(groups * std::max(tq, tk) * d < (int64_t(1) << 32), "bitparity (ascend): fewer than 2**32 elements");
    CheckRowParameter(kvLengths, q, at::kLong, "kv_lengths");
    at::Tensor kT = k.transpose(1, 2).contiguous();
    at::Tensor vT = v.transpose(1, 2).contiguous();
    at::Tensor qT = q.transpose(1, 2).contiguous();
    at::Tensor gT = g.transpose(1, 2).contiguous();
    at::Tensor stats = at::empty({3, groups * tq}, q.options());
    at::Tensor dq = at::empty_like(q);
    at::Tensor dk = at::empty_like(k);
    at::Tensor dv = at::empty_like(v);
    BITPARITY_LAUNCH(bitparity_attention_query_grad, Blocks(groups * tq), Gm(q), Gm(kT), Gm(k), Gm(vT), Gm(g),
                     Gm(kvLengths), Gm(dq), Gm(stats), groups, tq, tk, d, causal, Scale(scale));
    BITPARITY_LAUNCH(bitparity_attention_backward, Blocks(groups * tk), Gm(q), Gm(qT), Gm(k), Gm(v), Gm(g), Gm(gT),
                     Gm(kvLengths), Gm(stats), Gm(dk), Gm(dv), groups, tq, tk, d, causal, Scale(scale));
    return {dq, dk, dv};
}

// decay: None without weight decay.  The constants are float32 values passed as Python floats: exact in float.
std::tuple<at::Tensor, at::Tensor, at::Tensor> AdamwStepOp(const at::Tensor& w, const at::Tensor& g,
                                                           const at::Tensor& m, const at::Tensor& v,
                                                           c10::optional<double> decay, double b1, double c1,
                                                           double b2, double c2, double ibc2, double eps,
                                                           double step)
{
    const c10::DeviceGuard guard(w.device());
    CheckX(w, 1);
    CheckLike(g, w, "g");
    CheckLike(m, w, "m");
    CheckLike(v, w, "v");
    at::Tensor wOut = at::empty_like(w);
    at::Tensor mOut = at::empty_like(w);
    at::Tensor vOut = at::empty_like(w);
    const int64_t n = w.numel();
    BITPARITY_LAUNCH(bitparity_adamw_step, Tiles(n), Gm(w), Gm(g), Gm(m), Gm(v), Gm(wOut), Gm(mOut), Gm(vOut), n,
                     decay.has_value(), Float32(decay.value_or(0.0)), Float32(b1), Float32(c1), Float32(b2),
                     Float32(c2), Float32(ibc2), Float32(eps), Float32(step));
    return {wOut, mOut, vOut};
}

// buf: None on the first step.  Returns (w, buf); without momentum the buffer is untouched and an empty tensor
// comes back in its place (the backend returns the caller's buf).
std::tuple<at::Tensor, at::Tensor> SgdStepOp(const at::Tensor& w, const at::Tensor& g,
                                             const c10::optional<at::Tensor>& buf, double lr, double momentum,
                                             double oneMinusDampening, double weightDecay, bool nesterov)
{
    const c10::DeviceGuard guard(w.device());
    CheckX(w, 1);
    CheckLike(g, w, "g");
    if (buf.has_value()) {
        CheckLike(*buf, w, "buf");
    }
    const bool withMomentum = Float32(momentum) != 0.0f;
    at::Tensor wOut = at::empty_like(w);
    at::Tensor bufOut = withMomentum ? at::empty_like(w) : at::empty({0}, w.options());
    const int64_t n = w.numel();
    BITPARITY_LAUNCH(bitparity_sgd_step, Tiles(n), Gm(w), Gm(g), buf.has_value() ? Gm(*buf) : nullptr, Gm(wOut),
                     withMomentum ? Gm(bufOut) : nullptr, n, Float32(lr), Float32(momentum),
                     Float32(oneMinusDampening), Float32(weightDecay), nesterov, buf.has_value());
    return {wOut, bufOut};
}

}  // namespace bitparity_npu

TORCH_LIBRARY(bitparity_ascend, m)
{
    m.def("sum(Tensor x, Tensor? mask) -> Tensor");
    m.def("logsumexp(Tensor x, Tensor? mask, Tensor scale) -> Tensor");
    m.def("log_softmax(Tensor x, Tensor? mask, Tensor scale) -> Tensor");
    m.def("softmax(Tensor x, Tensor? mask, Tensor scale) -> Tensor");
    m.def("entropy(Tensor x, Tensor? mask, Tensor scale) -> Tensor");
    m.def("token_logprobs(Tensor x, Tensor tokens, Tensor scale) -> Tensor");
    m.def("exp(Tensor x) -> Tensor");
    m.def("log(Tensor x) -> Tensor");
    m.def("masked_mean(Tensor x, Tensor? mask) -> Tensor");
    m.def("masked_whiten(Tensor x, Tensor mask, bool shift_mean, bool unbiased, float eps, int eps_mode) -> Tensor");
    m.def("kl_penalty(Tensor logp, Tensor ref_logp, int kind, float clamp, float log_ratio_clamp) -> Tensor");
    m.def("gae(Tensor rewards, Tensor values, Tensor mask, Tensor bootstrap, float gamma, float gamma_lambda, "
          "bool zero_mode) -> (Tensor, Tensor)");
    m.def("ppo_token_losses(Tensor logp, Tensor old_logp, Tensor advantages, float ratio_low, float ratio_high, "
          "float dual_clip, float ratio_clamp) -> (Tensor, Tensor)");
    m.def("philox(Tensor counters, Tensor keys) -> Tensor");      // uint32 words held in int32 tensors
    m.def("topk(Tensor x, int k) -> (Tensor, Tensor)");
    m.def("filter_logits(Tensor x, Tensor scale, Tensor top_k, Tensor top_p, Tensor min_p) -> Tensor");
    m.def("sample(Tensor x, Tensor scale, Tensor top_k, Tensor top_p, Tensor min_p, Tensor greedy, "
          "Tensor seeds, Tensor positions) -> Tensor");
    m.def("linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
    m.def("linear_exact(Tensor x, Tensor weight) -> Tensor");
    m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
    m.def("rotary(Tensor x, Tensor cos, Tensor sin) -> Tensor");
    m.def("attention(Tensor q, Tensor k, Tensor v, Tensor kv_lengths, bool causal, float scale) -> Tensor");
    m.def("silu_mul(Tensor gate, Tensor up) -> Tensor");
    // Backward (spec 26)
    m.def("logsumexp_backward(Tensor x, Tensor? mask, Tensor scale, Tensor g) -> Tensor");
    m.def("log_softmax_backward(Tensor y, Tensor? mask, Tensor scale, Tensor g) -> Tensor");
    m.def("softmax_backward(Tensor p, Tensor? mask, Tensor scale, Tensor g) -> Tensor");
    m.def("entropy_backward(Tensor x, Tensor? mask, Tensor scale, Tensor h, Tensor g) -> Tensor");
    m.def("token_logprobs_backward(Tensor x, Tensor tokens, Tensor scale, Tensor g) -> Tensor");
    m.def("masked_mean_backward(Tensor mask, Tensor g) -> Tensor");
    m.def("masked_whiten_backward(Tensor x, Tensor mask, bool shift_mean, bool unbiased, float eps, int eps_mode, "
          "Tensor g) -> Tensor");
    m.def("kl_penalty_backward(Tensor logp, Tensor ref_logp, int kind, float clamp, float log_ratio_clamp, "
          "Tensor g) -> Tensor");
    m.def("ppo_policy_loss_backward(Tensor logp, Tensor old_logp, Tensor advantages, Tensor mask, float ratio_low, "
          "float ratio_high, float dual_clip, float ratio_clamp, int agg, Tensor g) -> Tensor");
    // Training (spec 29)
    m.def("fold_rows(Tensor c, Tensor order, Tensor positions, Tensor starts, int rows) -> Tensor");
    m.def("rms_norm_backward(Tensor x, Tensor weight, float eps, Tensor g) -> (Tensor, Tensor)");
    m.def("silu_mul_backward(Tensor gate, Tensor up, Tensor g) -> (Tensor, Tensor)");
    m.def("attention_backward(Tensor q, Tensor k, Tensor v, Tensor kv_lengths, bool causal, float scale, Tensor g) "
          "-> (Tensor, Tensor, Tensor)");
    m.def("adamw_step(Tensor w, Tensor g, Tensor m, Tensor v, float? decay, float b1, float c1, float b2, float c2, "
          "float ibc2, float eps, float step) -> (Tensor, Tensor, Tensor)");
    m.def("sgd_step(Tensor w, Tensor g, Tensor? buf, float lr, float momentum, float one_minus_dampening, "
          "float weight_decay, bool nesterov) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(bitparity_ascend, PrivateUse1, m)
{
    m.impl("sum", TORCH_FN(bitparity_npu::SumOp));
    m.impl("logsumexp", TORCH_FN(bitparity_npu::LogsumexpOp));
    m.impl("log_softmax", TORCH_FN(bitparity_npu::LogSoftmaxOp));
    m.impl("softmax", TORCH_FN(bitparity_npu::SoftmaxOp));
    m.impl("entropy", TORCH_FN(bitparity_npu::EntropyOp));
    m.impl("token_logprobs", TORCH_FN(bitparity_npu::TokenLogprobsOp));
    m.impl("exp", TORCH_FN(bitparity_npu::ExpOp));
    m.impl("log", TORCH_FN(bitparity_npu::LogOp));
    m.impl("masked_mean", TORCH_FN(bitparity_npu::MaskedMeanOp));
    m.impl("masked_whiten", TORCH_FN(bitparity_npu::MaskedWhitenOp));
    m.impl("kl_penalty", TORCH_FN(bitparity_npu::KlPenaltyOp));
    m.impl("gae", TORCH_FN(bitparity_npu::GaeOp));
    m.impl("ppo_token_losses", TORCH_FN(bitparity_npu::PpoTokenLossesOp));
    m.impl("philox", TORCH_FN(bitparity_npu::PhiloxOp));
    m.impl("topk", TORCH_FN(bitparity_npu::TopkOp));
    m.impl("filter_logits", TORCH_FN(bitparity_npu::FilterLogitsOp));
    m.impl("sample", TORCH_FN(bitparity_npu::SampleOp));
    m.impl("linear", TORCH_FN(bitparity_npu::LinearOp));
    m.impl("linear_exact", TORCH_FN(bitparity_npu::LinearExactOp));
    m.impl("rms_norm", TORCH_FN(bitparity_npu::RmsNormOp));
    m.impl("rotary", TORCH_FN(bitparity_npu::RotaryOp));
    m.impl("attention", TORCH_FN(bitparity_npu::AttentionOp));
    m.impl("silu_mul", TORCH_FN(bitparity_npu::SiluMulOp));
    m.impl("logsumexp_backward", TORCH_FN(bitparity_npu::LogsumexpBackwardOp));
    m.impl("log_softmax_backward", TORCH_FN(bitparity_npu::LogSoftmaxBackwardOp));
    m.impl("softmax_backward", TORCH_FN(bitparity_npu::SoftmaxBackwardOp));
    m.impl("entropy_backward", TORCH_FN(bitparity_npu::EntropyBackwardOp));
    m.impl("token_logprobs_backward", TORCH_FN(bitparity_npu::TokenLogprobsBackwardOp));
    m.impl("masked_mean_backward", TORCH_FN(bitparity_npu::MaskedMeanBackwardOp));
    m.impl("masked_whiten_backward", TORCH_FN(bitparity_npu::MaskedWhitenBackwardOp));
    m.impl("kl_penalty_backward", TORCH_FN(bitparity_npu::KlPenaltyBackwardOp));
    m.impl("ppo_policy_loss_backward", TORCH_FN(bitparity_npu::PpoPolicyLossBackwardOp));
    m.impl("fold_rows", TORCH_FN(bitparity_npu::FoldRowsOp));
    m.impl("rms_norm_backward", TORCH_FN(bitparity_npu::RmsNormBackwardOp));
    m.impl("silu_mul_backward", TORCH_FN(bitparity_npu::SiluMulBackwardOp));
    m.impl("attention_backward", TORCH_FN(bitparity_npu::AttentionBackwardOp));
    m.impl("adamw_step", TORCH_FN(bitparity_npu::AdamwStepOp));
    m.impl("sgd_step", TORCH_FN(bitparity_npu::SgdStepOp));
}
