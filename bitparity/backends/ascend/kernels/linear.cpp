// linear (spec 24.1, 2.0.0) as Ascend C kernels for Atlas A2: the exact integer product of fixed-point rows on
// the Cube unit (int8 Mmad into int32 L0C), rounded once to binary32.
//
//   x: f32[M, K], weight: f32[N, K] (torch's layout), bias: f32[N] or absent; y: f32[M, N].
//
// Three kernels, launched in this order on one stream (the host's composition, host_emulation.linear):
//   bitparity_linear_quantise  (twice: x's rows with LINEAR_BX bits, then the weight's with LINEAR_BW)  per row:
//       E = the exponent of its largest magnitude, from the bit patterns; Q[k] = RNE(v[k] * 2^(B-2-E)) by
//       integer shifts; Q as balanced int8 digits, Q = sum_i d_i 256^i (five for x, four for the weight).  A row
//       holding NaN or inf is flagged and quantised to 0.  Digits go to GM already in the Cube's L1 "Nz" layout:
//       plane i, strip k/32, row r, byte k%32, rows padded to a multiple of 16 and K to a multiple of 32 by zero
//       digits (so every fractal is whole and no padding lane of L1/L0 is ever read).  Meta: int32[rowsPadded][8],
//       {E, flag, 0...}.
//   bitparity_linear_digits    the Cube unit: for a 64 x 64 output tile, a digit weight 256^s and a chunk of
//       LINEAR_CHUNK_K terms of K, T[chunk, s] = sum over digit pairs p + q = s of A_p . B_q^T: 256 terms of K
//       at a time are copied GM -> L1 (A1/B1), loaded L1 -> L0A (fractals re-ordered to row-major between) and
//       L1 -> L0B (as they are), and Mmad accumulates int8 x int8 into int32 L0C (cmatrixInitVal true for the
//       chunk's first).  At most four pairs of |d d'| <= 2^14 over 8192 terms keep every int32 partial below
//       2^31.  The Fixpipe moves L0C to the GM workspace as int32 (no quantisation).
//   bitparity_linear_round     per output: the chunks' int32 partials summed in int64, S = sum_s 256^s T_s
//       carried exactly in base 2^8, rounded once to nearest even at 2^(Ex + Ew - (Bx-2) - (Bw-2)) (subnormals
//       on the 2^-149 grid, overflow to inf), +0.0 for S = 0; pairs with a NaN/inf row take the IEEE value of the
//       sum of the products from the operands' classes; then + bias[n] on the vector unit (one binary32 Add).
// The quantisation and the rounding run on the AI core's scalar unit (int64 integer work, one element at a
// time); the vector unit does the bias's add.  Integer sums are exact in any order, so the tiles, chunks and
// cores change no bit.
//
// Budgets: quantise UB: digit tiles 2 x 5 x LINEAR_QUANT_COLS B and meta 2 x 32 B.  digits: L1 2 x (64 x 256) B,
// L0A and L0B 16 KB each, L0C 64 x 64 x 4 = 16 KB.  round UB: y and bias tiles 2 x 4 KB each.
//
// Backward (spec 29.2): dx is linear(g, W^T), and dW and db are linear over blocks of rows, row-folded: the
// host's compositions of these kernels (backends/linear_grad.py), no kernel of their own.

#include "kernel_operator.h"
#include "canonical.h"
#include "tiling.h"

