"""The Ascend C host emulation: that it enforces the A2 constraints it claims, and what only this backend has.

The emulation is a test double for an Atlas A2 AI core, not an NPU.  Its value
rests on refusing what the hardware would get wrong, so each constraint has a
tiny deliberately broken kernel below that must fail with the right message,
next to a well-formed kernel that must pass.  The generated constants header
is checked for drift from spec.py; the kernel sources' API subset (vendor math
included) is checked in test_ascend_build.py.
"""

import ctypes
import re
import shutil

import numpy as np
import pytest
import torch

from bitparity import spec
from bitparity.backends import ascend
from bitparity.backends.ascend import host_emulation, npu_ops, spec_header
from bitparity.reference import canonical

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")

def test_spec_constants_header_is_generated_from_spec():
    assert spec_header.HEADER.read_text() == spec_header.render(), (
        "kernels/spec_constants.h is stale: run python -m bitparity.backends.ascend.spec_header")


# ---- Deliberately broken kernels ------------------------------------------------------

MISUSE_SOURCE = r"""
#include "kernel_operator.h"

using namespace AscendC;

namespace {

constexpr uint32_t N = 64;
float gmIn[4 * N];
float gmOut[4 * N];

template <typename Body>
int Run(Body body) { return bp_emulation::Launch(1, body); }

struct Pipeline {
    TPipe pipe;
    TQue<TPosition::VECIN, 1> in;
    TQue<TPosition::VECOUT, 1> out;
    GlobalTensor<float> src, dst;
    Pipeline() {
        pipe.InitBuffer(in, 1, N * sizeof(float));
        pipe.InitBuffer(out, 1, N * sizeof(float));
        src.SetGlobalBuffer(gmIn, 4 * N);
        dst.SetGlobalBuffer(gmOut, 4 * N);
    }
};

}  // namespace

extern "C" {

int well_formed() {
    return Run([] {
        Pipeline p;
        LocalTensor<float> x = p.in.AllocTensor<float>();
        DataCopy(x, p.src, N);
        p.in.EnQue(x);
        x = p.in.DeQue<float>();
        LocalTensor<float> y = p.out.AllocTensor<float>();
        Adds(y, x, 1.0f, N);
        p.out.EnQue(y);
        p.in.FreeTensor(x);
        y = p.out.DeQue<float>();
        DataCopy(p.dst, y, N);
        p.out.FreeTensor(y);
    });
}

int misaligned_ub_copy() {
    return Run([] {
        Pipeline p;
        LocalTensor<float> x = p.in.AllocTensor<float>();
        DataCopy(x[4], p.src, 8);
        p.in.FreeTensor(x);
    });
}

int ragged_copy() {
    return Run([] {
        Pipeline p;
        LocalTensor<float> x = p.in.AllocTensor<float>();
        DataCopy(x, p.src, 10);
        p.in.FreeTensor(x);
    });
}

int ub_overflow() {
    return Run([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> a, b;
        pipe.InitBuffer(a, 120 * 1024);
        pipe.InitBuffer(b, 70 * 1024);
    });
}

int too_many_queue_buffers() {
    return Run([] {
        TPipe pipe;
        TQue<TPosition::VECIN, 1> a, b;
        pipe.InitBuffer(a, 5, 256);
        pipe.InitBuffer(b, 4, 256);
    });
}

int deque_before_enque() {
    return Run([] {
        Pipeline p;
        LocalTensor<float> x = p.in.AllocTensor<float>();
        LocalTensor<float> y = p.in.DeQue<float>();
        p.in.FreeTensor(x);
        (void)y;
    });
}

int alloc_beyond_buffers() {
    return Run([] {
        Pipeline p;
        LocalTensor<float> x = p.in.AllocTensor<float>();
        LocalTensor<float> y = p.in.AllocTensor<float>();
        p.in.FreeTensor(x);
        p.in.FreeTensor(y);
    });
}

int enque_beyond_depth() {
    return Run([] {
        TPipe pipe;
        TQue<TPosition::VECIN, 1> q;
        pipe.InitBuffer(q, 2, N * sizeof(float));
        LocalTensor<float> x = q.AllocTensor<float>();
        LocalTensor<float> y = q.AllocTensor<float>();
        q.EnQue(x);
        q.EnQue(y);
    });
}

int double_free() {
    return Run([] {
        Pipeline p;
        LocalTensor<float> x = p.in.AllocTensor<float>();
        p.in.FreeTensor(x);
        p.in.FreeTensor(x);
    });
}

int free_foreign_tensor() {
    return Run([] {
        Pipeline p;
        LocalTensor<float> y = p.out.AllocTensor<float>();
        p.in.FreeTensor(y);
    });
}

int leak() {
    return Run([] {
        Pipeline p;
        LocalTensor<float> x = p.in.AllocTensor<float>();
        (void)x;
    });
}

int vector_read_before_deque() {
    return Run([] {
        Pipeline p;
        LocalTensor<float> x = p.in.AllocTensor<float>();
        DataCopy(x, p.src, N);
        LocalTensor<float> y = p.out.AllocTensor<float>();
        Adds(y, x, 1.0f, N);
        p.in.FreeTensor(x);
        p.out.FreeTensor(y);
    });
}

int local_out_of_bounds() {
    return Run([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, N * sizeof(float));
        LocalTensor<float> t = buf.Get<float>();
        Duplicate(t, 0.0f, 2 * N);
    });
}

int partial_overlap() {
    return Run([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 4 * N * sizeof(float));
        LocalTensor<float> t = buf.Get<float>();
        Duplicate(t, 1.0f, 4 * N);
        Add(t[8], t, t, N);
    });
}

int compare_partial_repeat() {
    return Run([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf, bits;
        pipe.InitBuffer(buf, N * sizeof(float));
        pipe.InitBuffer(bits, N / 8);
        LocalTensor<float> t = buf.Get<float>();
        Duplicate(t, 1.0f, N);
        Compares(bits.Get<uint8_t>(), t, 0.0f, CMPMODE::LT, 32);
    });
}

int scalar_read_without_sync() {
    return Run([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, N * sizeof(float));
        LocalTensor<float> t = buf.Get<float>();
        Duplicate(t, 1.0f, N);
        (void)t.GetValue(0);
    });
}

int vector_after_scalar_without_sync() {
    return Run([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, N * sizeof(float));
        LocalTensor<float> t = buf.Get<float>();
        t.SetValue(0, 1.0f);
        Duplicate(t, 1.0f, N);
    });
}

int wait_without_set() {
    return Run([] {
        TPipe pipe;
        WaitFlag<HardEvent::V_S>(0);
    });
}

int set_without_wait() {
    return Run([] {
        TPipe pipe;
        SetFlag<HardEvent::S_V>(1);
    });
}

// Four runs of 5 floats at a GM pitch of 13 land in UB at a pitch of 8 (each run padded
// to one 32-byte block), are transposed to [5, 4] by Gather, and leave again at a GM
// pitch of 11.
int strided_copy_and_gather() {
    return Run([] {
        Pipeline p;
        for (uint32_t i = 0; i < 4 * N; ++i) gmIn[i] = static_cast<float>(i);
        TBuf<TPosition::VECCALC> offsets, gathered;
        p.pipe.InitBuffer(offsets, N * sizeof(uint32_t));
        p.pipe.InitBuffer(gathered, N * sizeof(float));
        LocalTensor<float> x = p.in.AllocTensor<float>();
        DataCopyPad(x, p.src, DataCopyExtParams{4, 5 * sizeof(float), 8 * sizeof(float), 0, 0},
                    DataCopyPadExtParams<float>{false, 0, 0, 0.0f});
        p.in.EnQue(x);
        x = p.in.DeQue<float>();
        LocalTensor<uint32_t> off = offsets.Get<uint32_t>();
        for (uint32_t i = 0; i < N; ++i) off.SetValue(i, ((i % 4) * 8 + (i / 4) % 5) * sizeof(float));
        SetFlag<HardEvent::S_V>(0);
        WaitFlag<HardEvent::S_V>(0);
        LocalTensor<float> g = gathered.Get<float>();
        Gather(g, x, off, 0, N);
        LocalTensor<float> y = p.out.AllocTensor<float>();
        Muls(y, x, 1.0f, N);
        SetFlag<HardEvent::V_S>(0);
        WaitFlag<HardEvent::V_S>(0);
        for (uint32_t r = 0; r < 4; ++r) {
            for (uint32_t c = 0; c < 5; ++c) {
                if (g.GetValue(c * 4 + r) != gmIn[r * 13 + c]) Fail("Gather moved the wrong elements");
            }
            if (x.GetValue(r * 8 + 5) != gmIn[r * 13]) Fail("a run's dummy padding is not its first element");
        }
        p.out.EnQue(y);
        p.in.FreeTensor(x);
        y = p.out.DeQue<float>();
        DataCopyPad(p.dst, y, DataCopyExtParams{4, 5 * sizeof(float), 0, 6 * sizeof(float), 0});
        p.out.FreeTensor(y);
        for (uint32_t r = 0; r < 4; ++r) {
            for (uint32_t c = 0; c < 5; ++c) {
                if (gmOut[r * 11 + c] != gmIn[r * 13 + c]) Fail("strided DataCopyPad moved the wrong elements");
            }
        }
    });
}

int strided_copy_overflows_tensor() {
    return Run([] {
        Pipeline p;
        LocalTensor<float> x = p.in.AllocTensor<float>();
        DataCopyPad(x, p.src, DataCopyExtParams{4, 5 * sizeof(float), 0, 2, 0},
                    DataCopyPadExtParams<float>{false, 0, 0, 0.0f});
        p.in.FreeTensor(x);
    });
}

int gather_outside_src() {
    return Run([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> src, dst, offsets;
        pipe.InitBuffer(src, N * sizeof(float));
        pipe.InitBuffer(dst, N * sizeof(float));
        pipe.InitBuffer(offsets, N * sizeof(uint32_t));
        Duplicate(src.Get<float>(), 1.0f, N);
        Duplicate(offsets.Get<uint32_t>().ReinterpretCast<int32_t>(), static_cast<int32_t>(N * sizeof(float)), N);
        Gather(dst.Get<float>(), src.Get<float>(), offsets.Get<uint32_t>(), 0, N);
    });
}

int copy_out_before_enque() {
    return Run([] {
        Pipeline p;
        LocalTensor<float> y = p.out.AllocTensor<float>();
        Duplicate(y, 1.0f, N);
        DataCopy(p.dst, y, N);
        p.out.FreeTensor(y);
    });
}

}  // extern "C"
"""

