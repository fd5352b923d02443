// The emulated launch: AI cores run one after another on the host.  A test double, not an NPU.
//
// Each block gets a fresh CoreState (an empty Unified Buffer filled with 0xFF
// poison, no buffers, no pending events), runs the kernel body, and is then
// checked for what the hardware would leave broken: queue tensors still
// allocated and SetFlags never waited for.  The first violation stops the
// launch; its message, prefixed with the block index, is kept for
// bp_emulation_last_error().

#include <string>

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "kernel_operator.h"

namespace {

thread_local std::string lastError;

// The A2 assumption being modelled: IEEE binary32 with round-to-nearest-even and
// subnormals kept.  The host's SSE control word could have been changed by
// another library in the process (flush-to-zero, denormals-are-zero, another
// rounding mode), so it is set for the launch and restored afterwards.
class HostFloatMode {
public:
#if defined(__SSE__) || defined(__x86_64__)
    HostFloatMode() : saved_(_mm_getcsr()) { _mm_setcsr(0x1F80u); }   // all exceptions masked, RNE, no FTZ/DAZ
    ~HostFloatMode() { _mm_setcsr(saved_); }

private:
    unsigned int saved_;
#endif
};

void CheckKernelEnd(const AscendC::emu::CoreState& c) {
    for (const AscendC::emu::Buffer& b : c.buffers) {
        if (b.queued && b.state != AscendC::emu::BufState::FREE) {
            AscendC::Fail(b.name + " is still allocated when the kernel returns (a leaked queue tensor)");
        }
    }
    for (int e = 0; e < static_cast<int>(AscendC::HardEvent::COUNT); ++e) {
        for (int id = 0; id < AscendC::EVENT_IDS; ++id) {
            if (c.flagSet[e][id]) {
                AscendC::Fail(std::string("SetFlag<") + AscendC::emu::EventName(static_cast<AscendC::HardEvent>(e)) +
                              ">(" + std::to_string(id) + ") was never waited for");
            }
        }
    }
}

}  // namespace

namespace bp_emulation {

int RunBlocks(uint32_t blocks, void (*body)(void*), void* context) {
    HostFloatMode floatMode;
    lastError.clear();
    for (uint32_t b = 0; b < blocks; ++b) {
        AscendC::emu::CoreState state;
        state.blockIdx = b;
        state.blockNum = blocks;
        AscendC::emu::core = &state;
        try {
            body(context);
            CheckKernelEnd(state);
        } catch (const std::exception& err) {
            AscendC::emu::core = nullptr;
            lastError = "block " + std::to_string(b) + " of " + std::to_string(blocks) + ": " + err.what();
            return 1;
        }
        AscendC::emu::core = nullptr;
    }
    return 0;
}

}  // namespace bp_emulation

extern "C" const char* bp_emulation_last_error() { return lastError.c_str(); }
