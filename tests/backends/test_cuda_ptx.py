"""What the cuda backend's kernels become on a GPU, checked without one.

Every Triton kernel of bitparity/backends/cuda is compiled offline for sm_90
(H100/H200) with the launch options the backend uses (enable_fp_fusion=False),
and its PTX (and SASS, disassembled by the nvdisasm that ships with triton) is
searched for instructions that would change bits: fused multiply-adds,
approximate or special-function instructions, and flush-to-zero.  A negative
control compiles a*b+c with fusion on and checks that the same checker
catches the FMA, so a pass is not an empty search.

The compile runs in one subprocess (bitparity/backends/cuda/ptx.py), because
TRITON_INTERPRET=1 (which this test session may have set for the
interpreter-backed tests) turns every @triton.jit function into an
interpreted one that cannot be compiled.  No GPU or CUDA toolkit is needed.
"""

import re

import pytest

from bitparity import spec

pytest.importorskip("triton")

_ROWS = {"x_ptr": "*fp32", "mask_ptr": "*i1", "out_ptr": "*fp32",
         "n_rows": "i32", "n_cols": "i32", "n_segments": "i32"}
# A long-row configuration (LANES lanes, 16 segment slots, one row per
# program as on the GPU, with a mask) exercises every loop and tree level.
_LONG = {"BLOCK_R": 1, "W": 1024, "GP": 16}
_SOFTMAX = {**_ROWS, "scale_ptr": "*fp32"}       # one scale per row (spec 8.1)
_ELEMENTWISE = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}
_KL = {"logp_ptr": "*fp32", "ref_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32",
       "clamp": "fp32", "log_ratio_clamp": "fp32"}
_GAE_DELTA = {"r_ptr": "*fp32", "v_ptr": "*fp32", "m_ptr": "*i1", "boot_ptr": "*fp32",
              "delta_ptr": "*fp32", "weight_ptr": "*fp32", "n_rows": "i32", "n_cols": "i32",
              "gamma": "fp32", "gamma_lambda": "fp32"}
_GAE_SCAN = {"delta_ptr": "*fp32", "weight_ptr": "*fp32", "n_rows": "i32", "n_cols": "i32",
             "gamma_lambda": "fp32"}
_GAE_FINISH = {"adv_ptr": "*fp32", "v_ptr": "*fp32", "m_ptr": "*i1", "ret_ptr": "*fp32", "n": "i32"}
_PPO = {"logp_ptr": "*fp32", "old_ptr": "*fp32", "adv_ptr": "*fp32", "loss_ptr": "*fp32",
        "clipped_ptr": "*fp32", "n": "i32", "ratio_low": "fp32", "ratio_high": "fp32",
        "dual_clip": "fp32", "ratio_clamp": "fp32"}
_FILTER = {"x_ptr": "*fp32", "scale_ptr": "*fp32", "top_k_ptr": "*i64", "top_p_ptr": "*fp32", "min_p_ptr": "*fp32",
           "keys_ptr": "*i32", "mass_ptr": "*fp32", "n_rows": "i32", "n_cols": "i32", "n_padded": "i32",
           "n_segments": "i32"}
_SAMPLE = {**_FILTER, "greedy_ptr": "*i1", "seeds_ptr": "*i64", "positions_ptr": "*i64", "tokens_ptr": "*i64"}
_TOPK = {"x_ptr": "*fp32", "values_ptr": "*fp32", "indices_ptr": "*i64", "keys_ptr": "*i32", "words_ptr": "*i64",
         "n_rows": "i32", "n_cols": "i32", "n_padded": "i32", "k": "i32"}
_PHILOX = {"counters_ptr": "*i64", "keys_ptr": "*i64", "out_ptr": "*i64", "n": "i32"}
_FILTERS_ON = {"USE_MIN_P": True, "USE_TOP_K": True, "USE_TOP_P": True}
# linear (spec 24.1, 2.0.0): rows to int8 digits, the digit products on int8 tensor cores, the rounding.
_LINEAR_QUANTISE = {"v_ptr": "*i32", "digits_ptr": "*i8", "exps_ptr": "*i32", "flags_ptr": "*i32",
                    "n_rows": "i32", "n_cols": "i32"}
