/* Sums of products (spec 24's dot) for the `cpu` backend, PANEL sums at a time:
 * the panels that linear.c and attention.c pack their second factor into, and
 * attention's panel_dot (forward and backward).  See canonical.h for why the
 * bits cannot depend on the build. */

#ifndef BP_CPU_DOT_PANELS_H
#define BP_CPU_DOT_PANELS_H

#include "canonical.h"

/* linear and attention are sums of products, computed PANEL sums at a time: a
 * panel holds PANEL columns of the second factor with term j's PANEL values
 * contiguous ([n][PANEL]), so the lane accumulation and every tree level are
 * element-wise over the PANEL columns (one vector op, no horizontal step).
 * Each column is its own canonical sum in row_sum's order: per segment, lanes
 * accumulate terms j, j + W, ... from -0.0, then the halving tree; then the
 * partial tree over segments (halving_tree_cols, combine_partials_cols). */
#define PANEL 16

/* panel[j][c] = src[(c0 + c) * col_stride + j * term_stride] for j < n, c < PANEL, and +0.0 for the
 * columns c0 + c >= cols past the data (their sums are computed and dropped). */
static inline void pack_panel(const float *src, int64_t n, int64_t cols, int64_t c0, int64_t col_stride,
                              int64_t term_stride, float *panel)
{
    int64_t filled = cols - c0 < PANEL ? cols - c0 : PANEL;
    for (int64_t j = 0; j < n; j++) {
        for (int64_t c = 0; c < filled; c++)
            panel[j * PANEL + c] = src[(c0 + c) * col_stride + j * term_stride];
        for (int64_t c = filled; c < PANEL; c++)
            panel[j * PANEL + c] = 0.0f;
    }
}

/* Floats of scratch panel_dot needs for sums of up to n terms: W lanes and the segment partials. */
static inline int64_t panel_scratch_size(int64_t n)
{
    return (lane_width(n) + next_pow2((n + BP_SEGMENT - 1) / BP_SEGMENT)) * PANEL;
}

/* out[c] = canonical sum over j < n of a[j] * panel[j][c], each product rounded once, for c < PANEL, with
 * the terms j < first absent (-0.0: attention's backward sums over the queries that see a key, a suffix).
 * Spec 3; spec 24's dot.  scratch: panel_scratch_size(n) floats. */
ALWAYS_INLINE void panel_dot_from(const float *a, const float *panel, int64_t first, int64_t n, float *scratch,
                                  float *out)
{
    int64_t w = lane_width(n);
    float *lanes = scratch, *partials = scratch + w * PANEL;
    int64_t g = 0;
    for (int64_t s = 0; s < n; s += BP_SEGMENT, g++) {
        int64_t len = n - s < BP_SEGMENT ? n - s : BP_SEGMENT;
        for (int64_t i = 0; i < w * PANEL; i++)
            lanes[i] = NEG_ZERO;
        /* term j goes to lane j mod W, so each lane meets its terms in increasing order */
        for (int64_t j = first > s ? first - s : 0; j < len; j++) {
            float aj = a[s + j];
            const float *pj = panel + (s + j) * PANEL;
            float *lj = lanes + (j & (w - 1)) * PANEL;
            /* simd: without it gcc unrolls this short loop into scalar code before it would vectorise */
#pragma omp simd
            for (int64_t c = 0; c < PANEL; c++)
                lj[c] = lj[c] + aj * pj[c];
        }
        halving_tree_cols(lanes, w, PANEL);
        memcpy(partials + g * PANEL, lanes, sizeof(float) * PANEL);
    }
    combine_partials_cols(partials, g, PANEL);
    memcpy(out, partials, sizeof(float) * PANEL);
}

/* panel_dot_from with every term present. */
ALWAYS_INLINE void panel_dot(const float *a, const float *panel, int64_t n, float *scratch, float *out)
{
    panel_dot_from(a, panel, 0, n, scratch, out);
}

#endif /* BP_CPU_DOT_PANELS_H */
