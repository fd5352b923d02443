// Host emulation of the subset of the Ascend C API that bitparity's kernels use.
//
// THIS IS A TEST DOUBLE, NOT AN NPU.  It lets kernels/*.cpp -- written to the
// real Ascend C API for Atlas A2 (910B, dav-2201) -- compile with g++ and run on
// a CPU, so their evaluation order can be checked bit for bit against
// reference/canonical.py on machines without CANN or an NPU.  Passing here says
// the kernels compute the canonical bits *if* the hardware behaves as modelled
// below; it says nothing about the hardware itself (see docs/ascend.md for the
// assumptions that must be checked on a real A2).
//
// What is modelled, and from where (Ascend C API reference, asc-devkit docs):
//   * Arithmetic: float32 Add/Sub/Mul/Adds/Muls are IEEE-754 binary32 with
//     round-to-nearest-even and subnormals kept (the launch shim clears the host
//     FTZ/DAZ bits), one rounding per instruction.  int32 Add/Sub/Adds wrap.
//   * Max/Min/Maxs/Mins with a NaN operand: undocumented on A2.  The emulation
//     returns the non-NaN operand (IEEE maxNum/minNum), the choice least
//     favourable to NaN propagation, so a kernel that relied on Max or Min to
//     propagate NaN fails here.  Which of +0/-0 Max or Min returns is also
//     unspecified; the emulation returns src1.
//   * Compare/Compares: IEEE ordered comparisons (NaN compares unequal to
//     everything).  Result bit i (LSB first within each byte) is element i.
//     A2 restriction enforced: count * sizeof(T) must be a multiple of 256 B.
//   * Select: VSEL_TENSOR_SCALAR_MODE and VSEL_TENSOR_TENSOR_MODE, bit 1 picks
//     src0.  A2 reserves 8 KB of UB as their scratch, so the UB capacity that
//     InitBuffer may hand out is 192 KB - 8 KB.
//   * Cast: int32 -> float (exact for |v| < 2^24, else round-to-nearest-even),
//     uint8 -> half (exact).  ShiftLeft on uint32 (logical), ShiftRight on
//     int32 (arithmetic); shift counts in [0, 32] as documented for A2.
//   * DataCopy GM<->UB: UB address 32-byte aligned, count * sizeof(T) a
//     multiple of 32 B (hardware silently rounds the length down; here that is
//     an error, since a truncated copy is always a kernel bug), GM address
//     aligned to sizeof(T).  DataCopyPad (blockCount 1 .. 4095 blocks of
//     blockLen bytes, no left padding): UB address 32-byte aligned; each block
//     occupies whole 32-byte UB blocks, its dummy bytes up to the next 32-byte
//     boundary being the block's first element (isPad false, rightPadding 0,
//     as documented), paddingValue (isPad true), or poison (isPad false with
//     rightPadding, documented as random).  Strides are tail-to-head gaps
//     between consecutive blocks: in bytes on the GM side, in 32-byte blocks
//     on the UB side.
//   * Gather (the first-count form): dst[i] = the element at byte
//     srcBaseAddr + srcOffset[i] of src, bits unchanged.  Offsets must be
//     aligned to sizeof(T) and the element must lie inside the src tensor;
//     dst must not overlap src or the offsets.
//   * Vector operands: 32-byte aligned UB start, within the tensor, and either
//     exactly the destination or disjoint from it (the documented overlap rule).
//   * TPipe/TQue/TBuf: InitBuffer rounds lengths up to 32 B, fails beyond the
//     UB capacity, beyond 8 queue buffers per TPosition or 64 buffers in all.
//     Queue discipline: AllocTensor with every buffer in use, EnQue beyond the
//     depth, DeQue of an empty queue, FreeTensor of a tensor not allocated from
//     the queue (or already freed, or still queued), vector access to a VECIN
//     tensor before DeQue or to a VECOUT tensor after EnQue, DataCopy GM->UB
//     into anything but an allocated VECIN tensor, and tensors still allocated
//     when the kernel returns all fail.
//   * Cross-pipe synchronisation: a scalar GetValue/SetValue on a buffer that a
//     vector instruction touched needs SetFlag/WaitFlag<V_S> in between; a
//     vector instruction on a buffer the scalar unit touched needs S_V; an
//     MTE3 copy out of a buffer the scalar unit wrote needs S_MTE3, of a TBuf a
//     vector instruction wrote needs V_MTE3; a scalar write to a buffer MTE3
//     read needs MTE3_S.  SetFlag/WaitFlag must pair (event ids 0..7).
//     Within the vector pipe, instructions take effect in program order: the
//     PIPE_V barriers between dependent vector instructions are inserted by
//     bisheng's automatic synchronisation, which the NPU build keeps on.
//   * Uninitialised UB reads as 0xFF bytes (NaN as float), so a kernel that
//     reads lanes it never wrote produces NaNs instead of plausible numbers.
//   * The Cube unit (asc-devkit Mmad/LoadData/Fixpipe docs for Atlas A2/A3; the
//     project's notes-exact-matmul.md): TPositions A1/B1 (L1, 512 KB), A2 (L0A,
//     64 KB), B2 (L0B, 64 KB), CO1 (L0C, 128 KB), poisoned like the UB, which
//     neither the vector nor the scalar unit may address.  DataCopy GM -> L1
//     (DataCopyParams, 32-byte blocks) into an allocated A1/B1 tensor; LoadData
//     (2D, 512-byte fractals, no transpose) A1 -> A2, B1 -> B2, destination
//     512-byte aligned.  Mmad int8 x int8 -> int32, exact: A(m, k) at L0A byte
//     ((m/16)*K1 + k/32)*512 + (m%16)*32 + k%32 (16 x 32 fractals, row-major
//     inside and between), B(k, n) at L0B byte ((k/32)*N1 + n/16)*512 +
//     (n%16)*32 + k%32 (32 x 16 fractals, column-major inside, row-major
//     between), C(m, n) at L0C element ((n/16)*M1 + m/16)*256 + (m%16)*16 + n%16
//     (16 x 16, row-major inside, column-major between), K1, N1, M1 the
//     fractal counts; m = 1 is GEMV and reads A as ND bytes; m, n, k in
//     1 .. 4095; C 256-element, A and B 512-byte aligned; cmatrixInitVal true
//     writes C, false accumulates; an int32 sum leaving int32 (undocumented on
//     A2) is an error.  Fixpipe L0C -> GM, int32 without quantisation, NZ -> ND.
// Anything else is not modelled and does not compile or fails at run time.

#ifndef BITPARITY_EMULATED_KERNEL_OPERATOR_H
#define BITPARITY_EMULATED_KERNEL_OPERATOR_H

#include <cmath>
#include <cstdint>
#include <cstring>
#include <climits>
#include <deque>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#define __global__
#define __aicore__
#define __gm__
using GM_ADDR = uint8_t*;

// IEEE binary16, as much of Ascend C's built-in half (a global type on the NPU) as the mask path needs.
struct half {
    uint16_t bits = 0;
    half() = default;
    half(float f) : bits(FromFloat(f)) {}
    half(int v) : half(static_cast<float>(v)) {}
    explicit operator float() const { return ToFloat(bits); }

    static uint16_t FromFloat(float f) {   // round to nearest even
        uint32_t x;
        std::memcpy(&x, &f, sizeof x);
        const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
        const uint32_t ax = x & 0x7FFFFFFFu;
        if (ax > 0x7F800000u) return sign | 0x7E00u;
        if (ax >= 0x477FF000u) return sign | 0x7C00u;          // rounds past 65504
        if (ax < 0x38800000u) {                                 // below 2^-14: subnormal half
            return sign | static_cast<uint16_t>(std::nearbyint(std::fabs(f) * 16777216.0f));
        }
        uint32_t h = ((((ax >> 23) - 127 + 15) << 10) | ((ax & 0x7FFFFFu) >> 13));
        const uint32_t rest = ax & 0x1FFFu;
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h += 1;   // a carry into the exponent is right
        return static_cast<uint16_t>(sign | h);
    }
    static float ToFloat(uint16_t h) {   // exact
        const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
        if (e == 0) {
            const float v = static_cast<float>(m) * 5.9604644775390625e-8f;   // m * 2^-24
            return sign ? -v : v;
        }
        const uint32_t bits = sign | (e == 31 ? 0x7F800000u | (m << 13) : ((e + 112) << 23) | (m << 13));
        float f;
        std::memcpy(&f, &bits, sizeof f);
        return f;
    }
};