_LINEAR_DIGITS = {"a_ptr": "*i8", "b_ptr": "*i8", "t_ptr": "*i64", "n_rows": "i32", "n_out": "i32", "n_in": "i32"}
_LINEAR_ROUND = {"t_ptr": "*i64", "ex_ptr": "*i32", "ew_ptr": "*i32", "fx_ptr": "*i32", "fw_ptr": "*i32",
                 "x_ptr": "*i32", "w_ptr": "*i32", "bias_ptr": "*fp32", "out_ptr": "*fp32",
                 "n_rows": "i32", "n_out": "i32", "n_in": "i32"}
# spec 24.1's bits: x's rows (five int8 digits) and the weight's (four), on DX + DW - 1 digit weights.
_DX, _DW = (spec.LINEAR_BX + 8) // 8, (spec.LINEAR_BW + 8) // 8
_RMS_NORM = {"x_ptr": "*fp32", "weight_ptr": "*fp32", "out_ptr": "*fp32", "n_rows": "i32", "n_cols": "i32",
             "n_segments": "i32", "eps": "fp32"}
_ROTARY = {"x_ptr": "*fp32", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "out_ptr": "*fp32", "n_rows": "i32", "half": "i32"}
_ATTENTION = {"q_ptr": "*fp32", "k_ptr": "*fp32", "v_ptr": "*fp32", "lengths_ptr": "*i64", "out_ptr": "*fp32",
              "n_groups": "i32", "n_queries": "i32", "n_keys": "i32", "dim": "i32", "n_segments": "i32",
              "d_segments": "i32", "scale": "fp32"}