namespace bitparity {

// Balanced int8 digits of a quantised value (s digits hold 8 s - 1 bits): five for x's LINEAR_BX = 39, four for
// the weight's LINEAR_BW = 29 (spec_constants.h).
constexpr uint32_t LINEAR_DIGITS_X = (LINEAR_BX + 8) / 8;
constexpr uint32_t LINEAR_DIGITS_W = (LINEAR_BW + 8) / 8;
constexpr uint32_t LINEAR_MAX_DIGITS = LINEAR_DIGITS_X > LINEAR_DIGITS_W ? LINEAR_DIGITS_X : LINEAR_DIGITS_W;
constexpr uint32_t LINEAR_DIAGONALS = LINEAR_DIGITS_X + LINEAR_DIGITS_W - 1;   // digit weights 256^s
constexpr uint32_t LINEAR_CHUNK_K = 8192;   // K terms per int32 partial: 4 pairs * LINEAR_CHUNK_K * 2^14 < 2^31
constexpr uint32_t LINEAR_LO_LIMBS = 7;     // S = hi * 2^56 + lo: seven base-2^8 limbs in lo
constexpr uint32_t FRACTAL_ROWS = 16;       // rows of an L0A fractal / columns of an L0B one
constexpr uint32_t FRACTAL_K = 32;          // int8 K depth of a fractal (one 32-byte row of it)
constexpr uint32_t FRACTAL_BYTES = 512;
constexpr uint32_t CUBE_TILE = 64;          // output tile of the Cube kernel: 4 x 4 fractals
constexpr uint32_t CUBE_TILE_K = 256;            // K step: 8 fractals deep
constexpr uint32_t LINEAR_QUANT_COLS = 1024;       // K columns quantised per copy-out
constexpr uint32_t LINEAR_META = 8;                // int32 per row of meta: E, flag, padding to 32 bytes
constexpr int64_t LINEAR_ONE = 1;

// ---- Scalar integer pieces ----------------------------------------------------------

__aicore__ inline int32_t BitLength(uint64_t v)
{
    int32_t n = 0;
    while (v != 0) {
        v >>= 1;
        ++n;
    }
    return n;
}

// E = floor(log2 max|v|) from the largest |bit pattern| of a finite row; 0 for an all-zero row.
__aicore__ inline int32_t RowExponent(uint32_t amax)
{
    const int32_t field = static_cast<int32_t>(amax >> 23);
    return field > 0 ? field - 127 : amax > 0 ? BitLength(amax) - 150 : 0;
}

// Q = RNE(v * 2^(B-2-E)) of a finite v's bit pattern with B bits, by shifts of its significand (|Q| <= 2^(B-1)).
__aicore__ inline int64_t Quantise(uint32_t bits, int32_t e, uint32_t b)
{
    const uint32_t a = bits & 0x7FFFFFFFu;
    const int32_t field = static_cast<int32_t>(a >> 23);
    const int64_t sig = (a & 0x7FFFFFu) | (field > 0 ? 0x800000u : 0u);
    const int32_t shift = (field > 0 ? field : 1) - 150 + static_cast<int32_t>(b) - 2 - e;
    int64_t q;
    if (shift >= 0) {
        q = sig << shift;
    } else {
        const int32_t r = -shift < 26 ? -shift : 26;     // sig < 2^24: 26 places leave 0, below a half
        q = sig >> r;
        const int64_t rem = sig & ((LINEAR_ONE << r) - 1), half = LINEAR_ONE << (r - 1);
        q += (rem > half || (rem == half && (q & 1) != 0)) ? 1 : 0;
    }
    return (bits >> 31) != 0 ? -q : q;
}

// round32(S, p) of S = sign * (hi * 2^56 + lo): the binary32 nearest to S * 2^p, ties to even, as bits.
__aicore__ inline uint32_t Round32(bool negative, int64_t hi, int64_t lo, int64_t p)
{
    constexpr int32_t LO_BITS = 8 * LINEAR_LO_LIMBS;
    // One word with every bit that can reach the rounding; lo's low bits ORed into a sticky bit below them.
    const int32_t t = BitLength(static_cast<uint64_t>(hi));
    int64_t m = lo;
    if (t > 0) {
        const int64_t sticky = (lo & ((LINEAR_ONE << t) - 1)) != 0 ? 1 : 0;
        m = ((((hi << (LO_BITS - t)) | (lo >> t))) << 1) | sticky;
        p += t - 1;
    }
    if (m == 0) {
        return 0u;                                                    // S = 0: +0.0
    }
    const int64_t lead = BitLength(static_cast<uint64_t>(m)) - 1;
    const int64_t drop = lead - 23 > -149 - p ? lead - 23 : -149 - p;   // bits below the binary32 grid
    int64_t q;
    if (drop <= 0) {
        q = m << -drop;
    } else {
        const int64_t r = drop < 62 ? drop : 62;
        q = m >> r;
        const int64_t rem = m & ((LINEAR_ONE << r) - 1), half = LINEAR_ONE << (r - 1);
        q += (rem > half || (rem == half && (q & 1) != 0)) ? 1 : 0;
    }
    // q * 2^(p + drop), p + drop >= -149: a normal q in [2^23, 2^24] (2^24 carries into the exponent).
    int64_t bits = ((p + drop + 149) << 23) + q;
    bits = bits < 0x7F800000 ? bits : 0x7F800000;
    return static_cast<uint32_t>(bits) | (negative ? 0x80000000u : 0u);
}

// The IEEE value of sum_k x[k] * w[k] where x or w holds NaN or inf, from the classes of the operands (never
// from float products, which could overflow): NaN if some product is NaN (a NaN, or inf * 0) or +inf and -inf
// products meet, else the infinite products' sign.
__aicore__ inline uint32_t SpecialDot(const AscendC::GlobalTensor<uint32_t>& x, const AscendC::GlobalTensor<uint32_t>& w,
                                      uint32_t k)
{
    bool pos = false, neg = false;
    for (uint32_t j = 0; j < k; ++j) {
        const uint32_t xb = x.GetValue(j), wb = w.GetValue(j);
        const uint32_t xa = xb & 0x7FFFFFFFu, wa = wb & 0x7FFFFFFFu;
        const bool xInf = xa == 0x7F800000u, wInf = wa == 0x7F800000u;
        if (xa > 0x7F800000u || wa > 0x7F800000u || (xInf && wa == 0) || (wInf && xa == 0)) {
            return 0x7FC00000u;
        }
        if (xInf || wInf) {
            (((xb ^ wb) >> 31) != 0 ? neg : pos) = true;
        }
    }
    return pos && neg ? 0x7FC00000u : pos ? 0x7F800000u : 0xFF800000u;
}

// ---- Kernel 1: rows -> digits in the Nz layout, exponents and flags ------------------------

class KernelLinearQuantise {
public:
    __aicore__ inline KernelLinearQuantise() {}