MISUSES = {
    "misaligned_ub_copy": r"not 32-byte aligned",
    "ragged_copy": r"not a multiple of 32 bytes",
    "ub_overflow": r"Unified Buffer",
    "too_many_queue_buffers": r"more than 8 queue buffers",
    "deque_before_enque": r"DeQue before EnQue",
    "alloc_beyond_buffers": r"buffers are in use",
    "enque_beyond_depth": r"beyond its depth",
    "double_free": r"not allocated",
    "free_foreign_tensor": r"did not allocate",
    "leak": r"leaked",
    "vector_read_before_deque": r"DeQue",
    "local_out_of_bounds": r"needs 128 elements",
    "partial_overlap": r"partially overlaps",
    "compare_partial_repeat": r"256-byte repeats",
    "scalar_read_without_sync": r"HardEvent::V_S",
    "vector_after_scalar_without_sync": r"HardEvent::S_V",
    "wait_without_set": r"waits forever",
    "set_without_wait": r"never waited for",
    "copy_out_before_enque": r"enqueued and dequeued",
    "strided_copy_overflows_tensor": r"do not fit",
    "gather_outside_src": r"outside src",
}


@pytest.fixture(scope="module")
def misuse(tmp_path_factory):
    source = tmp_path_factory.mktemp("ascend") / "ascend_misuse_kernels.cpp"
    source.write_text(MISUSE_SOURCE)
    lib = ctypes.CDLL(str(host_emulation.build("bitparity_ascend_misuse", [source])))
    lib.bp_emulation_last_error.restype = ctypes.c_char_p

    def run(name):
        status = getattr(lib, name)()
        return status, lib.bp_emulation_last_error().decode()
    return run