namespace AscendC {

struct EmulationError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

[[noreturn]] inline void Fail(const std::string& what) { throw EmulationError(what); }

constexpr uint32_t UB_BYTES = 192 * 1024;
constexpr uint32_t UB_SELECT_RESERVED_BYTES = 8 * 1024;
constexpr uint32_t UB_CAPACITY = UB_BYTES - UB_SELECT_RESERVED_BYTES;
constexpr uint32_t UB_BLOCK = 32;          // UB address granularity, bytes
constexpr uint32_t REPEAT_BYTES = 256;     // one vector repeat
constexpr uint32_t MAX_QUE_BUFFERS_PER_POSITION = 8;
constexpr uint32_t MAX_BUFFERS = 64;
constexpr int32_t EVENT_IDS = 8;
// The Cube unit's buffers on Atlas A2 (910B): L1 512 KB (TPosition A1 and B1), L0A 64 KB (A2), L0B 64 KB (B2),
// L0C 128 KB (CO1).  The emulation keeps them in one host arena after the UB, each filled with 0xFF poison.
constexpr uint32_t L1_BYTES = 512 * 1024;
constexpr uint32_t L0A_BYTES = 64 * 1024;
constexpr uint32_t L0B_BYTES = 64 * 1024;
constexpr uint32_t L0C_BYTES = 128 * 1024;
constexpr uint32_t L1_BASE = UB_BYTES;
constexpr uint32_t L0A_BASE = L1_BASE + L1_BYTES;
constexpr uint32_t L0B_BASE = L0A_BASE + L0A_BYTES;
constexpr uint32_t L0C_BASE = L0B_BASE + L0B_BYTES;
constexpr uint32_t ARENA_BYTES = L0C_BASE + L0C_BYTES;

enum class TPosition { GM, VECIN, VECOUT, VECCALC, A1, B1, A2, B2, CO1 };
using QuePosition = TPosition;
enum class CMPMODE { LT, GT, EQ, LE, GE, NE };
enum class SELMODE : uint8_t { VSEL_CMPMASK_SPR = 0, VSEL_TENSOR_SCALAR_MODE, VSEL_TENSOR_TENSOR_MODE };
enum class RoundMode { CAST_NONE = 0, CAST_RINT, CAST_FLOOR, CAST_CEIL, CAST_ROUND, CAST_TRUNC, CAST_ODD };
// Only the events the kernels synchronise on.
enum class HardEvent : uint8_t { V_S = 0, S_V, S_MTE3, MTE3_S, V_MTE3, COUNT };
using TEventID = int8_t;

namespace emu {

enum class BufState { FREE, ALLOCATED, ENQUEUED, DEQUEUED };

inline const char* PositionName(TPosition p) {
    switch (p) {
        case TPosition::VECIN: return "VECIN";
        case TPosition::VECOUT: return "VECOUT";
        case TPosition::VECCALC: return "VECCALC";
        case TPosition::A1: return "A1";
        case TPosition::B1: return "B1";
        case TPosition::A2: return "A2";
        case TPosition::B2: return "B2";
        case TPosition::CO1: return "CO1";
        default: return "GM";
    }
}

// One InitBuffer block of UB.  Hazard stamps are sequence numbers of the last
// operation of each kind that touched the buffer.
struct Buffer {
    std::string name;
    TPosition position;
    bool queued;                  // a TQue buffer (state machine) or a TBuf (always usable)
    uint32_t offset, bytes;
    BufState state = BufState::FREE;
    const void* owner;
    uint64_t lastVector = 0, lastVectorWrite = 0, lastScalar = 0, lastScalarWrite = 0, lastMte3 = 0;
};

struct CoreState {
    uint32_t blockIdx = 0, blockNum = 1;
    std::vector<uint8_t> ub = std::vector<uint8_t>(ARENA_BYTES, 0xFF);   // UB, then L1, L0A, L0B, L0C
    uint32_t ubUsed = 0;
    uint32_t cubeUsed[5] = {0, 0, 0, 0, 0};   // A1/B1 share L1; A2 = L0A, B2 = L0B, CO1 = L0C
    uint32_t queBuffers[9] = {};
    uint32_t bufferCount = 0;
    std::deque<Buffer> buffers;   // deque: pointers stay valid as buffers are added
    uint64_t seq = 0;
    uint64_t synced[static_cast<int>(HardEvent::COUNT)] = {};
    uint64_t flagAt[static_cast<int>(HardEvent::COUNT)][EVENT_IDS] = {};
    bool flagSet[static_cast<int>(HardEvent::COUNT)][EVENT_IDS] = {};
    void* pipe = nullptr;
};

// The AI core being emulated on this thread (ctypes calls release the GIL, so threads may launch at once).
inline thread_local CoreState* core = nullptr;

// Whether the vector and scalar units may touch a buffer now: a TBuf always; a
// VECIN queue tensor between DeQue and FreeTensor (after its MTE2 copy landed);
// a VECOUT queue tensor between AllocTensor and EnQue (before MTE3 reads it).
inline bool HeldForCompute(const Buffer& b) {
    if (!b.queued) return true;
    return b.position == TPosition::VECIN ? b.state == BufState::DEQUEUED : b.state == BufState::ALLOCATED;
}

// The Cube unit's positions: neither the vector nor the scalar unit can address them.
inline bool IsCube(TPosition p) {
    return p == TPosition::A1 || p == TPosition::B1 || p == TPosition::A2 || p == TPosition::B2 ||
           p == TPosition::CO1;
}

inline CoreState& Core() {
    if (core == nullptr) Fail("Ascend C API used outside an emulated kernel launch");
    return *core;
}

inline const char* EventName(HardEvent e) {
    static const char* names[] = {"V_S", "S_V", "S_MTE3", "MTE3_S", "V_MTE3"};
    return names[static_cast<int>(e)];
}

inline uint64_t Synced(HardEvent e) { return Core().synced[static_cast<int>(e)]; }

}  // namespace emu

// A view of UB: a buffer, a byte offset into UB, and the elements from there to the buffer's end.
template <typename T>
class LocalTensor {
public:
    LocalTensor() = default;

    LocalTensor operator[](uint32_t offset) const {
        Bound();
        if (offset > size_) {
            Fail("LocalTensor[" + std::to_string(offset) + "] is past the end of " + buf_->name + " (" +
                 std::to_string(size_) + " elements)");
        }
        return LocalTensor(buf_, addr_ + offset * sizeof(T), size_ - offset);
    }

    template <typename U>
    LocalTensor<U> ReinterpretCast() const {
        Bound();
        return LocalTensor<U>(buf_, addr_, static_cast<uint32_t>(size_ * sizeof(T) / sizeof(U)));
    }

    uint32_t GetSize() const { return size_; }

    T GetValue(uint32_t i) const {
        ScalarAccess(i, false);
        T v;
        std::memcpy(&v, emu::Core().ub.data() + addr_ + i * sizeof(T), sizeof(T));
        return v;
    }

    void SetValue(uint32_t i, T v) const {
        ScalarAccess(i, true);
        std::memcpy(emu::Core().ub.data() + addr_ + i * sizeof(T), &v, sizeof(T));
    }

    // Emulation internals.
    LocalTensor(emu::Buffer* buf, uint32_t addr, uint32_t size) : buf_(buf), addr_(addr), size_(size) {}
    emu::Buffer* EmuBuffer() const { Bound(); return buf_; }
    uint32_t EmuAddress() const { return addr_; }

private:
    void Bound() const {
        if (buf_ == nullptr) Fail("use of a LocalTensor that no AllocTensor/Get produced");
    }

    void ScalarAccess(uint32_t i, bool write) const {
        Bound();
        emu::CoreState& c = emu::Core();
        if (i >= size_) {
            Fail(std::string(write ? "SetValue(" : "GetValue(") + std::to_string(i) + ") is past the end of " +
                 buf_->name + " (" + std::to_string(size_) + " elements)");
        }
        if (emu::IsCube(buf_->position)) {
            Fail("scalar access to " + buf_->name + ": the scalar unit cannot address L1/L0A/L0B/L0C");
        }
        if (!emu::HeldForCompute(*buf_)) {
            Fail("scalar access to " + buf_->name +
                 " outside its compute stage (a VECIN tensor before DeQue, a VECOUT tensor after EnQue, or freed)");
        }
        if (buf_->lastVector > emu::Synced(HardEvent::V_S)) {
            Fail("scalar " + std::string(write ? "SetValue" : "GetValue") + " on " + buf_->name +
                 " after a vector instruction touched it, without SetFlag/WaitFlag<HardEvent::V_S>");
        }
        if (write && buf_->lastMte3 > emu::Synced(HardEvent::MTE3_S)) {
            Fail("scalar SetValue on " + buf_->name +
                 " while MTE3 may still be copying it out, without SetFlag/WaitFlag<HardEvent::MTE3_S>");
        }
        buf_->lastScalar = ++c.seq;
        if (write) buf_->lastScalarWrite = c.seq;
    }