    // isWeight: the weight's rows (LINEAR_BW bits), else x's (LINEAR_BX).
    __aicore__ inline void Init(GM_ADDR v, GM_ADDR digits, GM_ADDR meta, uint32_t rows, uint32_t cols,
                                uint32_t rowsPadded, uint32_t colsPadded, uint32_t isWeight)
    {
        bits = isWeight != 0 ? LINEAR_BW : LINEAR_BX;
        planes = isWeight != 0 ? LINEAR_DIGITS_W : LINEAR_DIGITS_X;
        this->rows = rows;
        this->cols = cols;
        this->rowsPadded = rowsPadded;
        this->colsPadded = colsPadded;
        vGm.SetGlobalBuffer((__gm__ uint32_t*)v, static_cast<uint64_t>(rows) * cols);
        digitsGm.SetGlobalBuffer((__gm__ int8_t*)digits, static_cast<uint64_t>(planes) * rowsPadded * colsPadded);
        metaGm.SetGlobalBuffer((__gm__ int32_t*)meta, static_cast<uint64_t>(rowsPadded) * LINEAR_META);
        share = ThisCoresShare(rowsPadded);
        pipe.InitBuffer(digitQueue, BUFFER_NUM, LINEAR_MAX_DIGITS * LINEAR_QUANT_COLS);
        pipe.InitBuffer(metaQueue, BUFFER_NUM, LINEAR_META * sizeof(int32_t));
    }

    __aicore__ inline void Process()
    {
        for (uint32_t r = share.begin; r < share.end; ++r) {
            // A padded row (r >= rows) is all zeros: E = 0, no flag, zero digits.
            uint32_t amax = 0;
            for (uint32_t k = 0; r < rows && k < cols; ++k) {
                const uint32_t a = vGm.GetValue(static_cast<uint64_t>(r) * cols + k) & 0x7FFFFFFFu;
                amax = a > amax ? a : amax;
            }
            const bool special = amax >= 0x7F800000u;
            const int32_t e = special ? 0 : RowExponent(amax);
            for (uint32_t c0 = 0; c0 < colsPadded; c0 += LINEAR_QUANT_COLS) {
                const uint32_t len = colsPadded - c0 < LINEAR_QUANT_COLS ? colsPadded - c0 : LINEAR_QUANT_COLS;
                Compute(r, c0, len, r < rows && !special, e);
                CopyOut(r, c0, len);
            }
            StoreMeta(r, e, special);
        }
    }

private:
    // Digits of row r, columns [c0, c0 + len), into a tile of `planes` planes of len bytes.
    __aicore__ inline void Compute(uint32_t r, uint32_t c0, uint32_t len, bool finite, int32_t e)
    {
        LocalTensor<int8_t> tile = digitQueue.AllocTensor<int8_t>();
        Mte3ToScalarSync();                              // the tile's last copy-out has read it
        for (uint32_t j = 0; j < len; ++j) {
            const uint32_t k = c0 + j;
            int64_t q = finite && k < cols ? Quantise(vGm.GetValue(static_cast<uint64_t>(r) * cols + k), e, bits) : 0;
            // Balanced digits, least significant first: d = ((q + 128) mod 256) - 128, then q = (q - d) / 256.
            for (uint32_t i = 0; i < planes; ++i) {
                const int64_t d = ((q + 128) & 255) - 128;
                tile.SetValue(i * len + j, static_cast<int8_t>(d));
                q = (q - d) >> 8;
            }
        }
        ScalarToMte3Sync();
        digitQueue.EnQue(tile);
    }

