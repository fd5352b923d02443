"""One prepared run on real hardware: golden digests, platform probe and benchmark, written to a folder.

scripts/gpu_check.py runs it for the `cuda` backend and scripts/npu_check.py for `ascend`.  The steps,
in order:

1. verify: every case of the conformance suite on the backend, forward and gradient (compare/grad_cases.py:
   the backward of every differentiable op, AdamW and SGD steps, clip_grad_norm_, GradientFold; in the Triton
   interpreter, compare's subset), digests against the goldens (golden.verify); mismatches are printed with their
   op, gradient tensor, max ulp and first differing index;
2. probe: the platform assumptions of the spec, on the backend's device (compare/probe.py);
3. bench: every op against torch's native op and the device's copy bandwidth (compare/bench.py),
   with the issue's targets checked;
3.1. linear (the `cuda` backend only, issue 24): spec 2.0.0's linear against torch's bf16 and float32 (TF32 off)
   matmul, forward and forward + backward, in TFLOP/s-equivalent, at 4096³ and two lm_head shapes
   (compare/linear_bench.py; with --small one tiny shape);
4. rl_check: one RL step of spec §25 on the device (rl/check.py): rollout against trainer bit for bit, and
   the digest against spec §25.6's (with --small: the first 3 requests, against numpy's on the CPU);
5. train: spec §29 on the device: the 3-step weights digest of `rl-check --steps 3` against spec §29.13's
   (with --small: the gradients of a tiny linear, rms_norm, attention and moe and one AdamW step, against
   numpy's bits on the CPU);
6. hf_rl_check: one RL step on a Hugging Face model patched by bitparity.patch, `rl-check --model qwen3_moe`
   (grouped-query attention, a dense first layer, norm_topk_prob off), its digest against spec §25.7's
   (with --small: the first request only, against numpy's on the CPU);
7. write <name>.json and <name>.md under --out (default: $OUT, else ./<name>).

Each step is run on its own: one that raises is recorded with its traceback and the others still
run and are written.  Exit status: 0 when every step ran and every digest matched; 1 when a digest
(golden, RL step, training or the HF step) mismatched or verify could not run; 2 when every digest matched but
another step failed.

Time on an H200 (an estimate: no GPU run yet; docs/portability.md gives its basis): under 8 minutes in all.

Without the hardware the same run works on the CPU through the backend's test double (the Triton
interpreter, the Ascend C host emulation), with --small shapes: CI runs it that way so that it
cannot rot.  Those numbers say nothing about a GPU or an NPU, and the report says so.
"""

import argparse
import json
import os
import time
import traceback
from pathlib import Path

from .cli_common import add_tier_args, tier

SOFTMAX_SHAPES = ((64, 151936), (4096, 32000))
SHAPES = {
    "hardware": {"softmax": SOFTMAX_SHAPES, "elementwise": ((1 << 24,),), "rl": ((256, 4096), (4096, 512)),
                 "sampling": ((64, 151936),), "linear": ((1, 4096, 4096), (256, 4096, 4096)),
                 "rms_norm": ((4096, 4096),), "rotary": ((4096, 32, 128),),
                 "attention": ((4, 32, 512, 512, 128), (64, 32, 1, 2048, 128)), "silu_mul": ((1 << 24,),),
                 "moe": ((512, 1024, 32, 512, 4),), "embedding": ((4096, 151936, 1024),)},
    "small": {"softmax": ((4, 2048),), "elementwise": ((1 << 14,),), "rl": ((8, 256),), "sampling": ((4, 2048),),
              "linear": ((4, 256, 64),), "rms_norm": ((8, 256),), "rotary": ((8, 4, 64),),
              "attention": ((1, 2, 16, 16, 32),), "silu_mul": ((1 << 14,),), "moe": ((8, 32, 8, 16, 2),),
              "embedding": ((16, 512, 64),)},
}
# The gradient ops the bench step times with --small (a test double's times say nothing; CI checks the step's
# structure): one of the softmax family, a model block and an optimizer step. The hardware times all of them.
SMALL_GRAD_BENCH = ("log_softmax.backward", "linear.backward", "AdamW.step")
# Spec §25.7's seed-0 step digest of `rl-check --model qwen3_moe` (numpy, cpu and ascend alike).
HF_MODEL = "qwen3_moe"
PUBLISHED_HF_DIGEST = "cf2cdc99c91151b4e41ca8b40781ab37c092307be82457f839bf138dc9ebfcf7"
# The backends whose run times linear against torch's matmul (step 3.1): issue 24 asks it of the GPU run.
LINEAR_BENCH_BACKENDS = ("cuda",)
MEMORY_BOUND = ("logsumexp", "log_softmax", "softmax", "entropy", "token_logprobs", "gae")
TARGET_COPY_FRACTION = 0.8        # memory-bound ops: at least 80% of the measured copy bandwidth
TARGET_NATIVE_RATIO = 1.0         # log_softmax and token_logprobs: no slower than torch's op
TARGET_GAE_SPEEDUP = 50.0         # GAE against the Python loop (the native backend)