_SILU_MUL = {"gate_ptr": "*fp32", "up_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}
# Backward (spec 26): the forward's arguments plus the upstream gradient (and the
# forward's output where the kernel reads it instead of x).
_SOFTMAX_BACKWARD = {**_SOFTMAX, "g_ptr": "*fp32"}
_FROM_OUTPUT = {name: {**_SOFTMAX_BACKWARD, "x_ptr": None, f"{output}_ptr": "*fp32"}
                for name, output in (("log_softmax", "y"), ("softmax", "p"))}
_MASKED_MEAN_BACKWARD = {"mask_ptr": "*i1", "g_ptr": "*fp32", "out_ptr": "*fp32", "n_rows": "i32", "n_cols": "i32"}
_KL_BACKWARD = {**_KL, "g_ptr": "*fp32"}
_PPO_BACKWARD = {**_PPO, "loss_ptr": None, "clipped_ptr": None, "mask_ptr": "*i1", "weight_ptr": "*fp32",
                 "out_ptr": "*fp32"}
# Training (spec 29): the row fold's blocks (table, indices) and its stack of 16 levels.
_FOLD_ROWS = {"c_ptr": "*fp32", "table_ptr": "*i64", "indices_ptr": "*i64", "first_ptr": "*i64",
              "segments_ptr": "*i64", "out_ptr": "*fp32", "n_cols": "i32"}
_RMS_NORM_BACKWARD = {**_RMS_NORM, "out_ptr": None, "g_ptr": "*fp32", "dx_ptr": "*fp32", "terms_ptr": "*fp32"}
_SILU_MUL_BACKWARD = {**_SILU_MUL, "out_ptr": None, "g_ptr": "*fp32", "d_gate_ptr": "*fp32", "d_up_ptr": "*fp32"}
_STATS = {"shift_ptr": "*fp32", "recip_ptr": "*fp32", "big_g_ptr": "*fp32"}
_ATTENTION_QUERIES = {**_ATTENTION, "out_ptr": None, "g_ptr": "*fp32", "dq_ptr": "*fp32", **_STATS}
_ATTENTION_KEYS = {**_ATTENTION, "out_ptr": None, "g_ptr": "*fp32", **_STATS, "dk_ptr": "*fp32", "dv_ptr": "*fp32"}
_ADAMW = {"w_ptr": "*fp32", "g_ptr": "*fp32", "m_ptr": "*fp32", "v_ptr": "*fp32", "w_out_ptr": "*fp32",
          "m_out_ptr": "*fp32", "v_out_ptr": "*fp32", "n": "i32", "decay": "fp32", "b1": "fp32", "c1": "fp32",
          "b2": "fp32", "c2": "fp32", "ibc2": "fp32", "eps": "fp32", "step": "fp32"}
_SGD = {"w_ptr": "*fp32", "g_ptr": "*fp32", "buf_ptr": "*fp32", "w_out_ptr": "*fp32", "buf_out_ptr": "*fp32",
        "n": "i32", "lr": "fp32", "momentum": "fp32", "one_minus_dampening": "fp32", "weight_decay": "fp32"}
# Long key rows (LANES lanes, 16 segment slots) in GPU tiles (layout.attention_tile):
# one query of attention over D = 16 dims, its output 4 dims per pass.
_ATTENTION_LONG = {"BLOCK_G": 1, "BLOCK_Q": 1, "W": 1024, "GP": 16, "DW": 16, "DGP": 1, "DV": 4}
# attention's backward over the keys: one key, lanes along a long query row.
_ATTENTION_KEYS_LONG = {"BLOCK_G": 1, "BLOCK_K": 1, "W": 1024, "GP": 16, "DW": 16, "DGP": 1, "DV": 4}
# GPU geometry (layout.py): GAE's delta tiles of LANES / SCAN_TILE_COLS rows
# by SCAN_TILE_COLS columns, its reverse loop one row per thread of a
# SCAN_ROWS-row program.
_GAE_TILE = {"BLOCK_R": 32, "TC": 32}
_GAE_ROWS = {"BLOCK_R": 128}

# Instructions a kernel's PTX must contain: the search for forbidden ones
# must have something to search, and the canonical adds and multiplies must
# be there as IEEE round-to-nearest instructions that ptxas may not fuse.
_ADD = ("add.rn.f32",)
_ARITH = ("add.rn.f32", "mul.rn.f32")
_NAN_MAX = (*_ARITH, "max.NaN.f32")            # the maximum must propagate NaN (spec 4)
_NAN_CLAMP = (*_NAN_MAX, "min.NaN.f32")        # so must every clamp (spec 16, 17)
_PHILOX_ROUND = ("mul.hi.u32", "mul.lo.s32", "xor.b32")     # Philox's exact 32x32 -> 64-bit products (spec 19)

# name -> (module, kernel, runtime-argument types, constexpr values, required instructions).
# A clamp left unset is a None constexpr, so it is compiled both ways.
KERNELS = {
    "sum": ("reduce", "sum_kernel", _ROWS, {"HAS_MASK": True, **_LONG}, _ADD),
    "logsumexp": ("softmax", "logsumexp_kernel", _SOFTMAX, {"HAS_MASK": True, **_LONG}, _NAN_MAX),
    "log_softmax": ("softmax", "log_softmax_kernel", _SOFTMAX, {"HAS_MASK": True, **_LONG}, _NAN_MAX),
    "softmax": ("softmax", "softmax_kernel", _SOFTMAX, {"HAS_MASK": True, **_LONG}, _NAN_MAX),
    "entropy": ("softmax", "entropy_kernel", _SOFTMAX, {"HAS_MASK": True, **_LONG}, _NAN_MAX),
    "token_logprobs": ("softmax", "token_logprobs_kernel",
                       {**_SOFTMAX, "mask_ptr": None, "tokens_ptr": "*i64"}, _LONG, _NAN_MAX),
    "exp": ("elementwise", "exp_kernel", _ELEMENTWISE, {"BLOCK": 1024}, _ARITH),
    "log": ("elementwise", "log_kernel", _ELEMENTWISE, {"BLOCK": 1024}, _ARITH),
    "masked_mean": ("masked", "masked_mean_kernel", _ROWS, {"HAS_MASK": True, **_LONG}, _NAN_MAX),
    "masked_whiten": ("masked", "masked_whiten_kernel", {**_ROWS, "eps": "fp32"},
                      {"SHIFT_MEAN": False, "UNBIASED": True, "CLAMP": False, **_LONG}, _NAN_MAX),
    "masked_whiten_clamp": ("masked", "masked_whiten_kernel", {**_ROWS, "eps": "fp32"},
                            {"SHIFT_MEAN": False, "UNBIASED": True, "CLAMP": True, **_LONG}, _NAN_MAX),
    "kl_k3_clamped": ("kl", "kl_penalty_kernel", _KL, {"KIND": "k3", "BLOCK": 1024}, _NAN_CLAMP),
    "kl_k2_unclamped": ("kl", "kl_penalty_kernel", _KL,
                        {"KIND": "k2", "BLOCK": 1024, "clamp": None, "log_ratio_clamp": None}, ("mul.rn.f32",)),
    "gae_delta_carry": ("gae", "gae_delta_kernel", _GAE_DELTA, {"CARRY": True, **_GAE_TILE}, _ARITH),
    "gae_delta_zero": ("gae", "gae_delta_kernel", _GAE_DELTA, {"CARRY": False, **_GAE_TILE}, _ARITH),
    "gae_scan_carry": ("gae", "gae_scan_kernel", _GAE_SCAN, {"CARRY": True, **_GAE_ROWS}, _ARITH),
    "gae_scan_zero": ("gae", "gae_scan_kernel", _GAE_SCAN, {"CARRY": False, **_GAE_ROWS}, _ARITH),
    "gae_finish_carry": ("gae", "gae_finish_kernel", _GAE_FINISH, {"CARRY": True, "BLOCK": 1024}, _ADD),
    "gae_finish_zero": ("gae", "gae_finish_kernel", _GAE_FINISH, {"CARRY": False, "BLOCK": 1024}, _ADD),
    "ppo_token_dual_clip": ("ppo", "ppo_token_kernel", _PPO, {"BLOCK": 1024}, _NAN_CLAMP),
    "ppo_token_unclamped": ("ppo", "ppo_token_kernel", _PPO,
                            {"BLOCK": 1024, "dual_clip": None, "ratio_clamp": None}, _NAN_CLAMP),
    "philox": ("sampling", "philox_kernel", _PHILOX, {"BLOCK": 1024}, _PHILOX_ROUND),
    "filter_logits": ("sampling", "filter_logits_kernel", {**_FILTER, "out_ptr": "*fp32"},
                      {**_FILTERS_ON, **_LONG}, _NAN_MAX),
    "sample": ("sampling", "sample_kernel", _SAMPLE, {**_FILTERS_ON, **_LONG}, (*_NAN_MAX, *_PHILOX_ROUND)),
    # A beam-search k: 64 sort words per row.
    "topk": ("topk", "topk_kernel", _TOPK, {"BLOCK_R": 1, "W": 1024, "KP": 64}, _ADD),
    # linear's GPU launch (linear._tiles): 64 x 64 x 64 tiles, wgmma on sm_90.  Only the bias's add is float.
    "linear_quantise": ("linear", "quantise_rows_kernel", _LINEAR_QUANTISE,
                        {"B": spec.LINEAR_BX, "D": _DX, "BLOCK_R": 1, "BLOCK_C": 1024}, ()),
    "linear_digits": ("linear", "digit_gemm_kernel", _LINEAR_DIGITS,
                      {"DX": _DX, "DW": _DW, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "CHUNK": 8192}, ()),
    "linear_round": ("linear", "round_kernel", _LINEAR_ROUND,
                     {"HAS_BIAS": True, "BX": spec.LINEAR_BX, "BW": spec.LINEAR_BW, "NDIAG": _DX + _DW - 1,
                      "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 8}, _ADD),
    "rms_norm": ("rms_norm", "rms_norm_kernel", _RMS_NORM, _LONG, _ARITH),
    "rotary": ("rotary", "rotary_kernel", _ROTARY, {"BLOCK_R": 1, "W": 1024}, (*_ARITH, "sub.rn.f32")),
    # Causal only: the flag adds one integer minimum, no float instruction (and each compile takes seconds).
    "attention": ("attention", "attention_kernel", _ATTENTION, {"CAUSAL": True, **_ATTENTION_LONG}, _NAN_MAX),
    "silu_mul": ("elementwise", "silu_mul_kernel", _SILU_MUL, {"BLOCK": 1024}, _ARITH),
    "logsumexp_backward": ("softmax", "logsumexp_backward_kernel", _SOFTMAX_BACKWARD,
                           {"HAS_MASK": True, **_LONG}, _NAN_MAX),
    "log_softmax_backward": ("softmax", "log_softmax_backward_kernel", _FROM_OUTPUT["log_softmax"],
                             {"HAS_MASK": True, **_LONG}, _ARITH),
    "softmax_backward": ("softmax", "softmax_backward_kernel", _FROM_OUTPUT["softmax"],
                         {"HAS_MASK": True, **_LONG}, _ARITH),
    "entropy_backward": ("softmax", "entropy_backward_kernel", {**_SOFTMAX_BACKWARD, "h_ptr": "*fp32"},
                         {"HAS_MASK": True, **_LONG}, _NAN_MAX),
    "token_logprobs_backward": ("softmax", "token_logprobs_backward_kernel",
                                {**_SOFTMAX_BACKWARD, "mask_ptr": None, "tokens_ptr": "*i64"}, _LONG, _NAN_MAX),
    "masked_mean_backward": ("masked", "masked_mean_backward_kernel", _MASKED_MEAN_BACKWARD,
                             {"BLOCK_R": 1, "W": 1024}, _NAN_MAX),
    "masked_whiten_backward": ("masked", "masked_whiten_backward_kernel", {**_ROWS, "g_ptr": "*fp32", "eps": "fp32"},
                               {"SHIFT_MEAN": False, "UNBIASED": True, "CLAMP": False, **_LONG}, _NAN_MAX),
    "masked_whiten_backward_clamp": ("masked", "masked_whiten_backward_kernel",
                                     {**_ROWS, "g_ptr": "*fp32", "eps": "fp32"},
                                     {"SHIFT_MEAN": False, "UNBIASED": True, "CLAMP": True, **_LONG}, _NAN_MAX),
    "kl_backward_k3_clamped": ("kl", "kl_penalty_backward_kernel", _KL_BACKWARD, {"KIND": "k3", "BLOCK": 1024},
                               _NAN_CLAMP),
    # abs and k2 add nothing: d = ref - logp is their one subtraction.  (k1's
    # gradient is -g, a sign flip: no float instruction at all.)
    "kl_backward_abs_clamped": ("kl", "kl_penalty_backward_kernel", _KL_BACKWARD, {"KIND": "abs", "BLOCK": 1024},
                                ("sub.rn.f32", "mul.rn.f32", "max.NaN.f32", "min.NaN.f32")),
    "kl_backward_k2_unclamped": ("kl", "kl_penalty_backward_kernel", _KL_BACKWARD,
                                 {"KIND": "k2", "BLOCK": 1024, "clamp": None, "log_ratio_clamp": None},
                                 ("sub.rn.f32", "mul.rn.f32")),
    "ppo_backward_dual_clip": ("ppo", "ppo_backward_kernel", _PPO_BACKWARD, {"BLOCK": 1024}, _NAN_CLAMP),
    "ppo_backward_unclamped": ("ppo", "ppo_backward_kernel", _PPO_BACKWARD,
                               {"BLOCK": 1024, "dual_clip": None, "ratio_clamp": None}, _NAN_CLAMP),
    # GPU tiles (layout.fold_tile).
    "fold_rows": ("fold", "fold_rows_kernel", _FOLD_ROWS, {"B": 32, "T": 128, "LP": 16}, _ADD),
    "rms_norm_backward": ("rms_norm", "rms_norm_backward_kernel", _RMS_NORM_BACKWARD, _LONG, _ARITH),
    "silu_mul_backward": ("elementwise", "silu_mul_backward_kernel", _SILU_MUL_BACKWARD, {"BLOCK": 1024},
                          (*_ARITH, "sub.rn.f32")),
    # One row per program, 16 segment slots.  The query kernel (the softmax statistics, then two more
    # passes over the keys) takes 128 key lanes: the same instructions as LANES lanes, in a fifth of the
    # compile time (92 s at LANES on the development machine).
    "attention_backward_queries": ("attention", "attention_backward_query_kernel", _ATTENTION_QUERIES,
                                   {"CAUSAL": True, **_ATTENTION_LONG, "W": 128}, _NAN_MAX),
    "attention_backward_keys": ("attention", "attention_backward_key_kernel", _ATTENTION_KEYS,
                                {"CAUSAL": True, **_ATTENTION_KEYS_LONG}, (*_ARITH, "sub.rn.f32")),
    # Every optional term on, then off where the kernel has another path (SGD's first step).
    "adamw": ("optim", "adamw_kernel", _ADAMW, {"BLOCK": 1024}, (*_ARITH, "sub.rn.f32")),
    "sgd_nesterov_decay": ("optim", "sgd_kernel", _SGD, {"FIRST": False, "NESTEROV": True, "BLOCK": 1024}, _ARITH),
    "sgd_first_step": ("optim", "sgd_kernel", _SGD, {"FIRST": True, "NESTEROV": False, "BLOCK": 1024,
                                                    "weight_decay": None}, ("mul.rn.f32", "sub.rn.f32")),
}
CONTROL = ("control_fused", "control_unfused")

# Float instructions that must not appear.  fma/mad: fused multiply-add (one
# rounding instead of two).  .approx / .ftz: approximate results, flushed
# subnormals.  div/rcp/sqrt/ex2/lg2/...: platform division and transcendental
# functions, none of which the canonical order uses.  add/sub/mul without an
# explicit rounding mode: ptxas may contract those into an FMA.
_PTX_FORBIDDEN = re.compile(
    r"\b(?:fma|mad)\.[\w.]*f32\b"
    r"|\.approx\b|\.ftz\b"
    r"|\b(?:div|rcp|sqrt|rsqrt|ex2|lg2|sin|cos|tanh)\.[\w.]*f32\b"
    r"|\b(?:add|sub|mul)\.f32\b")
# SASS: FFMA (fused), MUFU (the special-function unit: approximate), .FTZ.
_SASS_FORBIDDEN = re.compile(r"\bFFMA\b|\bMUFU\b|\.FTZ\b")


def forbidden(ptx, sass):
    """The offending instructions, each with the line it is on."""
    found = [line.strip() for line in ptx.splitlines() if _PTX_FORBIDDEN.search(line)]
    if sass is not None:
        found += [line.strip() for line in sass.splitlines() if _SASS_FORBIDDEN.search(line)]
    return found


@pytest.fixture(scope="module")
def compiled():
    from bitparity.backends.cuda import ptx

    jobs = {name: (f"bitparity.backends.cuda.{module}", kernel, signature, constexprs, False)
            for name, (module, kernel, signature, constexprs, _) in KERNELS.items()}
    control = ("bitparity.backends.cuda.ptx", "multiply_add_kernel", ptx.MULTIPLY_ADD_SIGNATURE, {"BLOCK": 256})
    jobs["control_fused"] = (*control, True)
    jobs["control_unfused"] = (*control, False)
    return ptx.compile_offline(jobs)


@pytest.mark.parametrize("name", list(KERNELS))
def test_kernel_has_only_canonical_float_instructions(compiled, name):
    ptx, sass = compiled[name]["ptx"], compiled[name]["sass"]
    assert ".entry" in ptx and ".target sm_90" in ptx
    for instruction in KERNELS[name][4]:
        assert instruction in ptx, f"{instruction} missing"
    if sass is not None and "add.rn.f32" in KERNELS[name][4]:
        assert "FADD" in sass
    assert forbidden(ptx, sass) == []


# An int8 x int8 -> int32 tensor-core instruction: wgmma (sm_90, 64 x N x 32) or mma.sync (m16n8k32).
_INT8_MMA = re.compile(r"\bwgmma\.mma_async[\w.]*\.s32\.s8\.s8\b|\bmma\.sync[\w.]*\.s32\.s8\.s8\.s32\b")
_FLOAT_OP = re.compile(r"\.f(?:16|32|64)\b|\.bf16\b|\.tf32\b|\.e[45]m[23]\b")


def test_linear_digit_products_run_on_int8_tensor_cores(compiled):
    """spec 24.1's integer product: the GEMM kernel's sm_90 PTX holds int8 MMA instructions and no float
    instruction at all; integer address arithmetic (mad.lo.s32, mad.wide.s32) is not float."""
    ptx = compiled["linear_digits"]["ptx"]
    assert _INT8_MMA.search(ptx), "no int8 wgmma/mma.sync"
    assert [line.strip() for line in ptx.splitlines() if _FLOAT_OP.search(line) and not line.strip().startswith("//")
            ] == []
    assert forbidden(ptx, compiled["linear_digits"]["sass"]) == []


def test_int8_mma_checker_rejects_float_mma():
    """Negative control: a float MMA line does not pass as an int8 one, and is a float instruction."""
    line = "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%f1}, %rd1, %rd2, p, 1, 1, 0, 0;"
    assert not _INT8_MMA.search(line) and _FLOAT_OP.search(line)
    assert _INT8_MMA.search("wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {%r1}, %rd1, %rd2, p;")
    assert _INT8_MMA.search("mma.sync.aligned.m16n8k32.row.col.satfinite.s32.s8.s8.s32 {%r1}, {%r2}, {%r3}, {%r4};")
    assert forbidden("mad.lo.s32 %r5, %r1, %r2, %r3;\nmad.wide.s32 %rd4, %r5, 4, %rd1;", None) == []
    assert forbidden("mad.rn.f32 %f3, %f1, %f2, %f0;", None) != []


def test_checker_catches_fused_multiply_add(compiled):
    fused, unfused = compiled["control_fused"], compiled["control_unfused"]
    assert any("fma.rn.f32" in line for line in forbidden(fused["ptx"], None))
    if fused["sass"] is not None:
        assert any("FFMA" in line for line in forbidden("", fused["sass"]))
    assert forbidden(unfused["ptx"], unfused["sass"]) == []