    // Plane i's len bytes to strips c0/32 .. of row r: one 32-byte block per strip, strips rowsPadded rows apart.
    __aicore__ inline void CopyOut(uint32_t r, uint32_t c0, uint32_t len)
    {
        LocalTensor<int8_t> tile = digitQueue.DeQue<int8_t>();
        const uint64_t plane = static_cast<uint64_t>(rowsPadded) * colsPadded;
        AscendC::DataCopyExtParams copy{static_cast<uint16_t>(len / FRACTAL_K), FRACTAL_K, 0,
                                        (rowsPadded - 1) * FRACTAL_K, 0};
        for (uint32_t i = 0; i < planes; ++i) {
            const uint64_t at = i * plane + static_cast<uint64_t>(c0 / FRACTAL_K) * rowsPadded * FRACTAL_K +
                                static_cast<uint64_t>(r) * FRACTAL_K;
            AscendC::DataCopyPad(digitsGm[at], tile[i * len], copy);
        }
        digitQueue.FreeTensor(tile);
    }

    __aicore__ inline void StoreMeta(uint32_t r, int32_t e, bool special)
    {
        LocalTensor<int32_t> meta = metaQueue.AllocTensor<int32_t>();
        Mte3ToScalarSync();
        meta.SetValue(0, e);
        meta.SetValue(1, special ? 1 : 0);
        for (uint32_t i = 2; i < LINEAR_META; ++i) {
            meta.SetValue(i, 0);
        }
        ScalarToMte3Sync();
        metaQueue.EnQue(meta);
        meta = metaQueue.DeQue<int32_t>();
        AscendC::DataCopy(metaGm[static_cast<uint64_t>(r) * LINEAR_META], meta, LINEAR_META);
        metaQueue.FreeTensor(meta);
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> digitQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> metaQueue;
    AscendC::GlobalTensor<uint32_t> vGm;
    AscendC::GlobalTensor<int8_t> digitsGm;
    AscendC::GlobalTensor<int32_t> metaGm;
    Range share;
    uint32_t bits = LINEAR_BX;
    uint32_t planes = LINEAR_DIGITS_X;
    uint32_t rows = 0;
    uint32_t cols = 0;
    uint32_t rowsPadded = 0;
    uint32_t colsPadded = 0;
};

// ---- Kernel 2: the digit products on the Cube unit -----------------------------------------

class KernelLinearDigits {
public:
    __aicore__ inline KernelLinearDigits() {}

    // a: x's digits [LINEAR_DIGITS_X][kPad/32][mPad][32], b: the weight's [LINEAR_DIGITS_W][kPad/32][nPad][32]
    // (int8, Nz);
    // t: int32 [chunks][LINEAR_DIAGONALS][mPad][nPad].
    __aicore__ inline void Init(GM_ADDR a, GM_ADDR b, GM_ADDR t, uint32_t mPad, uint32_t nPad, uint32_t kPad)
    {
        this->mPad = mPad;
        this->nPad = nPad;
        this->kPad = kPad;
        chunks = (kPad + LINEAR_CHUNK_K - 1) / LINEAR_CHUNK_K;
        mTiles = (mPad + CUBE_TILE - 1) / CUBE_TILE;
        nTiles = (nPad + CUBE_TILE - 1) / CUBE_TILE;
        aGm.SetGlobalBuffer((__gm__ int8_t*)a, static_cast<uint64_t>(LINEAR_DIGITS_X) * mPad * kPad);
        bGm.SetGlobalBuffer((__gm__ int8_t*)b, static_cast<uint64_t>(LINEAR_DIGITS_W) * nPad * kPad);
        tGm.SetGlobalBuffer((__gm__ int32_t*)t, static_cast<uint64_t>(chunks) * LINEAR_DIAGONALS * mPad * nPad);
        share = ThisCoresShare(mTiles * nTiles * LINEAR_DIAGONALS * chunks);
        pipe.InitBuffer(a1Queue, 1, CUBE_TILE * CUBE_TILE_K);
        pipe.InitBuffer(b1Queue, 1, CUBE_TILE * CUBE_TILE_K);
        pipe.InitBuffer(a2Queue, 1, CUBE_TILE * CUBE_TILE_K);
        pipe.InitBuffer(b2Queue, 1, CUBE_TILE * CUBE_TILE_K);
        pipe.InitBuffer(cQueue, 1, CUBE_TILE * CUBE_TILE * sizeof(int32_t));
    }