    emu::Buffer* buf_ = nullptr;
    uint32_t addr_ = 0;
    uint32_t size_ = 0;
};

namespace emu {
template <typename T>
T* Data(const LocalTensor<T>& t) {
    return reinterpret_cast<T*>(Core().ub.data() + t.EmuAddress());
}
}  // namespace emu

template <typename T>
class GlobalTensor {
public:
    void SetGlobalBuffer(__gm__ T* buffer, uint64_t bufferSize) {
        if (buffer == nullptr && bufferSize != 0) Fail("SetGlobalBuffer with a null GM address");
        base_ = buffer;
        size_ = bufferSize;
    }

    GlobalTensor operator[](uint64_t offset) const {
        if (offset > size_) {
            Fail("GlobalTensor[" + std::to_string(offset) + "] is past its buffer (" + std::to_string(size_) +
                 " elements)");
        }
        GlobalTensor g;
        g.base_ = base_ + offset;
        g.size_ = size_ - offset;
        return g;
    }

    T GetValue(uint64_t i) const {
        Check(i, 1, "GetValue");
        return base_[i];
    }

    // Emulation internals.
    T* EmuAddress() const { return base_; }
    void Check(uint64_t begin, uint64_t count, const char* api) const {
        if (begin + count > size_) {
            Fail(std::string(api) + ": GM elements [" + std::to_string(begin) + ", " +
                 std::to_string(begin + count) + ") are outside the GlobalTensor (" + std::to_string(size_) +
                 " elements)");
        }
    }

private:
    T* base_ = nullptr;
    uint64_t size_ = 0;
};

namespace emu {

inline Buffer* NewBuffer(const std::string& name, TPosition pos, bool queued, uint32_t len, const void* owner) {
    CoreState& c = Core();
    const uint32_t bytes = (len + UB_BLOCK - 1) / UB_BLOCK * UB_BLOCK;
    if (bytes == 0) Fail("InitBuffer of 0 bytes for " + name);
    if (IsCube(pos)) {
        // A1 and B1 share L1; a Cube buffer starts 512-byte aligned in its memory (an L0A/L0B fractal).
        const int memory = pos == TPosition::A1 || pos == TPosition::B1 ? 0 : pos == TPosition::A2 ? 1
                         : pos == TPosition::B2 ? 2 : 3;
        static const uint32_t bases[4] = {L1_BASE, L0A_BASE, L0B_BASE, L0C_BASE};
        static const uint32_t sizes[4] = {L1_BYTES, L0A_BYTES, L0B_BYTES, L0C_BYTES};
        static const char* names[4] = {"L1", "L0A", "L0B", "L0C"};
        const uint32_t start = (c.cubeUsed[memory] + 511) / 512 * 512;
        if (start + bytes > sizes[memory]) {
            Fail("InitBuffer: " + name + " needs " + std::to_string(bytes) + " B but " + names[memory] + " holds " +
                 std::to_string(sizes[memory]) + " B, " + std::to_string(start) + " already given out");
        }
        if (++c.bufferCount > MAX_BUFFERS) Fail("InitBuffer: more than 64 buffers in one kernel");
        c.buffers.push_back(Buffer{name, pos, queued, bases[memory] + start, bytes,
                                   queued ? BufState::FREE : BufState::ALLOCATED, owner});
        c.cubeUsed[memory] = start + bytes;
        return &c.buffers.back();
    }
    if (c.ubUsed + bytes > UB_CAPACITY) {
        Fail("InitBuffer: " + name + " needs " + std::to_string(bytes) + " B but only " +
             std::to_string(UB_CAPACITY - c.ubUsed) + " B of the Unified Buffer are left (" +
             std::to_string(UB_CAPACITY) + " B usable: 192 KB less 8 KB reserved for Select)");
    }
    if (++c.bufferCount > MAX_BUFFERS) Fail("InitBuffer: more than 64 buffers in one kernel");
    c.buffers.push_back(Buffer{name, pos, queued, c.ubUsed, bytes, queued ? BufState::FREE : BufState::ALLOCATED,
                               owner});
    c.ubUsed += bytes;
    return &c.buffers.back();
}

// Checks one vector operand and returns its host address.
template <typename T>
T* VecOperand(const LocalTensor<T>& t, uint64_t count, const char* api, const char* role, bool write) {
    Buffer* b = t.EmuBuffer();
    CoreState& c = Core();
    if (IsCube(b->position)) {
        Fail(std::string(api) + ": " + role + " is " + b->name + ", in L1/L0A/L0B/L0C, which the vector unit cannot "
             "address");
    }
    if (t.EmuAddress() % UB_BLOCK != 0) {
        Fail(std::string(api) + ": " + role + " starts at UB byte " + std::to_string(t.EmuAddress()) +
             ", not 32-byte aligned");
    }
    if (count > t.GetSize()) {
        Fail(std::string(api) + ": " + role + " needs " + std::to_string(count) + " elements but " + b->name +
             " has " + std::to_string(t.GetSize()) + " from there");
    }
    if (!HeldForCompute(*b)) {
        Fail(std::string(api) + ": vector access to " + b->name +
             (b->position == TPosition::VECIN ? " outside DeQue..FreeTensor (the MTE2 copy may not have landed)"
                                              : " outside AllocTensor..EnQue (MTE3 may be reading it)"));
    }
    if (b->lastScalar > Synced(HardEvent::S_V)) {
        Fail(std::string(api) + ": vector access to " + b->name +
             " after a scalar GetValue/SetValue on it, without SetFlag/WaitFlag<HardEvent::S_V>");
    }
    b->lastVector = c.seq + 1;
    if (write) b->lastVectorWrite = c.seq + 1;
    return Data(t);
}

// A source must be the destination itself or not overlap it.
template <typename D, typename S>
void CheckOverlap(const LocalTensor<D>& dst, uint64_t dstCount, const LocalTensor<S>& src, uint64_t srcCount,
                  const char* api, bool sameStartAllowed) {
    const uint64_t d0 = dst.EmuAddress(), d1 = d0 + dstCount * sizeof(D);
    const uint64_t s0 = src.EmuAddress(), s1 = s0 + srcCount * sizeof(S);
    if (sameStartAllowed && d0 == s0 && dstCount * sizeof(D) == srcCount * sizeof(S)) return;
    if (s0 < d1 && d0 < s1) {
        Fail(std::string(api) + ": a source partially overlaps the destination (UB bytes [" + std::to_string(s0) +
             ", " + std::to_string(s1) + ") and [" + std::to_string(d0) + ", " + std::to_string(d1) + "))");
    }
}

inline void EndInstruction() { ++Core().seq; }

template <typename T, typename F>
void Binary(const char* api, const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b,
            int32_t count, F f) {
    if (count <= 0) return;   // count 0 is a NOP on A2
    const T* pa = VecOperand(a, count, api, "src0", false);
    const T* pb = VecOperand(b, count, api, "src1", false);
    T* pd = VecOperand(dst, count, api, "dst", true);
    CheckOverlap(dst, count, a, count, api, true);
    CheckOverlap(dst, count, b, count, api, true);
    for (int32_t i = 0; i < count; ++i) pd[i] = f(pa[i], pb[i]);
    EndInstruction();
}

template <typename T, typename F>
void Unary(const char* api, const LocalTensor<T>& dst, const LocalTensor<T>& src, int32_t count, F f) {
    if (count <= 0) return;
    const T* ps = VecOperand(src, count, api, "src", false);
    T* pd = VecOperand(dst, count, api, "dst", true);
    CheckOverlap(dst, count, src, count, api, true);
    for (int32_t i = 0; i < count; ++i) pd[i] = f(ps[i]);
    EndInstruction();
}

inline int32_t WrapAdd(int32_t a, int32_t b) {
    return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
}
inline int32_t WrapSub(int32_t a, int32_t b) {
    return static_cast<int32_t>(static_cast<uint32_t>(a) - static_cast<uint32_t>(b));
}
inline float MaxNum(float a, float b) { return std::isnan(a) ? b : std::isnan(b) ? a : (a > b ? a : b); }
inline float MinNum(float a, float b) { return std::isnan(a) ? b : std::isnan(b) ? a : (a < b ? a : b); }

template <typename T>
bool Compared(T a, T b, CMPMODE mode) {
    const float x = static_cast<float>(a), y = static_cast<float>(b);
    switch (mode) {
        case CMPMODE::LT: return x < y;
        case CMPMODE::GT: return x > y;
        case CMPMODE::EQ: return x == y;
        case CMPMODE::LE: return x <= y;
        case CMPMODE::GE: return x >= y;
        default: return x != y;
    }
}

template <typename T>
void CheckCompareCount(const char* api, uint32_t count) {
    if ((count * sizeof(T)) % REPEAT_BYTES != 0) {
        Fail(std::string(api) + ": count " + std::to_string(count) + " x " + std::to_string(sizeof(T)) +
             " B is not a whole number of 256-byte repeats (required on A2; the tail would not be compared)");
    }
}

}  // namespace emu

// ---- Memory management ------------------------------------------------------

template <TPosition POS, int32_t DEPTH>
class TQue {
public:
    template <typename T>
    LocalTensor<T> AllocTensor() {
        Inited("AllocTensor");
        for (emu::Buffer* b : buffers_) {
            if (b->state == emu::BufState::FREE) {
                b->state = emu::BufState::ALLOCATED;
                return LocalTensor<T>(b, b->offset, b->bytes / sizeof(T));
            }
        }
        Fail("AllocTensor on " + Name() + ": all " + std::to_string(buffers_.size()) +
             " buffers are in use (FreeTensor the ones you are done with)");
    }