def test_well_formed_kernel_passes(misuse):
    assert misuse("well_formed") == (0, "")


def test_strided_copy_and_gather_move_the_documented_elements(misuse):
    assert misuse("strided_copy_and_gather") == (0, "")


@pytest.mark.parametrize("name", sorted(MISUSES))
def test_broken_kernel_fails(misuse, name):
    status, message = misuse(name)
    assert status == 1, f"{name} ran without error"
    assert re.search(MISUSES[name], message), message


# ---- Properties of this backend --------------------------------------------------

def _bits(t):
    t = t.clone()
    t[t.isnan()] = float("nan")
    return t.view(torch.int32)


def _case(rows, n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=g) * 4
    x[0, : n // 3] = float("-inf")
    mask = torch.rand(rows, n, generator=g) < 0.8
    mask[-1] = False
    tokens = torch.randint(0, n, (rows,), generator=g)
    return x, mask, tokens


@pytest.mark.parametrize("n", (70, 16385))
def test_core_count_changes_no_bit(n):
    """Rows are split over however many AI cores run; each row's bits must not move."""
    x, mask, tokens = _case(9, n, seed=n)
    scale = 1 / torch.linspace(0.5, 1.5, 9)             # each row its own, so a core reading another row's shows
    runs = {}
    for blocks in (1, 4, 9, 40):
        runs[blocks] = [
            host_emulation.row_op("sum", x, mask, blocks=blocks),
            host_emulation.row_op("logsumexp", x, mask, scale, blocks=blocks),
            host_emulation.row_op("entropy", x, None, scale, blocks=blocks),
            host_emulation.row_op("token_logprobs", x, tokens, scale, blocks=blocks),
            host_emulation.map_op("log_softmax", x, mask, scale, blocks=blocks),
            host_emulation.map_op("softmax", x, None, scale, blocks=blocks),
            host_emulation.elementwise("exp", x.flatten(), blocks=blocks),
        ]
    for blocks, results in runs.items():
        for got, want in zip(results, runs[1]):
            assert torch.equal(_bits(got), _bits(want)), f"{blocks} cores differ from 1"


@pytest.mark.parametrize("n", (1, 129, 1100, 16385))
def test_emulated_kernels_give_the_canonical_bits(n):
    """A quick self-check of every op; tests/backends/test_bit_identity.py is the full comparison."""
    x, mask, tokens = _case(3, n, seed=7 * n)
    xs, ms = x.numpy(), mask.numpy()
    with np.errstate(all="ignore"):
        scale = torch.tensor([0.5, 2.0, 1.25])                 # one per row
        for op in ("logsumexp", "entropy"):
            want = torch.from_numpy(getattr(canonical, op)(xs, ms, scale.numpy()))
            assert torch.equal(_bits(host_emulation.row_op(op, x, mask, scale)), _bits(want)), op
        for op in ("log_softmax", "softmax"):
            want = torch.from_numpy(getattr(canonical, op)(xs, ms, scale.numpy()))
            assert torch.equal(_bits(host_emulation.map_op(op, x, mask, scale)), _bits(want)), op
        want = torch.from_numpy(canonical.sum(xs, ms))
        assert torch.equal(_bits(host_emulation.row_op("sum", x, mask)), _bits(want))
        want = torch.from_numpy(canonical.token_logprobs(xs, tokens.numpy(), scale.numpy()))
        assert torch.equal(_bits(host_emulation.row_op("token_logprobs", x, tokens, scale)), _bits(want))
        flat = x.flatten()
        for op in ("exp", "log"):
            want = torch.from_numpy(getattr(canonical, op)(flat.numpy()))
            assert torch.equal(_bits(host_emulation.elementwise(op, flat)), _bits(want)), op


def test_availability_says_what_runs():
    available, reason = ascend.availability()
    assert available, reason
    assert ("on the NPU" in reason) if npu_ops.npu_present() else ("a test double: not an NPU" in reason)


@pytest.mark.parametrize("rows,cols", ((9, 70), (130, 33), (3, 16385)))
def test_rl_kernels_core_count_changes_no_bit(rows, cols):
    """GAE puts 64 rows in a vector's lanes and the rows' shares on cores; the other RL kernels spread rows or
    tiles.  No core count may move a bit, and one core must give the canonical bits (130 rows: tiles of 64,
    64 and 2; 16385 steps: a last time block of one step)."""
    g = torch.Generator().manual_seed(rows * cols)
    x, y, z = (torch.randn(rows, cols, generator=g) for _ in range(3))
    x[0, ::5] = float("nan")
    mask = torch.rand(rows, cols, generator=g) < 0.7
    boot = torch.randn(rows, generator=g)
    gamma, gl = 0.99, float(np.float32(0.99) * np.float32(0.95))
    runs = {}
    for blocks in (1, 4, 9, 40):
        runs[blocks] = [
            host_emulation.row_op("masked_mean", x, mask, blocks=blocks),
            host_emulation.masked_whiten(x, mask, True, True, 1e-8, 0, blocks=blocks),
            host_emulation.masked_whiten(x, mask, False, True, 1.0, 1, blocks=blocks),
            host_emulation.kl_penalty(x.flatten(), y.flatten(), 2, 10.0, 20.0, blocks=blocks),
            *host_emulation.gae(x, y, mask, boot, gamma, gl, False, blocks=blocks),
            *host_emulation.gae(x, y, mask, boot, gamma, gl, True, blocks=blocks),
            *host_emulation.ppo_token_losses(x * 0.1, y * 0.1, z, 0.8, 1.28, 3.0, 20.0, blocks=blocks),
        ]
    xs, ys, zs, ms = x.numpy(), y.numpy(), z.numpy(), mask.numpy()
    with np.errstate(all="ignore"):
        loss, clipped = canonical.ppo_token_losses(xs * np.float32(0.1), ys * np.float32(0.1), zs, 0.8, 1.28, 3.0, 20.0)
        want = [
            canonical.masked_mean(xs, ms),
            canonical.masked_whiten(xs, ms, True, True, np.float32(1e-8), "add"),
            canonical.masked_whiten(xs, ms, False, True, np.float32(1.0), "clamp"),
            canonical.kl_penalty(xs.flatten(), ys.flatten(), "k3", 10.0, 20.0),
            *canonical.gae(xs, ys, ms, boot.numpy(), np.float32(gamma), np.float32(gl), "carry"),
            *canonical.gae(xs, ys, ms, boot.numpy(), np.float32(gamma), np.float32(gl), "zero"),
            loss, clipped.astype(np.float32),
        ]
    for got, expected in zip(runs[1], want):
        assert torch.equal(_bits(got), _bits(torch.from_numpy(np.ascontiguousarray(expected)))), "1 core vs canonical"
    for blocks, results in runs.items():
        for got, first in zip(results, runs[1]):
            assert torch.equal(_bits(got), _bits(first)), f"{blocks} cores differ from 1"


def test_sampling_kernels_core_count_changes_no_bit():
    """topk, filter_logits and sample spread rows over cores; each row's bits, tokens and indices must not move.
    16385 columns: two segments, so top-p's masses run the partial tree."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(6, 16385, generator=g) * 3
    x[1, ::7] = float("-inf")
    x[2, :100] = 2.5                                     # ties at the top
    scale = torch.tensor([1.25, 1.25, 0.5, 1.25, 1.0, 2.0])
    top_k = torch.tensor([0, 5, 0, 50, 0, 3])
    top_p = torch.tensor([1.0, 1.0, 0.9, 0.5, 1.0, 0.3])
    min_p = torch.tensor([0.0, 0.0, 0.1, 0.0, 0.0, 0.05])
    greedy = torch.tensor([False, False, False, False, True, False])
    seeds = torch.arange(6) - 2
    positions = torch.arange(6) * 2**33 + 5
    runs = {}
    for blocks in (1, 4, 40):
        runs[blocks] = [
            host_emulation.filter_logits(x, scale, top_k, top_p, min_p, blocks=blocks),
            host_emulation.sample(x, scale, top_k, top_p, min_p, greedy, seeds, positions, blocks=blocks),
            *host_emulation.topk(x, 7, blocks=blocks),
        ]
    for blocks, results in runs.items():
        for got, first in zip(results, runs[1]):
            assert torch.equal(_bits(got) if got.is_floating_point() else got,
                               _bits(first) if first.is_floating_point() else first), f"{blocks} cores differ from 1"


def test_topk_beyond_one_output_block():
    """k > 1024 takes several blocks of output positions, each bounded by the previous block's threshold;
    NaNs (lowest in spec 21's order) fill the last positions when k exceeds the non-NaN count."""
    g = torch.Generator().manual_seed(5)
    x = torch.randint(-40, 40, (2, 2600), generator=g).float() / 4      # many ties across block boundaries
    x[0, ::9] = -0.0
    x[1, ::5] = float("nan")
    x[1, ::13] = float("-inf")
    for k in (1025, 2080, 2600):
        want_v, want_i = canonical.topk(x.numpy(), k)
        got_v, got_i = host_emulation.topk(x, k)
        assert torch.equal(got_i, torch.from_numpy(want_i)), k
        assert torch.equal(_bits(got_v), _bits(torch.from_numpy(want_v))), k


def _model_case(seed):
    g = torch.Generator().manual_seed(seed)
    return lambda *shape: torch.randn(*shape, generator=g)


def _model_runs(blocks, rnd_seed):
    rnd = _model_case(rnd_seed)
    x, w, b, w_long = rnd(9, 64), rnd(130, 64), rnd(130), rnd(3, 16484)
    x_long = rnd(2, 16484)
    q, k, v = rnd(3, 5, 16), rnd(3, 7, 16), rnd(3, 7, 16)
    lengths = torch.tensor([7, 5, 6])
    angles = rnd(9, 35)
    return [
        host_emulation.linear(x, w, b, blocks=blocks),
        host_emulation.linear(x_long, w_long, None, blocks=blocks),
        host_emulation.rms_norm(rnd(9, 70), rnd(70), 1e-6, blocks=blocks),
        host_emulation.rotary(rnd(9, 70), angles.cos(), angles.sin(), blocks=blocks),
        host_emulation.attention(q, k, v, lengths, True, 0.25, blocks=blocks),
        host_emulation.silu_mul(rnd(2100) * 8, rnd(2100), blocks=blocks),
    ]


def test_model_kernels_core_count_changes_no_bit():
    """linear spreads column blocks, attention queries, the others rows or tiles over the cores."""
    runs = {blocks: _model_runs(blocks, rnd_seed=11) for blocks in (1, 4, 40)}
    for blocks, results in runs.items():
        for got, want in zip(results, runs[1]):
            assert torch.equal(_bits(got), _bits(want)), f"{blocks} cores differ from 1"


def test_model_kernels_beyond_one_tile():
    """What the shared bit test's shapes do not reach: a linear whose K spans two segments (partial rows),
    rms_norm over two segments, rotary over two column tiles of the half, attention at its head-dim limit over
    two segments of keys; and attention's limits refused."""
    rnd = _model_case(12)
    x, w = rnd(2, 16484), rnd(3, 16484)
    assert torch.equal(_bits(host_emulation.linear(x, w, None)),
                       _bits(torch.from_numpy(canonical.linear(x.numpy(), w.numpy(), None))))
    x, weight = rnd(2, 16385) * 3, rnd(16385)
    assert torch.equal(_bits(host_emulation.rms_norm(x, weight, 1e-6)),
                       _bits(torch.from_numpy(canonical.rms_norm(x.numpy(), weight.numpy(), np.float32(1e-6)))))
    x, angles = rnd(3, 4200), rnd(3, 2100) * 50
    cos, sin = angles.cos(), angles.sin()
    assert torch.equal(_bits(host_emulation.rotary(x, cos, sin)),
                       _bits(torch.from_numpy(canonical.rotary(x.numpy(), cos.numpy(), sin.numpy()))))
    dim = host_emulation.ATTENTION_MAX_DIM
    q, k, v = rnd(1, 2, dim), rnd(1, spec.SEGMENT + 40, dim), rnd(1, spec.SEGMENT + 40, dim)
    lengths = torch.tensor([spec.SEGMENT + 33])
    want = canonical.attention(q.numpy(), k.numpy(), v.numpy(), lengths.numpy(), True, 0.0625)
    assert torch.equal(_bits(host_emulation.attention(q, k, v, lengths, True, 0.0625)), _bits(torch.from_numpy(want)))
    keys = host_emulation.ATTENTION_MAX_KEYS
    with pytest.raises(ValueError, match=f"at most {keys} keys"):
        host_emulation.attention(q[..., :1], rnd(1, keys + 1, 1), rnd(1, keys + 1, 1), lengths, True, 1.0)
    with pytest.raises(ValueError, match=f"head dimensions of at most {dim}"):
        host_emulation.attention(rnd(1, 2, dim + 1), rnd(1, 3, dim + 1), rnd(1, 3, dim + 1), torch.tensor([3]),
                                 True, 0.0625)


@pytest.mark.parametrize("tq, tk, dim, lengths, causal", [
    (4, 1025, 8, [1025, 700], True),              # two chunks of keys; a prefix inside the first
    (2, 2048, 16, [2048, 1999], False),           # two full chunks; a ragged second one
    (3, spec.SEGMENT + 600, 4, [spec.SEGMENT + 600, spec.SEGMENT + 1], True),   # a second segment, 1 key in it
])
def test_attention_keys_past_one_chunk_and_one_segment(tq, tk, dim, lengths, causal):
    """Scores, softmax statistics (spec 8.2's segment combine) and value sums (spec 3's partial rows) chunk by
    chunk and segment by segment: the reference's bits, with NaN in every cache slot past kv_lengths (never
    read) and one group's keys dominated by a late key, so the segments' maxima differ."""
    rnd = _model_case(tk)
    groups = len(lengths)
    q, k, v = rnd(groups, tq, dim) * 2, rnd(groups, tk, dim), rnd(groups, tk, dim)
    k[0, lengths[0] - 3] = q[0, -1] * 4
    for g, length in enumerate(lengths):
        k[g, length:] = float("nan")
        v[g, length:] = float("nan")
    lengths = torch.tensor(lengths)
    scale = float(np.float32(1 / np.sqrt(dim)))
    want = canonical.attention(q.numpy(), k.numpy(), v.numpy(), lengths.numpy(), causal, np.float32(scale))
    got = host_emulation.attention(q, k, v, lengths, causal, scale)
    assert not got.isnan().any()
    assert torch.equal(_bits(got), _bits(torch.from_numpy(want)))


# ---- Backward (spec 26) ------------------------------------------------------------

def _backward_case(rows, cols, seed):
    """Softmax rows with -inf, NaN, +inf and a fully masked row, RL tokens with NaN, an empty sequence and log-ratios on
    and past the ±20 clamp, and upstream gradients of both signs."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * 4
    x[0, ::3] = float("-inf")
    x[1, -1] = float("nan")
    x[2, 0] = float("inf")
    mask = torch.rand(rows, cols, generator=g) < 0.8
    mask[-1] = False
    tokens = torch.randint(0, cols, (rows,), generator=g)
    g_rows, g_full = torch.randn(rows, generator=g), torch.randn(rows, cols, generator=g)
    logp = -torch.rand(rows, cols, generator=g) * 3
    old = logp + torch.randn(rows, cols, generator=g) * 0.4
    old[0, :4] = logp[0, :4] - 20.0
    adv = torch.randn(rows, cols, generator=g)
    adv[0, 5 % cols] = float("nan")
    return x, mask, tokens, g_rows, g_full, logp, old, adv


def _backward_runs(rows, cols, seed, blocks):
    """Every backward kernel through host_emulation on `blocks` cores, and the same through reference/canonical.py."""
    x, mask, tokens, g_rows, g_full, logp, old, adv = _backward_case(rows, cols, seed)
    scale = 1 / torch.linspace(0.5, 1.5, rows)              # one per row
    xs, ms, gr, gf, ss = x.numpy(), mask.numpy(), g_rows.numpy(), g_full.numpy(), scale.numpy()
    ys = canonical.log_softmax(xs, ms, ss)
    ps = canonical.softmax(xs, None, ss)                    # softmax's backward runs without a mask here
    hs = canonical.entropy(xs, ms, ss)
    y, p, h = (torch.from_numpy(np.ascontiguousarray(a)) for a in (ys, ps, hs))
    lo, hi = float(np.float32(0.8)), float(np.float32(1.28))
    g1 = torch.tensor([-0.75])
    got = [
        host_emulation.softmax_backward("logsumexp", x, mask, scale, g_rows, blocks=blocks),
        host_emulation.softmax_backward("log_softmax", y, mask, scale, g_full, blocks=blocks),
        host_emulation.softmax_backward("softmax", p, None, scale, g_full, blocks=blocks),
        host_emulation.softmax_backward("entropy", x, mask, scale, g_rows, h, blocks=blocks),
        host_emulation.softmax_backward("token_logprobs", x, tokens, scale, g_rows, blocks=blocks),
        host_emulation.masked_mean_backward(mask, g_rows, blocks=blocks),
        host_emulation.masked_whiten_backward(logp, mask, False, True, 1e-8, 0, g_full, blocks=blocks),
        host_emulation.masked_whiten_backward(logp, mask, True, False, 0.75, 1, g_full, blocks=blocks),
        host_emulation.kl_penalty_backward(logp.flatten(), old.flatten(), 2, 0.5, 20.0, g_full.flatten(),
                                           blocks=blocks),
        *(host_emulation.ppo_policy_loss_backward(logp, old, adv, mask, lo, hi, 3.0, 20.0, code, g1, blocks=blocks)
          for code in range(4)),
    ]
    with np.errstate(all="ignore"):
        want = [
            canonical.logsumexp_backward(xs, ms, ss, gr),
            canonical.log_softmax_backward(ys, ms, ss, gf),
            canonical.softmax_backward(ps, None, ss, gf),
            canonical.entropy_backward(xs, ms, ss, hs, gr),
            canonical.token_logprobs_backward(xs, tokens.numpy(), ss, gr),
            canonical.masked_mean_backward(ms, gr),
            canonical.masked_whiten_backward(logp.numpy(), ms, False, True, np.float32(1e-8), "add", gf),
            canonical.masked_whiten_backward(logp.numpy(), ms, True, False, np.float32(0.75), "clamp", gf),
            canonical.kl_penalty_backward(logp.numpy().flatten(), old.numpy().flatten(), "k3", 0.5, 20.0,
                                          gf.flatten()),
            *(canonical.ppo_policy_loss_backward(logp.numpy(), old.numpy(), adv.numpy(), ms, lo, hi, 3.0, 20.0, agg,
                                                 g1.numpy())
              for agg in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")),
        ]
    return got, want


@pytest.mark.parametrize("rows,cols", ((9, 70), (3, 16385)))
def test_backward_kernels_core_count_changes_no_bit(rows, cols):
    """The backward kernels spread rows (or tiles) over cores like the forwards; PPO's token weights run token-mean
    on one core. One core gives the canonical bits and no core count moves one."""
    runs = {blocks: _backward_runs(rows, cols, rows + cols, blocks) for blocks in (1, 4, 40)}
    got, want = runs[1]
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(_bits(a), _bits(torch.from_numpy(np.ascontiguousarray(b)))), f"1 core vs canonical: {i}"
    for blocks, (results, _) in runs.items():
        for i, (a, first) in enumerate(zip(results, got)):
            assert torch.equal(_bits(a), _bits(first)), f"{blocks} cores differ from 1: {i}"


def test_backward_limits_are_refused():
    """PPO's token-mean averages all B * T tokens as one row, so its backward refuses more than MAX_ROW of them,
    as the forward does; a row past MAX_ROW is refused by every backward."""
    big = torch.empty(2, host_emulation.MAX_ROW // 2 + 1)
    mask = torch.empty(big.shape, dtype=torch.bool)
    code = host_emulation.PPO_AGG_CODES["token-mean"]
    with pytest.raises(ValueError, match=f"at most {host_emulation.MAX_ROW}"):
        host_emulation.ppo_policy_loss_backward(big, big, big, mask, 0.8, 1.2, 3.0, 20.0, code, torch.ones(1))
    long_row = torch.empty(1, host_emulation.MAX_ROW + 1)
    with pytest.raises(ValueError, match=f"at most {host_emulation.MAX_ROW}"):
        host_emulation.softmax_backward("softmax", long_row, None, torch.ones(1), long_row)
    with pytest.raises(ValueError, match=f"at most {host_emulation.MAX_ROW}"):
        host_emulation.masked_mean_backward(torch.empty(long_row.shape, dtype=torch.bool), torch.ones(1))


# softmax.cpp's backward sum G = canonical_sum(select(m, g * p, -0.0)) with each segment's chunks taken last to
# first: the same terms into the same lanes and the same tree, only the order of each lane's additions changed.
_G_CHUNK_LOOP = """for (uint32_t c = 0; c < geo.DataChunks(seg); ++c) {
                uint32_t len = geo.ChunkLength(seg, c);
                CopyIn(rowStart + geo.ChunkStart(seg, c), len, OP == OutputGradOp::SOFTMAX);"""
_G_CHUNK_LOOP_REVERSED = """for (uint32_t back = geo.DataChunks(seg); back > 0; --back) {
                const uint32_t c = back - 1;
                uint32_t len = geo.ChunkLength(seg, c);
                CopyIn(rowStart + geo.ChunkStart(seg, c), len, OP == OutputGradOp::SOFTMAX);"""
_REVERSED_LAUNCHER = """
extern "C" int run_softmax_backward(uint32_t blocks, GM_ADDR p, GM_ADDR mask, GM_ADDR scale, GM_ADDR g, GM_ADDR out,
                                    uint32_t rows, uint32_t cols, uint32_t hasMask)
{
    return bp_emulation::Launch(blocks,
                                [&] { bitparity_softmax_backward(p, mask, scale, g, out, rows, cols, hasMask); });
}
"""


def test_backward_bit_test_catches_a_changed_summation_order(tmp_path):
    """Negative control: softmax.cpp with the softmax backward's G summed chunk by chunk in reverse order builds,
    runs clean under the emulation's checks, and is caught by the bit comparison that the real kernel passes."""
    text = (host_emulation.KERNEL_DIR / "softmax.cpp").read_text()
    assert text.count(_G_CHUNK_LOOP) == 1
    source = tmp_path / "softmax_reversed_chunks.cpp"
    source.write_text(text.replace(_G_CHUNK_LOOP, _G_CHUNK_LOOP_REVERSED) + _REVERSED_LAUNCHER)
    lib = ctypes.CDLL(str(host_emulation.build("bitparity_ascend_reversed_chunks", [source])))
    lib.bp_emulation_last_error.restype = ctypes.c_char_p
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 16385, generator=gen) * 0.5      # near-uniform p: every chunk weighs in G
    g_full = torch.randn(4, 16385, generator=gen)
    mask = torch.rand(4, 16385, generator=gen) < 0.9
    mask[-1] = False
    scale = torch.full((4,), float(np.float32(1 / 0.7)))
    p = torch.from_numpy(canonical.softmax(x.numpy(), mask.numpy(), scale.numpy()))
    with np.errstate(all="ignore"):
        want = torch.from_numpy(canonical.softmax_backward(p.numpy(), mask.numpy(), scale.numpy(), g_full.numpy()))
    assert torch.equal(_bits(host_emulation.softmax_backward("softmax", p, mask, scale, g_full)), _bits(want))
    out = torch.empty_like(p)
    lib.run_softmax_backward.argtypes = [ctypes.c_uint32, *[ctypes.c_void_p] * 5, ctypes.c_uint32, ctypes.c_uint32,
                                         ctypes.c_uint32]
    status = lib.run_softmax_backward(4, p.data_ptr(), mask.data_ptr(), scale.data_ptr(), g_full.data_ptr(),
                                      out.data_ptr(), 4, 16385, 1)
    assert status == 0, lib.bp_emulation_last_error().decode()
    assert not torch.equal(_bits(out), _bits(want)), "a reversed chunk order gave the canonical bits"
    assert torch.equal(_bits(out)[-1], _bits(want)[-1])   # the fully masked row has no sum to reorder