    __aicore__ inline void Process()
    {
        for (uint32_t item = share.begin; item < share.end; ++item) {
            const uint32_t chunk = item % chunks;
            const uint32_t s = item / chunks % LINEAR_DIAGONALS;
            const uint32_t tile = item / chunks / LINEAR_DIAGONALS;
            const uint32_t m0 = tile / nTiles * CUBE_TILE, n0 = tile % nTiles * CUBE_TILE;
            const uint32_t tm = mPad - m0 < CUBE_TILE ? mPad - m0 : CUBE_TILE;
            const uint32_t tn = nPad - n0 < CUBE_TILE ? nPad - n0 : CUBE_TILE;
            const uint32_t kEnd = kPad - chunk * LINEAR_CHUNK_K < LINEAR_CHUNK_K ? kPad : (chunk + 1) * LINEAR_CHUNK_K;
            LocalTensor<int32_t> c = cQueue.AllocTensor<int32_t>();
            bool first = true;
            for (uint32_t k0 = chunk * LINEAR_CHUNK_K; k0 < kEnd; k0 += CUBE_TILE_K) {
                const uint32_t tk = kEnd - k0 < CUBE_TILE_K ? kEnd - k0 : CUBE_TILE_K;
                // The pairs p + q = s, p < LINEAR_DIGITS_X, q < LINEAR_DIGITS_W (at most four).
                const uint32_t pLow = s >= LINEAR_DIGITS_W ? s - LINEAR_DIGITS_W + 1 : 0;
                const uint32_t pHigh = s < LINEAR_DIGITS_X ? s : LINEAR_DIGITS_X - 1;
                for (uint32_t p = pLow; p <= pHigh; ++p) {
                    CopyIn(p, s - p, m0, tm, n0, tn, k0, tk);
                    Compute(c, tm, tn, tk, first);
                    first = false;
                }
            }
            cQueue.EnQue(c);
            CopyOut(chunk, s, m0, tm, n0, tn);
        }
    }

private:
    // GM -> L1 of digit p of x (rows m0 .. m0 + tm) and digit q of the weight (rows n0 .. n0 + tn), K terms
    // k0 .. k0 + tk: tk / 32 strips of whole 32-byte rows each; then L1 -> L0A/L0B.
    __aicore__ inline void CopyIn(uint32_t p, uint32_t q, uint32_t m0, uint32_t tm, uint32_t n0, uint32_t tn,
                                  uint32_t k0, uint32_t tk)
    {
        const uint32_t strips = tk / FRACTAL_K;
        LocalTensor<int8_t> a1 = a1Queue.AllocTensor<int8_t>();
        AscendC::DataCopy(a1, aGm[(static_cast<uint64_t>(p) * kPad / FRACTAL_K + k0 / FRACTAL_K) * mPad * FRACTAL_K +
                                  static_cast<uint64_t>(m0) * FRACTAL_K],
                          AscendC::DataCopyParams{static_cast<uint16_t>(strips), static_cast<uint16_t>(tm),
                                                  static_cast<uint16_t>(mPad - tm), 0});
        a1Queue.EnQue(a1);
        LocalTensor<int8_t> b1 = b1Queue.AllocTensor<int8_t>();
        AscendC::DataCopy(b1, bGm[(static_cast<uint64_t>(q) * kPad / FRACTAL_K + k0 / FRACTAL_K) * nPad * FRACTAL_K +
                                  static_cast<uint64_t>(n0) * FRACTAL_K],
                          AscendC::DataCopyParams{static_cast<uint16_t>(strips), static_cast<uint16_t>(tn),
                                                  static_cast<uint16_t>(nPad - tn), 0});
        b1Queue.EnQue(b1);
        // L1 holds fractal (i, j) (i along rows, j along K) at j * rowFractals + i (column-major between).  L0A
        // wants row-major between: one LoadData per fractal row i, its strips rowFractals apart.
        a1 = a1Queue.DeQue<int8_t>();
        LocalTensor<int8_t> a2 = a2Queue.AllocTensor<int8_t>();
        const uint32_t mFractals = tm / FRACTAL_ROWS;
        for (uint32_t i = 0; i < mFractals; ++i) {
            AscendC::LoadData2DParams load;
            load.startIndex = static_cast<uint16_t>(i);
            load.repeatTimes = static_cast<uint8_t>(strips);
            load.srcStride = static_cast<uint16_t>(mFractals);
            AscendC::LoadData(a2[i * strips * FRACTAL_BYTES], a1, load);
        }
        a2Queue.EnQue(a2);
        a1Queue.FreeTensor(a1);
        // L0B wants B's 32 x 16 fractals (k along a fractal's 32 bytes) row-major between: L1's order already.
        b1 = b1Queue.DeQue<int8_t>();
        LocalTensor<int8_t> b2 = b2Queue.AllocTensor<int8_t>();
        AscendC::LoadData2DParams load;
        load.repeatTimes = static_cast<uint8_t>(strips * (tn / FRACTAL_ROWS));
        load.srcStride = 1;
        AscendC::LoadData(b2, b1, load);
        b2Queue.EnQue(b2);
        b1Queue.FreeTensor(b1);
    }