    template <typename T>
    bool EnQue(const LocalTensor<T>& t) {
        emu::Buffer* b = Own(t, "EnQue");
        if (b->state != emu::BufState::ALLOCATED) Fail("EnQue on " + Name() + " of a tensor that is not allocated");
        if (fifo_.size() >= static_cast<size_t>(DEPTH)) {
            Fail("EnQue on " + Name() + " beyond its depth " + std::to_string(DEPTH));
        }
        b->state = emu::BufState::ENQUEUED;
        fifo_.push_back(b);
        return true;
    }

    template <typename T>
    LocalTensor<T> DeQue() {
        Inited("DeQue");
        if (fifo_.empty()) Fail("DeQue on " + Name() + " with nothing enqueued (DeQue before EnQue)");
        emu::Buffer* b = fifo_.front();
        fifo_.pop_front();
        b->state = emu::BufState::DEQUEUED;
        return LocalTensor<T>(b, b->offset, b->bytes / sizeof(T));
    }

    template <typename T>
    void FreeTensor(const LocalTensor<T>& t) {
        emu::Buffer* b = Own(t, "FreeTensor");
        if (b->state == emu::BufState::FREE) Fail("FreeTensor on " + Name() + " of a tensor that is not allocated");
        if (b->state == emu::BufState::ENQUEUED) Fail("FreeTensor on " + Name() + " of a tensor still enqueued");
        b->state = emu::BufState::FREE;
    }

    // Emulation internals.
    void EmuInit(uint8_t num, uint32_t len) {
        if (!buffers_.empty()) Fail("InitBuffer called twice for " + Name());
        emu::CoreState& c = emu::Core();
        uint32_t& perPosition = c.queBuffers[static_cast<int>(POS)];
        if (perPosition + num > MAX_QUE_BUFFERS_PER_POSITION) {
            Fail("InitBuffer: more than 8 queue buffers at TPosition " + std::string(emu::PositionName(POS)));
        }
        perPosition += num;
        for (uint8_t i = 0; i < num; ++i) {
            buffers_.push_back(emu::NewBuffer(Name() + " buffer " + std::to_string(i), POS, true, len, this));
        }
    }

private:
    std::string Name() const {
        return std::string("TQue<") + emu::PositionName(POS) + ", " + std::to_string(DEPTH) + ">";
    }
    void Inited(const char* api) const {
        if (buffers_.empty()) Fail(std::string(api) + " on " + Name() + " before InitBuffer");
    }
    template <typename T>
    emu::Buffer* Own(const LocalTensor<T>& t, const char* api) const {
        Inited(api);
        emu::Buffer* b = t.EmuBuffer();
        if (b->owner != this || t.EmuAddress() != b->offset) {
            Fail(std::string(api) + " on " + Name() + " of a tensor that this queue did not allocate");
        }
        return b;
    }

    std::vector<emu::Buffer*> buffers_;
    std::deque<emu::Buffer*> fifo_;
};

template <TPosition POS>
class TBuf {
public:
    template <typename T>
    LocalTensor<T> Get() const {
        if (buffer_ == nullptr) Fail("TBuf::Get before InitBuffer");
        return LocalTensor<T>(buffer_, buffer_->offset, buffer_->bytes / sizeof(T));
    }

    template <typename T>
    LocalTensor<T> Get(uint32_t len) const {
        LocalTensor<T> all = Get<T>();
        if (len > all.GetSize()) Fail("TBuf::Get(" + std::to_string(len) + ") is larger than the buffer");
        return LocalTensor<T>(buffer_, buffer_->offset, len);
    }

    void EmuInit(uint32_t len) {
        if (buffer_ != nullptr) Fail("InitBuffer called twice for a TBuf");
        buffer_ = emu::NewBuffer(std::string("TBuf<") + emu::PositionName(POS) + "> #" +
                                     std::to_string(emu::Core().bufferCount),
                                 POS, false, len, this);
    }

private:
    emu::Buffer* buffer_ = nullptr;
};

class TPipe {
public:
    TPipe() { emu::Core().pipe = this; }
    ~TPipe() {
        if (emu::core != nullptr && emu::core->pipe == this) emu::core->pipe = nullptr;
    }
    TPipe(const TPipe&) = delete;
    TPipe& operator=(const TPipe&) = delete;

    template <class Q>
    bool InitBuffer(Q& que, uint8_t num, uint32_t len) {
        if (num == 0) Fail("InitBuffer of a queue with 0 buffers");
        que.EmuInit(num, len);
        return true;
    }

    template <TPosition POS>
    bool InitBuffer(TBuf<POS>& buf, uint32_t len) {
        buf.EmuInit(len);
        return true;
    }