def parser(name, backend, double_flag, double_help):
    p = argparse.ArgumentParser(prog=name, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(double_flag, dest="test_double", action="store_true", help=double_help)
    p.add_argument("--small", action="store_true", help="small benchmark shapes (for CI and test doubles)")
    add_tier_args(p)
    p.add_argument("--out", help="folder for the JSON and Markdown results (default: $OUT, else ./%s)" % name)
    p.add_argument("--repeats", type=int, help="timed runs per benchmark measurement (default: 20, 3 with --small)")
    p.set_defaults(backend=backend, name=name)
    return p


def bench_ops(small):
    """The forward ops, then the gradient ops (with --small, SMALL_GRAD_BENCH)."""
    from .grad_cases import GRAD_OPS
    from .run import OPS
    return list(OPS) + list(SMALL_GRAD_BENCH if small else GRAD_OPS)


def bench_shapes(small):
    """Shapes per op; a backward takes its forward's first shape (one measurement pair per gradient op, to keep
    the run's time bounded), the training steps their conformance case of the bench's tier (bench.default_shapes)."""
    from .bench import family
    sizes = SHAPES["small" if small else "hardware"]
    return {op: sizes[family(op)][:1] if op.endswith(".backward") else sizes[family(op)]
            for op in bench_ops(small) if family(op) in sizes}


def targets(rows):
    """The issue's performance targets against the bench rows: (target, measured, met) tuples."""
    found = []
    for r in rows:
        if r["backend"] == "native":
            continue
        shape = "x".join(map(str, r["shape"]))
        if r["op"] in MEMORY_BOUND:
            found.append((f"{r['op']} {shape}: >= {TARGET_COPY_FRACTION:.0%} of copy bandwidth",
                          f"{r['fraction_of_copy']:.1%}", r["fraction_of_copy"] >= TARGET_COPY_FRACTION))
        if r["op"] in ("log_softmax", "token_logprobs"):
            found.append((f"{r['op']} {shape}: <= {TARGET_NATIVE_RATIO}x torch's time",
                          f"{r['ratio_to_native']:.2f}x", r["ratio_to_native"] <= TARGET_NATIVE_RATIO))
        if r["op"] == "gae":
            speedup = 1.0 / r["ratio_to_native"]
            found.append((f"gae {shape}: >= {TARGET_GAE_SPEEDUP:.0f}x the Python loop", f"{speedup:.1f}x",
                          speedup >= TARGET_GAE_SPEEDUP))
    return found


def _step(results, name, fn):
    """Run one step; record its value, or its traceback if it raises."""
    start = time.perf_counter()
    print(f"== {name}", flush=True)
    try:
        results[name] = {"status": "ok", "value": fn()}
    except Exception:                                # a failed step must not stop the others
        results[name] = {"status": "error", "error": traceback.format_exc()}
        print(results[name]["error"], flush=True)
    results[name]["seconds"] = time.perf_counter() - start


def _verify(backend, tier_):
    from . import cases, golden, grad_cases, run
    # The Triton interpreter verifies the subset compare runs on it (run.INTERPRETER_RULE): every op and row
    # kind, none of the 151936-wide rows, which cost it seconds each, one case per gradient op; a GPU verifies the
    # whole tier, forward and gradient.
    suite = cases.suite(tier_) + grad_cases.suite(tier_)
    names = run.interpreter_subset(suite) if run.interpreted(backend) else None
    if names is not None:
        print(f"the Triton interpreter verifies {len(names)} of {len(suite)} cases: {run.INTERPRETER_RULE}",
              flush=True)
    rows = golden.verify(backend, tier_, names=names)
    for r in rows:
        if not r["match"]:
            what = f"{r['name']} ({r['op']}{', ' + r['tensor'] if r['tensor'] else ''})"
            print(f"ERROR {what}: {r['error']}" if r["error"] else
                  f"MISMATCH {what}: max ulp {r['max_ulp']}, first diff at {r['first_diff']}")
    print(f"{sum(r['match'] for r in rows)}/{len(rows)} digests (forward cases and gradient tensors) match the "
          f"golden digests", flush=True)
    return rows


def _probe(backend):
    from dataclasses import asdict

    from . import probe
    findings = probe.probe(backend)
    print(probe.render(findings, "table", backend), flush=True)
    return [asdict(f) for f in findings]


def _bench(backend, small, repeats):
    from . import bench
    rows = bench.run([backend], bench_ops(small), shapes=bench_shapes(small), tier="quick" if small else "full",
                     repeats=repeats)
    print(bench.render(rows, "table"), flush=True)
    return rows


def _linear(backend, small, repeats):
    from . import linear_bench
    rows = linear_bench.run(backend, small, repeats)
    print(linear_bench.render(rows, "simple"), flush=True)
    return rows


def _rl_check(backend, small):
    """One RL step of spec §25 on the backend's device: rollout against trainer, and its digest against spec
    §25.6's (the default 12 requests) or, with small shapes, against numpy's for the first 3 requests."""
    from ..models import ModelConfig
    from ..rl import check, default_requests
    config = ModelConfig()
    requests = default_requests(0, vocab=config.vocab)[:3] if small else default_requests(0, vocab=config.vocab)
    doc = check.summary(*check.run_step(*check.models(backend, 0, config), requests))
    doc["expected_digest"] = (check.summary(*check.run_step(*check.models("numpy", 0, config), requests))["digest"]
                              if small else check.PUBLISHED_DIGESTS[0])
    doc["ok"] = doc["consistent"] and doc["digest"] == doc["expected_digest"]
    print(f"rl-check: {doc['logprob']['bitwise_equal']}/{doc['logprob']['tokens']} log-probs and "
          f"{doc['value']['bitwise_equal']}/{doc['value']['tokens']} values equal, digest "
          f"{'as expected' if doc['digest'] == doc['expected_digest'] else 'DIFFERENT'}", flush=True)
    return doc


def _hf_rl_check(backend, small):
    """One RL step of spec §25.7 on a patched HF model (HF_MODEL) on the backend's device: rollout against trainer,
    and its digest against spec §25.7's (the 12 default requests) or, with small, against numpy's on the CPU for
    the first request."""
    from ..models import hf_policy
    from ..rl import check, default_requests
    model = hf_policy.builtin(HF_MODEL)
    requests = default_requests(0, vocab=model.vocab)
    requests = requests[:1] if small else requests
    doc = check.summary(*check.run_step(*check.models(backend, 0, model), requests))
    doc["model"] = HF_MODEL
    doc["expected_digest"] = (check.summary(*check.run_step(*check.models("numpy", 0, model), requests))["digest"]
                              if small else PUBLISHED_HF_DIGEST)
    doc["ok"] = doc["consistent"] and doc["digest"] == doc["expected_digest"]
    print(f"rl-check --model {HF_MODEL}: {doc['logprob']['bitwise_equal']}/{doc['logprob']['tokens']} log-probs and "
          f"{doc['value']['bitwise_equal']}/{doc['value']['tokens']} values equal, digest "
          f"{'as expected' if doc['digest'] == doc['expected_digest'] else 'DIFFERENT'}", flush=True)
    return doc


def _small_training(backend):
    """Gradients of tiny blocks and one AdamW step on the backend, bit for bit against numpy on the CPU."""
    import torch

    from .. import ops, optim
    from ..backends import device_type
    from .metrics import canonical_bits
    gen = torch.Generator().manual_seed(29)
    inputs = [torch.randn(*shape, generator=gen) for shape in ((6, 32), (8, 32), (32,), (1, 2, 5, 16), (4, 32),
                                                                (4, 8, 32), (4, 8, 32), (4, 32, 8))]

    def grads(name):
        device = torch.device(device_type(name))
        leaves = [t.to(device).clone().requires_grad_() for t in inputs]      # fresh leaves: no .grad carried over
        x, w, nw, q, router, gate, up, down = leaves
        loss = (ops.linear(x, w, backend=name).sum() + ops.rms_norm(x, nw, backend=name).sum()
                + ops.attention(q, q, q, backend=name).sum()
                + ops.moe(x, router, gate, up, down, 2, backend=name).sum())
        loss.backward()
        step = torch.nn.Parameter(w.detach().clone())
        step.grad = w.grad.clone()
        optim.AdamW([step], lr=1e-2, backend=name).step()
        return [canonical_bits(t.grad.cpu()) for t in leaves] + [canonical_bits(step.detach().cpu())]

    ours, want = grads(backend), grads("numpy")
    equal = [bool(torch.equal(a, b)) for a, b in zip(ours, want)]
    return {"tensors": len(equal), "equal": sum(equal), "ok": all(equal)}


def _train(backend, small):
    """Spec §29 on the device: the 3-step weights digest (or, with small, tiny gradients and an AdamW step)."""
    if small:
        doc = _small_training(backend)
    else:
        from ..rl import check
        run = check.train_check(backend, 0, 3)
        doc = {"weights_digest": run["weights_digest"], "expected": run["published_weights_digest"],
               "consistent": run["consistent"], "ok": bool(run["matches_published"]) and run["consistent"]}
    print(f"train: {'as expected' if doc['ok'] else 'DIFFERENT'} ({doc})", flush=True)
    return doc


def _environment():
    from . import report
    return {"packages": report.packages(), "device": report.device(), "machine": report.machine()}


def _markdown(name, backend, where, test_double, results):
    lines = [f"# {name}: the `{backend}` backend", "", f"Ran on: {where}.", ""]
    env = results["environment"]
    if env["status"] == "ok":
        lines += ["```", json.dumps(env["value"], indent=1), "```", ""]
    verify = results["verify"]
    lines += ["## 1. Golden digests", ""]
    if verify["status"] == "ok":
        rows = verify["value"]
        bad = [r for r in rows if not r["match"]]
        lines += [f"{len(rows) - len(bad)}/{len(rows)} digests match (forward cases and gradient tensors).", ""]
        if bad:
            lines += ["| case | op | tensor | max ulp | first diff | error |", "| --- | --- | --- | --- | --- | --- |"]
            lines += [f"| {r['name']} | {r['op']} | {r['tensor'] or ''} | {r['max_ulp']} | {r['first_diff']} | "
                      f"{r['error'] or ''} |" for r in bad]
            lines.append("")
    else:
        lines += ["Did not run: see the failed step below.", ""]
    from . import bench, probe
    if results["probe"]["status"] == "ok":
        findings = [probe.Finding(**f) for f in results["probe"]["value"]]
        lines += ["## 2. Probe", "", probe.render(findings, "markdown", backend), ""]
    if results["bench"]["status"] == "ok":
        rows = results["bench"]["value"]
        lines += ["## 3. Benchmark", "", bench.render(rows, "markdown"), "", "### Targets", ""]
        if test_double:
            lines += ["The targets are for the hardware; this run timed a test double on the CPU, so they are "
                      "listed only to keep the check exercised.", ""]
        lines += ["| target | measured | met |", "| --- | --- | --- |"]
        lines += [f"| {t} | {m} | {'yes' if ok else '**no**'} |" for t, m, ok in targets(rows)]
        lines.append("")
    if results.get("linear", {}).get("status") == "ok":
        from . import linear_bench
        lines += ["## 3.1. linear against torch's matmul (issue 24)", "",
                  "Spec 2.0.0's `linear` on the backend against torch's `F.linear` on the same device, in bf16 and "
                  "in float32 with TF32 off; TFLOP/s-equivalent is 2·M·N·K per forward (3× that for forward + "
                  "backward) over the median time (compare/linear_bench.py).", ""]
        if test_double:
            lines += ["This run timed a test double on the CPU (and torch's CPU matmul): it says nothing about a "
                      "GPU.", ""]
        lines += [linear_bench.render(results["linear"]["value"], "github"), ""]
    if results["rl_check"]["status"] == "ok":
        rl = results["rl_check"]["value"]
        lines += ["## 4. RL step (spec §25)", "",
                  f"Rollout against trainer: {rl['logprob']['bitwise_equal']}/{rl['logprob']['tokens']} log-probs and "
                  f"{rl['value']['bitwise_equal']}/{rl['value']['tokens']} values bitwise equal, max |logp diff| "
                  f"{rl['logprob']['max_abs_diff']}; digest `{rl['digest']}`, expected `{rl['expected_digest']}`: "
                  f"{'equal' if rl['ok'] else '**not equal**'}.", ""]
    if results["train"]["status"] == "ok":
        lines += ["## 5. Training (spec §29)", "", f"`{json.dumps(results['train']['value'])}`: "
                  f"{'equal' if results['train']['value']['ok'] else '**not equal**'}.", ""]
    if results["hf_rl_check"]["status"] == "ok":
        hf = results["hf_rl_check"]["value"]
        lines += [f"## 6. RL step on a patched Hugging Face model (spec §25.7, `--model {hf['model']}`)", "",
                  f"Rollout against trainer: {hf['logprob']['bitwise_equal']}/{hf['logprob']['tokens']} log-probs and "
                  f"{hf['value']['bitwise_equal']}/{hf['value']['tokens']} values bitwise equal; digest "
                  f"`{hf['digest']}`, expected `{hf['expected_digest']}`: {'equal' if hf['ok'] else '**not equal**'}.",
                  ""]
    failed = [k for k, v in results.items() if v["status"] == "error"]
    for k in failed:
        lines += [f"## Step `{k}` failed", "", "```", results[k]["error"].rstrip(), "```", ""]
    return "\n".join(lines)


def _where(backend):
    from ..backends import availability
    available, reason = availability(backend)
    return reason if available else f"unavailable: {reason}"


def exit_status(results):
    verify = results["verify"]
    if verify["status"] != "ok" or not all(r["match"] for r in verify["value"]):
        return 1
    if any(results[k]["status"] == "ok" and not results[k]["value"]["ok"] for k in ("rl_check", "train",
                                                                                   "hf_rl_check")):
        return 1
    return 2 if any(v["status"] != "ok" for v in results.values()) else 0


def run(args, has_device, missing_device):
    """Run the steps for parsed args; has_device: whether the real device is here."""
    if not has_device and not args.test_double:
        raise SystemExit(f"{args.name}: {missing_device}")
    out = Path(args.out or os.environ.get("OUT") or args.name)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    _step(results, "environment", _environment)
    _step(results, "verify", lambda: _verify(args.backend, tier(args)))
    _step(results, "probe", lambda: _probe(args.backend))
    repeats = args.repeats or (3 if args.small else 20)
    _step(results, "bench", lambda: _bench(args.backend, args.small, repeats))
    if args.backend in LINEAR_BENCH_BACKENDS:
        _step(results, "linear", lambda: _linear(args.backend, args.small, repeats))
    _step(results, "rl_check", lambda: _rl_check(args.backend, args.small))
    _step(results, "train", lambda: _train(args.backend, args.small))
    _step(results, "hf_rl_check", lambda: _hf_rl_check(args.backend, args.small))
    where = _where(args.backend)
    status = exit_status(results)
    doc = {"name": args.name, "backend": args.backend, "where": where, "small": args.small, "tier": tier(args),
           "exit_status": status, "steps": results}
    (out / f"{args.name}.json").write_text(json.dumps(doc, indent=1, default=str))
    (out / f"{args.name}.md").write_text(_markdown(args.name, args.backend, where, args.test_double, results))
    print(f"wrote {out / args.name}.json and .md; exit status {status}", flush=True)
    return status