    // C (+)= A . B^T on the Cube unit; m = tm >= 16, so never the GEMV form (which reads L0A as ND).
    __aicore__ inline void Compute(const LocalTensor<int32_t>& c, uint32_t tm, uint32_t tn, uint32_t tk, bool first)
    {
        LocalTensor<int8_t> a2 = a2Queue.DeQue<int8_t>();
        LocalTensor<int8_t> b2 = b2Queue.DeQue<int8_t>();
        AscendC::MmadParams mmad;
        mmad.m = static_cast<uint16_t>(tm);
        mmad.n = static_cast<uint16_t>(tn);
        mmad.k = static_cast<uint16_t>(tk);
        mmad.cmatrixInitVal = first;
        AscendC::Mmad(c, a2, b2, mmad);
        a2Queue.FreeTensor(a2);
        b2Queue.FreeTensor(b2);
    }

    __aicore__ inline void CopyOut(uint32_t chunk, uint32_t s, uint32_t m0, uint32_t tm, uint32_t n0, uint32_t tn)
    {
        LocalTensor<int32_t> c = cQueue.DeQue<int32_t>();
        const uint64_t at = (static_cast<uint64_t>(chunk) * LINEAR_DIAGONALS + s) * mPad * nPad +
                            static_cast<uint64_t>(m0) * nPad + n0;
        AscendC::FixpipeParamsV220 fix{static_cast<uint16_t>(tn), static_cast<uint16_t>(tm),
                                       static_cast<uint16_t>(tm), nPad};
        AscendC::Fixpipe(tGm[at], c, fix);
        cQueue.FreeTensor(c);
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::A1, 1> a1Queue;
    AscendC::TQue<AscendC::TPosition::B1, 1> b1Queue;
    AscendC::TQue<AscendC::TPosition::A2, 1> a2Queue;
    AscendC::TQue<AscendC::TPosition::B2, 1> b2Queue;
    AscendC::TQue<AscendC::TPosition::CO1, 1> cQueue;
    AscendC::GlobalTensor<int8_t> aGm;
    AscendC::GlobalTensor<int8_t> bGm;
    AscendC::GlobalTensor<int32_t> tGm;
    Range share;
    uint32_t mPad = 0;
    uint32_t nPad = 0;
    uint32_t kPad = 0;
    uint32_t chunks = 1;
    uint32_t mTiles = 1;
    uint32_t nTiles = 1;
};

// ---- Kernel 3: the exact sum, rounded once, + bias ------------------------------------------

constexpr uint32_t LINEAR_ROUND_COLUMNS = 1024;

class KernelLinearRound {
public:
    __aicore__ inline KernelLinearRound() {}