    // Any free id will do: the pairing of SetFlag/WaitFlag is what is checked.
    TEventID FetchEventID(HardEvent) const { return 0; }
};

inline TPipe* GetTPipePtr() {
    void* p = emu::Core().pipe;
    if (p == nullptr) Fail("GetTPipePtr with no live TPipe");
    return static_cast<TPipe*>(p);
}

inline int64_t GetBlockIdx() { return emu::Core().blockIdx; }
inline int64_t GetBlockNum() { return emu::Core().blockNum; }

template <HardEvent EVENT>
void SetFlag(int32_t id) {
    emu::CoreState& c = emu::Core();
    const int e = static_cast<int>(EVENT);
    if (id < 0 || id >= EVENT_IDS) Fail("SetFlag event id " + std::to_string(id) + " outside 0..7");
    if (c.flagSet[e][id]) {
        Fail(std::string("SetFlag<") + emu::EventName(EVENT) + ">(" + std::to_string(id) +
             ") twice without WaitFlag");
    }
    c.flagSet[e][id] = true;
    c.flagAt[e][id] = c.seq;
}

template <HardEvent EVENT>
void WaitFlag(int32_t id) {
    emu::CoreState& c = emu::Core();
    const int e = static_cast<int>(EVENT);
    if (id < 0 || id >= EVENT_IDS) Fail("WaitFlag event id " + std::to_string(id) + " outside 0..7");
    if (!c.flagSet[e][id]) {
        Fail(std::string("WaitFlag<") + emu::EventName(EVENT) + ">(" + std::to_string(id) +
             ") without SetFlag: on hardware this waits forever");
    }
    c.flagSet[e][id] = false;
    if (c.flagAt[e][id] > c.synced[e]) c.synced[e] = c.flagAt[e][id];
}

// ---- Vector instructions (the "first count elements" overloads) -----------------

template <typename T>
void Add(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count) {
    static_assert(std::is_same<T, float>::value || std::is_same<T, int32_t>::value, "Add: float or int32_t");
    if constexpr (std::is_same<T, float>::value) {
        emu::Binary("Add", dst, src0, src1, count, [](float a, float b) { return a + b; });
    } else {
        emu::Binary("Add", dst, src0, src1, count, emu::WrapAdd);
    }
}

template <typename T>
void Sub(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count) {
    static_assert(std::is_same<T, float>::value || std::is_same<T, int32_t>::value, "Sub: float or int32_t");
    if constexpr (std::is_same<T, float>::value) {
        emu::Binary("Sub", dst, src0, src1, count, [](float a, float b) { return a - b; });
    } else {
        emu::Binary("Sub", dst, src0, src1, count, emu::WrapSub);
    }
}

template <typename T>
void Mul(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count) {
    static_assert(std::is_same<T, float>::value, "Mul: only float is modelled");
    emu::Binary("Mul", dst, src0, src1, count, [](float a, float b) { return a * b; });
}

template <typename T>
void Max(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count) {
    static_assert(std::is_same<T, float>::value, "Max: only float is modelled");
    emu::Binary("Max", dst, src0, src1, count, emu::MaxNum);
}

template <typename T>
void Min(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count) {
    static_assert(std::is_same<T, float>::value, "Min: only float is modelled");
    emu::Binary("Min", dst, src0, src1, count, emu::MinNum);
}

template <typename T>
void Adds(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue, const int32_t& count) {
    static_assert(std::is_same<T, float>::value || std::is_same<T, int32_t>::value, "Adds: float or int32_t");
    const T s = scalarValue;
    if constexpr (std::is_same<T, float>::value) {
        emu::Unary("Adds", dst, src, count, [s](float a) { return a + s; });
    } else {
        emu::Unary("Adds", dst, src, count, [s](int32_t a) { return emu::WrapAdd(a, s); });
    }
}

template <typename T>
void Muls(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue, const int32_t& count) {
    static_assert(std::is_same<T, float>::value, "Muls: only float is modelled");
    const T s = scalarValue;
    emu::Unary("Muls", dst, src, count, [s](float a) { return a * s; });
}

template <typename T>
void Maxs(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue, const int32_t& count) {
    static_assert(std::is_same<T, float>::value, "Maxs: only float is modelled");
    const T s = scalarValue;
    emu::Unary("Maxs", dst, src, count, [s](float a) { return emu::MaxNum(a, s); });
}

template <typename T>
void Mins(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue, const int32_t& count) {
    static_assert(std::is_same<T, float>::value, "Mins: only float is modelled");
    const T s = scalarValue;
    emu::Unary("Mins", dst, src, count, [s](float a) { return emu::MinNum(a, s); });
}

template <typename T>
void ShiftLeft(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue, const int32_t& count) {
    // A2 documents ShiftLeft on signed types as sign-preserving, unlike C: only the logical form is modelled.
    static_assert(std::is_same<T, uint32_t>::value, "ShiftLeft: only uint32_t (logical) is modelled");
    const T s = scalarValue;
    if (s > 32) Fail("ShiftLeft by " + std::to_string(s) + ": A2 allows 0..32 for 32-bit types");
    emu::Unary("ShiftLeft", dst, src, count, [s](uint32_t a) { return s == 32 ? 0u : a << s; });
}

template <typename T>
void ShiftRight(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue, const int32_t& count) {
    static_assert(std::is_same<T, int32_t>::value, "ShiftRight: only int32_t (arithmetic) is modelled");
    const T s = scalarValue;
    if (s < 0 || s > 32) Fail("ShiftRight by " + std::to_string(s) + ": A2 allows 0..32 for 32-bit types");
    emu::Unary("ShiftRight", dst, src, count, [s](int32_t a) { return s == 32 ? (a < 0 ? -1 : 0) : a >> s; });
}

template <typename T>
void Duplicate(const LocalTensor<T>& dst, const T& scalarValue, const int32_t& count) {
    static_assert(std::is_same<T, float>::value || std::is_same<T, int32_t>::value, "Duplicate: float or int32_t");
    if (count <= 0) return;
    T* pd = emu::VecOperand(dst, count, "Duplicate", "dst", true);
    for (int32_t i = 0; i < count; ++i) pd[i] = scalarValue;
    emu::EndInstruction();
}

namespace emu {
inline half ByteAsHalf(uint8_t b) {
    static const std::vector<half> table = [] {
        std::vector<half> t(256);
        for (int i = 0; i < 256; ++i) t[i] = half(i);
        return t;
    }();
    return table[b];
}
}  // namespace emu

template <typename T, typename U>
void Cast(const LocalTensor<T>& dst, const LocalTensor<U>& src, const RoundMode& roundMode, const uint32_t count) {
    constexpr bool intToFloat = std::is_same<T, float>::value && std::is_same<U, int32_t>::value;
    constexpr bool byteToHalf = std::is_same<T, half>::value && std::is_same<U, uint8_t>::value;
    static_assert(intToFloat || byteToHalf, "Cast: only int32_t -> float and uint8_t -> half are modelled");
    if (byteToHalf && roundMode != RoundMode::CAST_NONE) Fail("Cast uint8_t -> half supports CAST_NONE only on A2");
    if (intToFloat && roundMode != RoundMode::CAST_NONE && roundMode != RoundMode::CAST_RINT) {
        Fail("Cast int32_t -> float: only CAST_NONE/CAST_RINT (round to nearest even) are modelled");
    }
    if (count == 0) return;
    const U* ps = emu::VecOperand(src, count, "Cast", "src", false);
    T* pd = emu::VecOperand(dst, count, "Cast", "dst", true);
    emu::CheckOverlap(dst, count, src, count, "Cast", false);
    for (uint32_t i = 0; i < count; ++i) {
        if constexpr (intToFloat) {
            pd[i] = static_cast<float>(ps[i]);
        } else {
            pd[i] = emu::ByteAsHalf(ps[i]);
        }
    }
    emu::EndInstruction();
}

template <typename T, typename U>
void Compare(const LocalTensor<U>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, CMPMODE cmpMode,
             uint32_t count) {
    static_assert(std::is_same<T, float>::value, "Compare: only float is modelled");
    static_assert(std::is_same<U, uint8_t>::value, "Compare: the result is a uint8_t bit mask");
    emu::CheckCompareCount<T>("Compare", count);
    if (count == 0) return;
    const T* pa = emu::VecOperand(src0, count, "Compare", "src0", false);
    const T* pb = emu::VecOperand(src1, count, "Compare", "src1", false);
    uint8_t* pd = emu::VecOperand(dst, count / 8, "Compare", "dst", true);
    emu::CheckOverlap(dst, count / 8, src0, count, "Compare", false);
    emu::CheckOverlap(dst, count / 8, src1, count, "Compare", false);
    for (uint32_t i = 0; i < count / 8; ++i) {
        uint8_t byte = 0;
        for (uint32_t j = 0; j < 8; ++j) {
            byte |= static_cast<uint8_t>(emu::Compared(pa[8 * i + j], pb[8 * i + j], cmpMode) << j);
        }
        pd[i] = byte;
    }
    emu::EndInstruction();
}

template <typename T, typename U>
void Compares(const LocalTensor<U>& dst, const LocalTensor<T>& src0, const T src1Scalar, CMPMODE cmpMode,
              uint32_t count) {
    static_assert(std::is_same<T, float>::value || std::is_same<T, half>::value, "Compares: float or half");
    static_assert(std::is_same<U, uint8_t>::value, "Compares: the result is a uint8_t bit mask");
    emu::CheckCompareCount<T>("Compares", count);
    if (count == 0) return;
    const T* pa = emu::VecOperand(src0, count, "Compares", "src0", false);
    uint8_t* pd = emu::VecOperand(dst, count / 8, "Compares", "dst", true);
    emu::CheckOverlap(dst, count / 8, src0, count, "Compares", false);
    for (uint32_t i = 0; i < count / 8; ++i) {
        uint8_t byte = 0;
        for (uint32_t j = 0; j < 8; ++j) {
            byte |= static_cast<uint8_t>(emu::Compared(pa[8 * i + j], src1Scalar, cmpMode) << j);
        }
        pd[i] = byte;
    }
    emu::EndInstruction();
}

// Mode 1: dst[i] = bit i ? src0[i] : src1 (a scalar).
template <typename T, typename U>
void Select(const LocalTensor<T>& dst, const LocalTensor<U>& selMask, const LocalTensor<T>& src0, T src1,
            SELMODE selMode, uint32_t count) {
    static_assert(std::is_same<T, float>::value, "Select: only float is modelled");
    static_assert(std::is_same<U, uint8_t>::value, "Select: only a uint8_t selMask is modelled");
    if (selMode != SELMODE::VSEL_TENSOR_SCALAR_MODE) Fail("Select with a scalar src1 needs VSEL_TENSOR_SCALAR_MODE");
    if (count == 0) return;
    if (count % 8 != 0) Fail("Select: count must cover whole selMask bytes");
    const uint8_t* pm = emu::VecOperand(selMask, count / 8, "Select", "selMask", false);
    const T* pa = emu::VecOperand(src0, count, "Select", "src0", false);
    T* pd = emu::VecOperand(dst, count, "Select", "dst", true);
    emu::CheckOverlap(dst, count, src0, count, "Select", true);
    emu::CheckOverlap(dst, count, selMask, count / 8, "Select", false);
    for (uint32_t i = 0; i < count; ++i) pd[i] = ((pm[i / 8] >> (i % 8)) & 1u) ? pa[i] : src1;
    emu::EndInstruction();
}

// Mode 2: dst[i] = bit i ? src0[i] : src1[i].
template <typename T, typename U>
void Select(const LocalTensor<T>& dst, const LocalTensor<U>& selMask, const LocalTensor<T>& src0,
            const LocalTensor<T>& src1, SELMODE selMode, uint32_t count) {
    static_assert(std::is_same<T, float>::value, "Select: only float is modelled");
    static_assert(std::is_same<U, uint8_t>::value, "Select: only a uint8_t selMask is modelled");
    if (selMode != SELMODE::VSEL_TENSOR_TENSOR_MODE) {
        Fail("Select of two tensors: only VSEL_TENSOR_TENSOR_MODE is modelled");
    }
    if (count == 0) return;
    if (count % 8 != 0) Fail("Select: count must cover whole selMask bytes");
    const uint8_t* pm = emu::VecOperand(selMask, count / 8, "Select", "selMask", false);
    const T* pa = emu::VecOperand(src0, count, "Select", "src0", false);
    const T* pb = emu::VecOperand(src1, count, "Select", "src1", false);
    T* pd = emu::VecOperand(dst, count, "Select", "dst", true);
    emu::CheckOverlap(dst, count, src0, count, "Select", true);
    emu::CheckOverlap(dst, count, src1, count, "Select", true);
    emu::CheckOverlap(dst, count, selMask, count / 8, "Select", false);
    for (uint32_t i = 0; i < count; ++i) pd[i] = ((pm[i / 8] >> (i % 8)) & 1u) ? pa[i] : pb[i];
    emu::EndInstruction();
}

// ---- Data movement --------------------------------------------------------------

struct DataCopyExtParams {
    uint16_t blockCount = 1;
    uint32_t blockLen = 0;    // bytes
    uint32_t srcStride = 0;
    uint32_t dstStride = 0;
    uint32_t rsv = 0;
    DataCopyExtParams() = default;
    DataCopyExtParams(uint16_t count, uint32_t len, uint32_t srcStrideIn, uint32_t dstStrideIn, uint32_t rsvIn)
        : blockCount(count), blockLen(len), srcStride(srcStrideIn), dstStride(dstStrideIn), rsv(rsvIn) {}
};

template <typename T>
struct DataCopyPadExtParams {
    bool isPad = false;
    uint8_t leftPadding = 0;    // elements
    uint8_t rightPadding = 0;   // elements
    T paddingValue = 0;
    DataCopyPadExtParams() = default;
    DataCopyPadExtParams(bool pad, uint8_t left, uint8_t right, T value)
        : isPad(pad), leftPadding(left), rightPadding(right), paddingValue(value) {}
};

namespace emu {

template <typename T>
void CheckGmAlignment(const GlobalTensor<T>& g, const char* api) {
    if (reinterpret_cast<uintptr_t>(g.EmuAddress()) % sizeof(T) != 0) {
        Fail(std::string(api) + ": GM address is not aligned to sizeof(T)");
    }
}

// MTE2 may only write an allocated, not yet enqueued VECIN queue tensor.
template <typename T>
T* Mte2Destination(const LocalTensor<T>& dst, uint64_t bytes, const char* api) {
    Buffer* b = dst.EmuBuffer();
    if (dst.EmuAddress() % UB_BLOCK != 0) {
        Fail(std::string(api) + ": UB destination at byte " + std::to_string(dst.EmuAddress()) +
             " is not 32-byte aligned");
    }
    if (!b->queued || b->position != TPosition::VECIN || b->state != BufState::ALLOCATED) {
        Fail(std::string(api) + ": GM -> UB copies go into an allocated, not yet enqueued VECIN queue tensor; " +
             b->name + " is not one");
    }
    if (bytes > static_cast<uint64_t>(dst.GetSize()) * sizeof(T)) {
        Fail(std::string(api) + ": " + std::to_string(bytes) + " B do not fit in " + b->name + " from there");
    }
    return Data(dst);
}

// MTE3 reads a dequeued VECOUT tensor, or a VECIN/VECOUT TBuf after the syncs that its writers need.
template <typename T>
const T* Mte3Source(const LocalTensor<T>& src, uint64_t bytes, const char* api) {
    Buffer* b = src.EmuBuffer();
    if (src.EmuAddress() % UB_BLOCK != 0) {
        Fail(std::string(api) + ": UB source at byte " + std::to_string(src.EmuAddress()) + " is not 32-byte aligned");
    }
    if (b->position == TPosition::VECCALC) {
        Fail(std::string(api) + ": UB -> GM copies from VECCALC are not a documented path");
    }
    if (b->queued && b->state != BufState::DEQUEUED) {
        Fail(std::string(api) + ": UB -> GM copy from " + b->name + " before it was enqueued and dequeued");
    }
    if (!b->queued && b->lastVectorWrite > Synced(HardEvent::V_MTE3)) {
        Fail(std::string(api) + ": copy out of " + b->name +
             " after a vector write, without SetFlag/WaitFlag<HardEvent::V_MTE3>");
    }
    if (b->lastScalarWrite > Synced(HardEvent::S_MTE3)) {
        Fail(std::string(api) + ": copy out of " + b->name +
             " after a scalar SetValue, without SetFlag/WaitFlag<HardEvent::S_MTE3>");
    }
    if (bytes > static_cast<uint64_t>(src.GetSize()) * sizeof(T)) {
        Fail(std::string(api) + ": " + std::to_string(bytes) + " B are more than " + b->name + " holds from there");
    }
    b->lastMte3 = ++Core().seq;
    return Data(src);
}

}  // namespace emu

template <typename T>
void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const uint32_t count) {
    const uint64_t bytes = static_cast<uint64_t>(count) * sizeof(T);
    if (bytes % UB_BLOCK != 0) {
        Fail("DataCopy GM -> UB of " + std::to_string(bytes) +
             " B: not a multiple of 32 bytes (use DataCopyPad for a ragged length)");
    }
    emu::CheckGmAlignment(src, "DataCopy");
    src.Check(0, count, "DataCopy");
    std::memcpy(emu::Mte2Destination(dst, bytes, "DataCopy"), src.EmuAddress(), bytes);
    emu::EndInstruction();
}

