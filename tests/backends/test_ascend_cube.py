"""The host emulation's Cube unit (emulation/kernel_operator.h), which kernels/linear.cpp computes with.

A test kernel packs nothing itself: numpy lays int8 matrices out as the documented fractals (L0A: 16 x 32,
row-major inside and between; L0B: 32 x 16, column-major inside, row-major between), the kernel copies them
GM -> L1 -> L0A/L0B unchanged, runs Mmad into int32 L0C and brings C back through the Fixpipe (NZ -> ND, no
quantisation).  The product must be numpy's exact int64 one, and the negative controls must fail: a wrong
fractal layout gives other numbers, GEMV (m = 1) reads L0A as ND, an accumulation into fresh (poisoned) L0C is
off, and misalignment, limits, int32 overflow and vector access to L0C are refused.  A test double, not an NPU.
"""

import ctypes
import re

import numpy as np
import pytest

from bitparity.backends.ascend import host_emulation

CUBE_SOURCE = r"""
#include "kernel_operator.h"

using namespace AscendC;

extern "C" {

// c[m, n] (ND, row pitch n) from `times` Mmads of the packed a (L0A layout, aBytes) and b (L0B layout, bBytes);
// the first writes C if initFirst, every other accumulates.  aOffset: the bytes into L0A at which Mmad reads A;
// cOffset: the elements into L0C at which C lies; vectorOnC: touch L0C with a vector instruction.
int cube_mmad(int8_t* a, uint32_t aBytes, int8_t* b, uint32_t bBytes, int32_t* c, uint32_t m, uint32_t n,
              uint32_t k, uint32_t times, uint32_t initFirst, uint32_t aOffset, uint32_t cOffset, uint32_t vectorOnC)
{
    return bp_emulation::Launch(1, [&] {
        TPipe pipe;
        TQue<TPosition::A1, 1> a1;
        TQue<TPosition::B1, 1> b1;
        TQue<TPosition::A2, 1> a2;
        TQue<TPosition::B2, 1> b2;
        TQue<TPosition::CO1, 1> co;
        pipe.InitBuffer(a1, 1, aBytes);
        pipe.InitBuffer(b1, 1, bBytes);
        pipe.InitBuffer(a2, 1, aBytes);
        pipe.InitBuffer(b2, 1, bBytes);
        pipe.InitBuffer(co, 1, (cOffset + (m + 15) / 16 * 16 * ((n + 15) / 16 * 16)) * sizeof(int32_t));
        GlobalTensor<int8_t> ga, gb;
        GlobalTensor<int32_t> gc;
        ga.SetGlobalBuffer(a, aBytes);
        gb.SetGlobalBuffer(b, bBytes);
        gc.SetGlobalBuffer(c, static_cast<uint64_t>(m) * n);
        LocalTensor<int8_t> la1 = a1.AllocTensor<int8_t>();
        DataCopy(la1, ga, DataCopyParams{1, static_cast<uint16_t>(aBytes / 32), 0, 0});
        a1.EnQue(la1);
        LocalTensor<int8_t> lb1 = b1.AllocTensor<int8_t>();
        DataCopy(lb1, gb, DataCopyParams{1, static_cast<uint16_t>(bBytes / 32), 0, 0});
        b1.EnQue(lb1);
        la1 = a1.DeQue<int8_t>();
        LocalTensor<int8_t> la2 = a2.AllocTensor<int8_t>();
        LoadData2DParams load;
        load.repeatTimes = static_cast<uint8_t>(aBytes / 512);
        load.srcStride = 1;
        LoadData(la2, la1, load);
        a2.EnQue(la2);
        a1.FreeTensor(la1);
        lb1 = b1.DeQue<int8_t>();
        LocalTensor<int8_t> lb2 = b2.AllocTensor<int8_t>();
        load.repeatTimes = static_cast<uint8_t>(bBytes / 512);
        LoadData(lb2, lb1, load);
        b2.EnQue(lb2);
        b1.FreeTensor(lb1);
        LocalTensor<int32_t> lc = co.AllocTensor<int32_t>();
        if (vectorOnC != 0) {
            Duplicate(lc, 0, 256);
        }
        la2 = a2.DeQue<int8_t>();
        lb2 = b2.DeQue<int8_t>();
        MmadParams mmad;
        mmad.m = static_cast<uint16_t>(m);
        mmad.n = static_cast<uint16_t>(n);
        mmad.k = static_cast<uint16_t>(k);
        for (uint32_t t = 0; t < times; ++t) {
            mmad.cmatrixInitVal = initFirst != 0 && t == 0;
            Mmad(lc[cOffset], la2[aOffset], lb2, mmad);
        }
        a2.FreeTensor(la2);
        b2.FreeTensor(lb2);
        co.EnQue(lc);
        lc = co.DeQue<int32_t>();
        Fixpipe(gc, lc[cOffset], FixpipeParamsV220{static_cast<uint16_t>(n), static_cast<uint16_t>(m),
                                                   static_cast<uint16_t>((m + 15) / 16 * 16), n});
        co.FreeTensor(lc);
    });
}

}  // extern "C"
"""