    __aicore__ inline void Init(GM_ADDR t, GM_ADDR metaX, GM_ADDR metaW, GM_ADDR x, GM_ADDR w, GM_ADDR bias, GM_ADDR y,
                                uint32_t m, uint32_t n, uint32_t k, uint32_t mPad, uint32_t nPad, uint32_t hasBias)
    {
        this->m = m;
        this->n = n;
        this->k = k;
        this->mPad = mPad;
        this->nPad = nPad;
        this->hasBias = hasBias != 0;
        chunks = (RoundUp(k, FRACTAL_K) + LINEAR_CHUNK_K - 1) / LINEAR_CHUNK_K;
        tGm.SetGlobalBuffer((__gm__ int32_t*)t, static_cast<uint64_t>(chunks) * LINEAR_DIAGONALS * mPad * nPad);
        metaXGm.SetGlobalBuffer((__gm__ int32_t*)metaX, static_cast<uint64_t>(mPad) * LINEAR_META);
        metaWGm.SetGlobalBuffer((__gm__ int32_t*)metaW, static_cast<uint64_t>(nPad) * LINEAR_META);
        xGm.SetGlobalBuffer((__gm__ uint32_t*)x, static_cast<uint64_t>(m) * k);
        wGm.SetGlobalBuffer((__gm__ uint32_t*)w, static_cast<uint64_t>(n) * k);
        yGm.SetGlobalBuffer((__gm__ float*)y, static_cast<uint64_t>(m) * n);
        // At least one block of columns, so that n = 0 (no outputs, no items) divides by nothing.
        columns = n < LINEAR_ROUND_COLUMNS ? RoundUp(n > 0 ? n : 1, FLOATS_PER_BLOCK) : LINEAR_ROUND_COLUMNS;
        share = ThisCoresShare(m * ((n + columns - 1) / columns));
        if (this->hasBias) {
            biasGm.SetGlobalBuffer((__gm__ float*)bias, n);
            pipe.InitBuffer(biasQueue, BUFFER_NUM, columns * sizeof(float));
        }
        pipe.InitBuffer(yQueue, BUFFER_NUM, columns * sizeof(float));
    }

    __aicore__ inline void Process()
    {
        const uint32_t blocks = (n + columns - 1) / columns;
        for (uint32_t item = share.begin; item < share.end; ++item) {
            const uint32_t row = item / blocks, n0 = item % blocks * columns;
            const uint32_t cols = n - n0 < columns ? n - n0 : columns;
            if (hasBias) {
                LocalTensor<float> b = biasQueue.AllocTensor<float>();
                LoadChunk(b, biasGm[n0], cols);
                biasQueue.EnQue(b);
            }
            Compute(row, n0, cols);
            CopyOut(row, n0, cols);
        }
    }

private:
    __aicore__ inline void Compute(uint32_t row, uint32_t n0, uint32_t cols)
    {
        LocalTensor<float> y = yQueue.AllocTensor<float>();
        LocalTensor<int32_t> bits = y.ReinterpretCast<int32_t>();
        Mte3ToScalarSync();                                  // the tile's last copy-out has read it,
        VectorToScalarSync();                                // and its last bias Add has written it
        const int32_t ex = metaXGm.GetValue(static_cast<uint64_t>(row) * LINEAR_META);
        const bool xSpecial = metaXGm.GetValue(static_cast<uint64_t>(row) * LINEAR_META + 1) != 0;
        for (uint32_t j = 0; j < cols; ++j) {
            const uint32_t col = n0 + j;
            const bool wSpecial = metaWGm.GetValue(static_cast<uint64_t>(col) * LINEAR_META + 1) != 0;
            uint32_t out;
            if (xSpecial || wSpecial) {
                out = SpecialDot(xGm[static_cast<uint64_t>(row) * k], wGm[static_cast<uint64_t>(col) * k], k);
            } else {
                const int32_t ew = metaWGm.GetValue(static_cast<uint64_t>(col) * LINEAR_META);
                out = Exact(row, col, static_cast<int64_t>(ex) + ew - (static_cast<int64_t>(LINEAR_BX) - 2) -
                                          (static_cast<int64_t>(LINEAR_BW) - 2));
            }
            bits.SetValue(j, static_cast<int32_t>(out));
        }
        ScalarToMte3Sync();
        if (hasBias) {
            ScalarToVectorSync();
            LocalTensor<float> b = biasQueue.DeQue<float>();
            AscendC::Add(y, y, b, RoundUp(cols, FLOATS_PER_BLOCK));
            biasQueue.FreeTensor(b);
        }
        yQueue.EnQue(y);
    }