template <typename T>
void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const uint32_t count) {
    const uint64_t bytes = static_cast<uint64_t>(count) * sizeof(T);
    if (bytes % UB_BLOCK != 0) {
        Fail("DataCopy UB -> GM of " + std::to_string(bytes) +
             " B: not a multiple of 32 bytes (use DataCopyPad for a ragged length)");
    }
    emu::CheckGmAlignment(dst, "DataCopy");
    dst.Check(0, count, "DataCopy");
    std::memcpy(dst.EmuAddress(), emu::Mte3Source(src, bytes, "DataCopy"), bytes);
}

namespace emu {

// The geometry of a DataCopyPad: blockCount blocks of blockLen bytes; on the UB side each block
// starts 32-byte aligned, occupies whole 32-byte blocks and is followed by ubGap blocks; on the
// GM side blocks follow each other with gmGap bytes between them.
struct PadCopyGeometry {
    uint32_t blocks, elems;     // blocks; elements per block
    uint32_t ubBlock;           // UB bytes a block occupies: blockLen (+ right padding) rounded up to 32
    uint32_t ubPitch, gmPitch;  // UB and GM bytes from the start of one block to the next
    uint64_t ubBytes, gmElems;  // the extent touched on each side
};

template <typename T>
PadCopyGeometry PadGeometry(const DataCopyExtParams& p, uint32_t ubGap, uint32_t gmGap, uint32_t rightPadding) {
    if (p.blockCount > 4095) Fail("DataCopyPad: blockCount " + std::to_string(p.blockCount) + " exceeds 4095");
    if (p.blockLen % sizeof(T) != 0) Fail("DataCopyPad: blockLen must be a multiple of sizeof(T)");
    if (gmGap % sizeof(T) != 0) Fail("DataCopyPad: the GM stride must be a multiple of sizeof(T)");
    PadCopyGeometry g;
    g.blocks = p.blockCount;
    g.elems = p.blockLen / sizeof(T);
    g.ubBlock = (p.blockLen + rightPadding * sizeof(T) + UB_BLOCK - 1) / UB_BLOCK * UB_BLOCK;
    g.ubPitch = g.ubBlock + ubGap * UB_BLOCK;
    g.gmPitch = p.blockLen + gmGap;
    g.ubBytes = static_cast<uint64_t>(g.blocks - 1) * g.ubPitch + g.ubBlock;
    g.gmElems = (static_cast<uint64_t>(g.blocks - 1) * g.gmPitch + p.blockLen) / sizeof(T);
    return g;
}

}  // namespace emu