@pytest.fixture(scope="module")
def cube(tmp_path_factory):
    source = tmp_path_factory.mktemp("ascend_cube") / "ascend_cube_kernels.cpp"
    source.write_text(CUBE_SOURCE)
    lib = ctypes.CDLL(str(host_emulation.build("bitparity_ascend_cube", [source])))
    lib.cube_mmad.restype = ctypes.c_int
    lib.cube_mmad.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p,
                              *[ctypes.c_uint32] * 8]
    lib.bp_emulation_last_error.restype = ctypes.c_char_p

    def run(a_packed, b_packed, m, n, k, times=1, init_first=True, a_offset=0, c_offset=0, vector_on_c=False):
        a_packed, b_packed = np.ascontiguousarray(a_packed, np.int8), np.ascontiguousarray(b_packed, np.int8)
        c = np.zeros((m, n), dtype=np.int32)
        status = lib.cube_mmad(a_packed.ctypes.data, a_packed.size, b_packed.ctypes.data, b_packed.size,
                               c.ctypes.data, m, n, k, times, int(init_first), a_offset, c_offset, int(vector_on_c))
        return status, lib.bp_emulation_last_error().decode(), c
    return run


def _pad(x, rows, cols):
    out = np.zeros((rows, cols), dtype=np.int8)
    out[:x.shape[0], :x.shape[1]] = x
    return out