    // round32 of S[row, col] = sum_s 256^s T_s, T_s the chunks' int32 partials summed in int64: the sign of S
    // from the carry out of all its base-2^8 limbs, then |S| = hi * 2^56 + lo: seven limbs of sign * T_s carried
    // into lo, the diagonals above and the carry into hi.
    __aicore__ inline uint32_t Exact(uint32_t row, uint32_t col, int64_t p)
    {
        int64_t diagonal[LINEAR_DIAGONALS];
        for (uint32_t s = 0; s < LINEAR_DIAGONALS; ++s) {
            diagonal[s] = 0;
            for (uint32_t c = 0; c < chunks; ++c) {
                diagonal[s] += tGm.GetValue((static_cast<uint64_t>(c) * LINEAR_DIAGONALS + s) * mPad * nPad +
                                            static_cast<uint64_t>(row) * nPad + col);
            }
        }
        int64_t carry = 0;
        for (uint32_t s = 0; s < LINEAR_DIAGONALS; ++s) {
            carry = (diagonal[s] + carry) >> 8;
        }
        const bool negative = carry < 0;
        int64_t lo = 0, hi = 0;
        carry = 0;
        for (uint32_t s = 0; s < LINEAR_DIAGONALS; ++s) {
            const int64_t v = negative ? -diagonal[s] : diagonal[s];
            if (s < LINEAR_LO_LIMBS) {
                lo |= ((v + carry) & 255) << (8 * s);
                carry = (v + carry) >> 8;
            } else {
                hi += v << (8 * (s - LINEAR_LO_LIMBS));
            }
        }
        return Round32(negative, hi + carry, lo, p);
    }

    __aicore__ inline void CopyOut(uint32_t row, uint32_t n0, uint32_t cols)
    {
        LocalTensor<float> y = yQueue.DeQue<float>();
        StoreChunk(yGm[static_cast<uint64_t>(row) * n + n0], y, cols);
        yQueue.FreeTensor(y);
    }

    AscendC::TPipe pipe;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> biasQueue;
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> yQueue;
    AscendC::GlobalTensor<int32_t> tGm;
    AscendC::GlobalTensor<int32_t> metaXGm;
    AscendC::GlobalTensor<int32_t> metaWGm;
    AscendC::GlobalTensor<uint32_t> xGm;
    AscendC::GlobalTensor<uint32_t> wGm;
    AscendC::GlobalTensor<float> biasGm;
    AscendC::GlobalTensor<float> yGm;
    Range share;
    uint32_t m = 0;
    uint32_t n = 0;
    uint32_t k = 0;
    uint32_t mPad = 0;
    uint32_t nPad = 0;
    uint32_t chunks = 1;
    uint32_t columns = FLOATS_PER_BLOCK;
    bool hasBias = false;
};

}  // namespace bitparity

extern "C" __global__ __aicore__ void bitparity_linear_quantise(GM_ADDR v, GM_ADDR digits, GM_ADDR meta, uint32_t rows,
                                                                uint32_t cols, uint32_t rowsPadded,
                                                                uint32_t colsPadded, uint32_t isWeight)
{
    bitparity::KernelLinearQuantise op;
    op.Init(v, digits, meta, rows, cols, rowsPadded, colsPadded, isWeight);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_linear_digits(GM_ADDR a, GM_ADDR b, GM_ADDR t, uint32_t mPad,
                                                              uint32_t nPad, uint32_t kPad)
{
    bitparity::KernelLinearDigits op;
    op.Init(a, b, t, mPad, nPad, kPad);
    op.Process();
}

extern "C" __global__ __aicore__ void bitparity_linear_round(GM_ADDR t, GM_ADDR metaX, GM_ADDR metaW, GM_ADDR x,
                                                             GM_ADDR w, GM_ADDR bias, GM_ADDR y, uint32_t m,
                                                             uint32_t n, uint32_t k, uint32_t mPad, uint32_t nPad,
                                                             uint32_t hasBias)
{
    bitparity::KernelLinearRound op;
    op.Init(t, metaX, metaW, x, w, bias, y, m, n, k, mPad, nPad, hasBias);
    op.Process();
}