template <typename T>
void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyExtParams& dataCopyParams,
                 const DataCopyPadExtParams<T>& padParams) {
    const DataCopyExtParams& p = dataCopyParams;
    if (p.blockCount == 0 || p.blockLen == 0) return;   // a NOP on A2
    if (padParams.leftPadding != 0) Fail("DataCopyPad: leftPadding is not modelled");
    if (padParams.rightPadding * sizeof(T) > UB_BLOCK) Fail("DataCopyPad: rightPadding may not exceed 32 bytes");
    const emu::PadCopyGeometry g = emu::PadGeometry<T>(p, p.dstStride, p.srcStride, padParams.rightPadding);
    src.Check(0, g.gmElems, "DataCopyPad");
    uint8_t* ub = reinterpret_cast<uint8_t*>(emu::Mte2Destination(dst, g.ubBytes, "DataCopyPad"));
    const uint8_t* gm = reinterpret_cast<const uint8_t*>(src.EmuAddress());
    for (uint32_t b = 0; b < g.blocks; ++b) {
        T* out = reinterpret_cast<T*>(ub + static_cast<uint64_t>(b) * g.ubPitch);
        std::memcpy(out, gm + static_cast<uint64_t>(b) * g.gmPitch, p.blockLen);
        for (uint32_t i = g.elems; i < g.ubBlock / sizeof(T); ++i) {
            if (padParams.isPad) {
                out[i] = padParams.paddingValue;
            } else if (padParams.rightPadding == 0) {
                out[i] = out[0];
            } else {
                std::memset(&out[i], 0xFF, sizeof(T));
            }
        }
    }
    emu::EndInstruction();
}

template <typename T>
void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyExtParams& dataCopyParams) {
    const DataCopyExtParams& p = dataCopyParams;
    if (p.blockCount == 0 || p.blockLen == 0) return;
    const emu::PadCopyGeometry g = emu::PadGeometry<T>(p, p.srcStride, p.dstStride, 0);
    dst.Check(0, g.gmElems, "DataCopyPad");
    const uint8_t* ub = reinterpret_cast<const uint8_t*>(emu::Mte3Source(src, g.ubBytes, "DataCopyPad"));
    uint8_t* gm = reinterpret_cast<uint8_t*>(dst.EmuAddress());
    for (uint32_t b = 0; b < g.blocks; ++b) {
        std::memcpy(gm + static_cast<uint64_t>(b) * g.gmPitch, ub + static_cast<uint64_t>(b) * g.ubPitch, p.blockLen);
    }
}

// ---- Gather (within UB) ----------------------------------------------------------

template <typename T>
void Gather(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<uint32_t>& srcOffset,
            const uint32_t srcBaseAddr, const uint32_t count) {
    static_assert(std::is_same<T, float>::value, "Gather: only float is modelled");
    if (count == 0) return;
    const uint8_t* ps = reinterpret_cast<const uint8_t*>(emu::VecOperand(src, 0, "Gather", "src", false));
    const uint32_t* po = emu::VecOperand(srcOffset, count, "Gather", "srcOffset", false);
    T* pd = emu::VecOperand(dst, count, "Gather", "dst", true);
    emu::CheckOverlap(dst, count, src, src.GetSize(), "Gather", false);
    emu::CheckOverlap(dst, count, srcOffset, count, "Gather", false);
    const uint64_t srcBytes = static_cast<uint64_t>(src.GetSize()) * sizeof(T);
    for (uint32_t i = 0; i < count; ++i) {
        const uint64_t at = static_cast<uint64_t>(srcBaseAddr) + po[i];
        if (at % sizeof(T) != 0 || at + sizeof(T) > srcBytes) {
            Fail("Gather: offset " + std::to_string(at) + " B of element " + std::to_string(i) +
                 " is misaligned or outside src (" + std::to_string(srcBytes) + " B)");
        }
        std::memcpy(&pd[i], ps + at, sizeof(T));
    }
    emu::EndInstruction();
}

// ---- The Cube unit (Atlas A2): GM -> L1, L1 -> L0A/L0B, Mmad, L0C -> GM --------------

struct DataCopyParams {
    uint16_t blockCount = 1;
    uint16_t blockLen = 0;    // 32-byte blocks
    uint16_t srcStride = 0;   // gap between runs, 32-byte blocks
    uint16_t dstStride = 0;
    DataCopyParams() = default;
    DataCopyParams(uint16_t count, uint16_t len, uint16_t srcStrideIn, uint16_t dstStrideIn)
        : blockCount(count), blockLen(len), srcStride(srcStrideIn), dstStride(dstStrideIn) {}
};

struct LoadData2DParams {
    uint16_t startIndex = 0;  // first source fractal
    uint8_t repeatTimes = 0;  // fractals copied
    uint16_t srcStride = 0;   // fractals between consecutive source fractals
    uint8_t sid = 0;
    uint16_t dstGap = 0;      // fractals left between destination fractals (only 0 is modelled)
    bool ifTranspose = false; // only false is modelled
    uint8_t addrMode = 0;
};

struct MmadParams {
    uint16_t m = 0;
    uint16_t n = 0;
    uint16_t k = 0;
    bool isBias = false;          // only false is modelled
    int32_t fmOffset = 0;
    bool enSsparse = false;
    bool enWinogradA = false;
    bool enWinogradB = false;
    uint8_t unitFlag = 0;
    bool kDirectionAlign = false;
    bool cmatrixSource = false;   // only false (C from L0C) is modelled
    bool cmatrixInitVal = true;   // true: C = A.B; false: C += A.B
};

// The row-major (NZ -> ND) form without quantisation; the other fields of the real struct are not modelled.
struct FixpipeParamsV220 {
    uint16_t nSize = 0;
    uint16_t mSize = 0;
    uint16_t srcStride = 0;   // L0C: rows of the source matrix (its M, a multiple of 16)
    uint32_t dstStride = 0;   // GM: elements between rows
    FixpipeParamsV220() = default;
    FixpipeParamsV220(uint16_t n, uint16_t m, uint16_t src, uint32_t dst)
        : nSize(n), mSize(m), srcStride(src), dstStride(dst) {}
};

namespace emu {

constexpr uint32_t FRACTAL_BYTES = 512;   // an L0A/L0B int8 fractal (16 x 32 or 32 x 16)
constexpr uint32_t L0C_FRACTAL = 256;     // an L0C int32 fractal (16 x 16)

// A Cube operand at `position` in queue state `state` (what the pipeline guarantees between the stages).
template <typename T>
Buffer* CubeOperand(const LocalTensor<T>& t, std::initializer_list<TPosition> positions, BufState state,
                    const char* api, const char* role) {
    Buffer* b = t.EmuBuffer();
    bool ok = false;
    for (TPosition p : positions) ok = ok || b->position == p;
    if (!ok) Fail(std::string(api) + ": " + role + " is " + b->name + ", not at the position this path takes");
    if (!b->queued || b->state != state) {
        Fail(std::string(api) + ": " + role + " " + b->name + " is not " +
             (state == BufState::ALLOCATED ? "allocated and not yet enqueued" : "dequeued") + " (the stage order)");
    }
    return b;
}

inline uint32_t InMemory(uint32_t address) {   // an address relative to the start of its L1/L0 memory
    return address >= L0C_BASE ? address - L0C_BASE : address >= L0B_BASE ? address - L0B_BASE
         : address >= L0A_BASE ? address - L0A_BASE : address - L1_BASE;
}

}  // namespace emu

// GM -> L1 (A1/B1): blockCount runs of blockLen 32-byte blocks, the gaps srcStride (GM) and dstStride (L1).
template <typename T>
void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyParams& p) {
    emu::CubeOperand(dst, {TPosition::A1, TPosition::B1}, emu::BufState::ALLOCATED, "DataCopy", "dst");
    if (dst.EmuAddress() % UB_BLOCK != 0) Fail("DataCopy GM -> L1: destination not 32-byte aligned");
    const uint64_t run = static_cast<uint64_t>(p.blockLen) * UB_BLOCK;
    const uint64_t srcPitch = run + static_cast<uint64_t>(p.srcStride) * UB_BLOCK;
    const uint64_t dstPitch = run + static_cast<uint64_t>(p.dstStride) * UB_BLOCK;
    if (p.blockCount == 0 || p.blockLen == 0) return;
    const uint64_t srcBytes = (p.blockCount - 1) * srcPitch + run;
    if ((p.blockCount - 1) * dstPitch + run > static_cast<uint64_t>(dst.GetSize()) * sizeof(T)) {
        Fail("DataCopy GM -> L1: the runs do not fit in the destination");
    }
    if (srcBytes % sizeof(T) != 0) Fail("DataCopy GM -> L1: not a whole number of elements");
    src.Check(0, srcBytes / sizeof(T), "DataCopy");
    const uint8_t* gm = reinterpret_cast<const uint8_t*>(src.EmuAddress());
    uint8_t* l1 = reinterpret_cast<uint8_t*>(emu::Data(dst));
    for (uint32_t b = 0; b < p.blockCount; ++b) std::memcpy(l1 + b * dstPitch, gm + b * srcPitch, run);
    emu::EndInstruction();
}