def pack_l0a(a):
    """A [m, k] -> L0A bytes: 16 x 32 fractals, row-major inside and between."""
    m1, k1 = -(-a.shape[0] // 16), -(-a.shape[1] // 32)
    return _pad(a, 16 * m1, 32 * k1).reshape(m1, 16, k1, 32).transpose(0, 2, 1, 3).ravel()


def pack_l0a_column_major_between(a):
    """The wrong L0A layout (L1's Nz order): fractals column-major between."""
    m1, k1 = -(-a.shape[0] // 16), -(-a.shape[1] // 32)
    return _pad(a, 16 * m1, 32 * k1).reshape(m1, 16, k1, 32).transpose(2, 0, 1, 3).ravel()


def pack_l0b(bt):
    """B^T [n, k] (row n holds B[:, n]) -> L0B bytes: 32 x 16 fractals, column-major inside, row-major between."""
    n1, k1 = -(-bt.shape[0] // 16), -(-bt.shape[1] // 32)
    return _pad(bt, 16 * n1, 32 * k1).reshape(n1, 16, k1, 32).transpose(2, 0, 1, 3).ravel()


def _operands(m, n, k, seed, extreme=False):
    rng = np.random.default_rng(seed)
    if extreme:
        return (rng.choice(np.array([-128, 127], np.int8), (m, k)), rng.choice(np.array([-128, 127], np.int8), (n, k)))
    return rng.integers(-128, 128, (m, k), dtype=np.int8), rng.integers(-128, 128, (n, k), dtype=np.int8)


def _exact(a, bt, times=1):
    return times * (a.astype(np.int64) @ bt.astype(np.int64).T)


@pytest.mark.parametrize("m, n, k, extreme", [(16, 16, 32, False), (20, 40, 70, False), (48, 32, 256, True),
                                              (17, 1, 5, False), (2, 16, 4000, True)])
def test_mmad_is_the_exact_int8_product_in_the_documented_fractals(cube, m, n, k, extreme):
    a, bt = _operands(m, n, k, seed=m * n + k, extreme=extreme)
    status, error, c = cube(pack_l0a(a), pack_l0b(bt), m, n, k)
    assert (status, error) == (0, "")
    assert np.array_equal(c, _exact(a, bt))


def test_mmad_accumulates_with_cmatrix_init_val_false(cube):
    a, bt = _operands(32, 32, 64, seed=3, extreme=True)
    status, error, c = cube(pack_l0a(a), pack_l0b(bt), 32, 32, 64, times=3)
    assert (status, error) == (0, "") and np.array_equal(c, _exact(a, bt, 3))


def test_accumulating_into_fresh_l0c_reads_its_poison(cube):
    """Negative control: cmatrixInitVal false on the first Mmad adds to uninitialised L0C (0xFF bytes: -1)."""
    a, bt = _operands(16, 16, 32, seed=4)
    status, _, c = cube(pack_l0a(a), pack_l0b(bt), 16, 16, 32, init_first=False)
    assert status == 0 and np.array_equal(c, _exact(a, bt) - 1)


def test_a_wrong_fractal_layout_gives_other_numbers(cube):
    """Negative control: A packed with its fractals column-major between (as L1 holds them) is read as another
    matrix; so is B packed as A."""
    a, bt = _operands(32, 32, 64, seed=5)
    _, _, c = cube(pack_l0a_column_major_between(a), pack_l0b(bt), 32, 32, 64)
    assert not np.array_equal(c, _exact(a, bt))
    _, _, c = cube(pack_l0a(a), pack_l0a(bt), 32, 32, 64)
    assert not np.array_equal(c, _exact(a, bt))


def test_gemv_reads_l0a_as_nd(cube):
    """m = 1 is GEMV: L0A holds the row as ND bytes, not a 16 x 32 fractal (whose row 0 skips to byte 512 at
    k = 32); a kernel that passes m = 1 with fractal-packed A gets other numbers."""
    a, bt = _operands(1, 16, 96, seed=6)
    nd = np.zeros(3 * 512, dtype=np.int8)
    nd[:96] = a[0]
    status, error, c = cube(nd, pack_l0b(bt), 1, 16, 96)
    assert (status, error) == (0, "") and np.array_equal(c, _exact(a, bt))
    _, _, c = cube(pack_l0a(a), pack_l0b(bt), 1, 16, 96)
    assert not np.array_equal(c, _exact(a, bt))


@pytest.mark.parametrize("case, message", [
    (dict(a_offset=32), r"A and B must start 512-byte aligned"),
    (dict(c_offset=16), r"256-element aligned"),
    (dict(k=4096), r"1 \.\. 4095"),
    (dict(times=40, extreme=True), r"left int32"),
    (dict(vector_on_c=True), r"vector unit cannot address"),
])
def test_cube_misuse_is_refused(cube, case, message):
    k = case.pop("k", 4064)
    a, bt = _operands(16, 16, k, seed=7, extreme=case.pop("extreme", False))
    if case.get("times"):          # all -128 * -128: 2^14 * 4064 per Mmad, past 2^31 by the 33rd
        a[:], bt[:] = -128, -128
    status, error, _ = cube(pack_l0a(a), pack_l0b(bt), 16, 16, k, **case)
    assert status == 1, f"{case} ran without error"
    assert re.search(message, error), error