// L1 -> L0A (A1 -> A2) or L0B (B1 -> B2), 2D: fractals of 512 B, bits unchanged.
template <typename T>
void LoadData(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LoadData2DParams& p) {
    static_assert(sizeof(T) == 1, "LoadData: only int8 fractals are modelled");
    emu::Buffer* d = emu::CubeOperand(dst, {TPosition::A2, TPosition::B2}, emu::BufState::ALLOCATED, "LoadData",
                                      "dst");
    emu::Buffer* s = emu::CubeOperand(src, {TPosition::A1, TPosition::B1}, emu::BufState::DEQUEUED, "LoadData", "src");
    if ((d->position == TPosition::A2) != (s->position == TPosition::A1)) {
        Fail("LoadData: L1 -> L0A takes an A1 source, L1 -> L0B a B1 source");
    }
    if (p.ifTranspose || p.dstGap != 0) Fail("LoadData: only ifTranspose = false, dstGap = 0 are modelled");
    if (emu::InMemory(dst.EmuAddress()) % emu::FRACTAL_BYTES != 0 || src.EmuAddress() % UB_BLOCK != 0) {
        Fail("LoadData: destination not 512-byte aligned in L0, or source not 32-byte aligned in L1");
    }
    const uint64_t last = (static_cast<uint64_t>(p.startIndex) + (p.repeatTimes ? p.repeatTimes - 1 : 0) * p.srcStride
                           + 1) * emu::FRACTAL_BYTES;
    if (p.repeatTimes == 0) return;
    if (last > src.GetSize() || static_cast<uint64_t>(p.repeatTimes) * emu::FRACTAL_BYTES > dst.GetSize()) {
        Fail("LoadData: fractals outside the source or the destination");
    }
    const uint8_t* from = reinterpret_cast<const uint8_t*>(emu::Data(src));
    uint8_t* to = reinterpret_cast<uint8_t*>(emu::Data(dst));
    for (uint32_t i = 0; i < p.repeatTimes; ++i) {
        std::memcpy(to + i * emu::FRACTAL_BYTES,
                    from + (static_cast<uint64_t>(p.startIndex) + static_cast<uint64_t>(i) * p.srcStride) *
                               emu::FRACTAL_BYTES, emu::FRACTAL_BYTES);
    }
    emu::EndInstruction();
}

// int8 x int8 -> int32 on the Cube unit, exactly, in the fractal layouts of L0A, L0B and L0C (see the header).
template <typename T, typename U, typename S>
void Mmad(const LocalTensor<T>& dst, const LocalTensor<U>& fm, const LocalTensor<S>& filter, const MmadParams& p) {
    static_assert(std::is_same<T, int32_t>::value && std::is_same<U, int8_t>::value && std::is_same<S, int8_t>::value,
                  "Mmad: only int8 x int8 -> int32 is modelled");
    emu::CubeOperand(dst, {TPosition::CO1}, emu::BufState::ALLOCATED, "Mmad", "dst");
    emu::CubeOperand(fm, {TPosition::A2}, emu::BufState::DEQUEUED, "Mmad", "fm (A)");
    emu::CubeOperand(filter, {TPosition::B2}, emu::BufState::DEQUEUED, "Mmad", "filter (B)");
    if (p.m == 0 || p.n == 0 || p.k == 0 || p.m > 4095 || p.n > 4095 || p.k > 4095) {
        Fail("Mmad: m, n, k must lie in 1 .. 4095; got " + std::to_string(p.m) + ", " + std::to_string(p.n) + ", " +
             std::to_string(p.k));
    }
    if (p.isBias || p.cmatrixSource || p.fmOffset != 0 || p.enSsparse || p.enWinogradA || p.enWinogradB) {
        Fail("Mmad: bias tables, C sources, offsets, sparsity and Winograd are not modelled");
    }
    if (emu::InMemory(dst.EmuAddress()) % (emu::L0C_FRACTAL * sizeof(int32_t)) != 0) {
        Fail("Mmad: dst is not 256-element aligned in L0C");
    }
    if (emu::InMemory(fm.EmuAddress()) % emu::FRACTAL_BYTES != 0 ||
        emu::InMemory(filter.EmuAddress()) % emu::FRACTAL_BYTES != 0) {
        Fail("Mmad: A and B must start 512-byte aligned in L0A and L0B");
    }
    const uint32_t m1 = (p.m + 15) / 16, n1 = (p.n + 15) / 16, k1 = (p.k + 31) / 32;
    const bool gemv = p.m == 1;   // A read as ND
    if ((gemv ? p.k : static_cast<uint64_t>(m1) * k1 * emu::FRACTAL_BYTES) > fm.GetSize() ||
        static_cast<uint64_t>(k1) * n1 * emu::FRACTAL_BYTES > filter.GetSize() ||
        static_cast<uint64_t>(m1) * n1 * emu::L0C_FRACTAL > dst.GetSize()) {
        Fail("Mmad: the operands' fractals lie outside their tensors");
    }
    const int8_t* a = emu::Data(fm);
    const int8_t* b = emu::Data(filter);
    int32_t* c = emu::Data(dst);
    for (uint32_t i = 0; i < p.m; ++i) {
        for (uint32_t j = 0; j < p.n; ++j) {
            int64_t sum = 0;
            for (uint32_t l = 0; l < p.k; ++l) {
                const uint64_t ai = gemv ? l : (static_cast<uint64_t>(i / 16) * k1 + l / 32) * emu::FRACTAL_BYTES +
                                                   (i % 16) * 32 + l % 32;
                const uint64_t bi = (static_cast<uint64_t>(l / 32) * n1 + j / 16) * emu::FRACTAL_BYTES +
                                    (j % 16) * 32 + l % 32;
                sum += static_cast<int64_t>(a[ai]) * b[bi];
            }
            int32_t& out = c[(static_cast<uint64_t>(j / 16) * m1 + i / 16) * emu::L0C_FRACTAL + (i % 16) * 16 + j % 16];
            const int64_t total = p.cmatrixInitVal ? sum : sum + out;
            if (total < INT32_MIN || total > INT32_MAX) {
                Fail("Mmad: an int32 accumulator left int32 (overflow is undocumented on A2; keep sums in range)");
            }
            out = static_cast<int32_t>(total);
        }
    }
    emu::EndInstruction();
}

// L0C -> GM through the fixpipe, int32 -> int32 (no quantisation), NZ -> ND.
template <typename T, typename U>
void Fixpipe(const GlobalTensor<T>& dst, const LocalTensor<U>& src, const FixpipeParamsV220& p) {
    static_assert(std::is_same<T, int32_t>::value && std::is_same<U, int32_t>::value,
                  "Fixpipe: only int32 -> int32 without quantisation is modelled");
    emu::CubeOperand(src, {TPosition::CO1}, emu::BufState::DEQUEUED, "Fixpipe", "src");
    if (p.mSize == 0 || p.nSize == 0) return;
    if (p.srcStride % 16 != 0 || p.srcStride < p.mSize || p.dstStride < p.nSize) {
        Fail("Fixpipe: srcStride must be a multiple of 16 of at least mSize, dstStride at least nSize");
    }
    const uint32_t m1 = p.srcStride / 16, n1 = (p.nSize + 15) / 16;
    if (static_cast<uint64_t>(m1) * n1 * emu::L0C_FRACTAL > src.GetSize()) Fail("Fixpipe: source outside L0C tensor");
    dst.Check(0, static_cast<uint64_t>(p.mSize - 1) * p.dstStride + p.nSize, "Fixpipe");
    const int32_t* c = emu::Data(src);
    for (uint32_t i = 0; i < p.mSize; ++i) {
        for (uint32_t j = 0; j < p.nSize; ++j) {
            dst.EmuAddress()[static_cast<uint64_t>(i) * p.dstStride + j] =
                c[(static_cast<uint64_t>(j / 16) * m1 + i / 16) * emu::L0C_FRACTAL + (i % 16) * 16 + j % 16];
        }
    }
    emu::EndInstruction();
}

}  // namespace AscendC

// ---- Launch (emulation/runtime.cpp) ------------------------------------------------

namespace bp_emulation {

// Runs kernel() once per block 0..blocks-1, one after another, each on a fresh
// AI core (an empty, poisoned Unified Buffer).  Returns 0, or 1 with the first
// violation recorded for bp_emulation_last_error().
template <typename Kernel>
int Launch(uint32_t blocks, Kernel kernel);

int RunBlocks(uint32_t blocks, void (*body)(void*), void* context);

template <typename Kernel>
int Launch(uint32_t blocks, Kernel kernel) {
    return RunBlocks(blocks, [](void* k) { (*static_cast<Kernel*>(k))(); }, &kernel);
}

}  // namespace bp_emulation

#endif  // BITPARITY_EMULATED_KERNEL_OPERATOR_H
