"""The `bitparity` command: compare, verify, diff, probe, bench, backends, demo and rl-check.

Each subcommand has its own `_add_<name>_parser(sub)` and handler, so commands are added one
block at a time."""

import argparse
import json
import os
import sys
import time
from pathlib import Path

from tabulate import tabulate

from . import __version__
from .backends import NAMES, availability
from .compare import bench, cli_common, diff, golden, probe, report, schema
from .compare import plots as plotting    # draws nothing, and needs no matplotlib, until asked
from .compare.run import ALL_OPS, compare
from .models.hf_policy import MODELS           # rl-check --model's names; transformers is imported only when used
from .spec import SPEC_VERSION


def _emit(fmt, table, markdown, doc):
    print({"table": table, "markdown": markdown}[fmt] if fmt != "json" else json.dumps(doc, indent=1))


def _fail(command, message):
    """Exit status 2 (bad input) with `bitparity <command>: message` on stderr."""
    print(f"bitparity {command}: {message}", file=sys.stderr)
    return 2


def _unavailable(command, names):
    """_fail's status 2 for the first backend of names that cannot run here, with backends()'s reason; else None.
    Checked before anything runs, so every command refuses an unavailable backend the same way."""
    for name in names:
        available, reason = availability(name)
        if not available:
            return _fail(command, f"backend {name} is not available here: {reason}")
    return None


def _writable(path):
    """Why a file cannot be written at path, or None (checked before a long run, not after it)."""
    folder = Path(path).resolve().parent
    if not folder.is_dir():
        return f"{path}: no folder {folder}"
    return None if os.access(folder, os.W_OK) else f"{path}: folder {folder} is not writable"


def _makeable(path):
    """Why a folder cannot be made (or written) at path, or None: the plots' folder, made with its parents after
    a long run, is checked before it."""
    target = Path(path).resolve()
    if target.exists() and not target.is_dir():
        return f"{path}: not a folder"
    existing = next(p for p in (target, *target.parents) if p.exists())
    if not existing.is_dir():
        return f"{path}: {existing} is not a folder"
    return None if os.access(existing, os.W_OK) else f"{path}: folder {existing} is not writable"


# -- compare ------------------------------------------------------------------------

def _compare(args):
    if not 0 <= args.seed < 2**63:
        return _fail("compare", f"--seed must be in [0, 2**63) (the case generators' seed); got {args.seed}")
    if args.plots:
        try:
            plotting.pyplot()
        except ImportError as error:
            return _fail("compare", f"--plots: {error}")
        why = _makeable(args.plots)
        if why:
            return _fail("compare", f"--plots {why}")
    why = _writable(args.out)
    if why:
        return _fail("compare", f"--out {why}")
    for b in args.backend or ():
        available, reason = availability(b)
        if not available:
            print(f"bitparity compare: warning: skipping --backend {b}: {reason}", file=sys.stderr)
    start = time.perf_counter()
    run = compare(backends=args.backend, ops_=args.op or ALL_OPS, tier=cli_common.tier(args), seed=args.seed)
    doc = report.document(run, command="bitparity " + " ".join(args.argv))
    with open(args.out, "w") as f:
        f.write(report.to_json(doc) + "\n")
    plots = {}
    if args.plots:
        plots = plotting.write(doc, args.plots)
    if args.format == "json":
        print(report.to_json(doc))
    elif args.format == "markdown":
        print(report.markdown(doc, {kind: str(path) for kind, path in plots.items()}))
    else:
        print(f"{report.header(doc)}\n\n{report.backends_table(doc['backend_info'])}\n\n{report.table(doc)}")
    print(f"wrote {args.out}" + (f" and plots in {args.plots}" if plots else "") +
          f" in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0


def _add_compare_parser(sub):
    p = sub.add_parser("compare", help="run the suite on every available backend: agreement, accuracy and cost")
    p.add_argument("--backend", action="append", choices=NAMES,
                   help="backends to run (repeatable; default: all available); one not available here is skipped "
                        "with a warning on stderr")
    p.add_argument("--op", action="append", choices=ALL_OPS,
                   help="ops to run, forward or gradient (<op>.backward, AdamW.step, ...) (repeatable; default: all)")
    tiers = cli_common.add_tier_args(p)
    tiers.add_argument("--suite", dest="tier", choices=cli_common.TIERS, help="the older spelling of --quick / --full")
    cli_common.add_format_args(p)
    p.add_argument("--seed", type=int, default=0, help="input seed (the golden digests are for seed 0)")
    p.add_argument("--out", "--json", dest="out", default="bitparity-report.json",
                   help="where to write the run document (docs/report-schema.md); default bitparity-report.json")
    p.add_argument("--plots", metavar="DIR", help="also draw the agreement, ulp and cost plots (PNG) into DIR")
    p.set_defaults(func=_compare)


# -- verify -------------------------------------------------------------------------

def _verify(args):
    refused = _unavailable("verify", [args.backend])
    if refused:
        return refused
    path = args.golden or golden.default_path()
    try:
        doc = golden.load(path)
        rows = golden.verify(args.backend, cli_common.tier(args), doc)
    except (OSError, ValueError) as err:      # no file, or one of another spec or suite
        return _fail("verify", err)
    except (KeyError, TypeError) as err:      # JSON, but not a golden document
        return _fail("verify", f"{path} is not a golden digest file (docs/report-schema.md): "
                               f"{type(err).__name__} {err}")
    matched = sum(r["match"] for r in rows)
    summary = (f"{args.backend}: {matched}/{len(rows)} {cli_common.tier(args)} digests (forward cases and gradient "
               f"tensors) match the golden digests of spec {doc['spec_version']} ({path}); "
               f"{len(rows) - matched} mismatch")
    cells = [(r["name"], r["tensor"] or "",
              "match" if r["match"] else f"ERROR {r['error']}" if r["error"] else "MISMATCH",
              "" if r["match"] else "-" if r["max_ulp"] is None else f"{r['max_ulp']:.3g}",
              "" if r["first_diff"] is None else r["first_diff"]) for r in rows]
    table = tabulate(cells, headers=("case", "tensor", "result", "max ulp vs local canonical",
                                     "first differing index"), tablefmt="github")
    local_agrees = [r["name"] for r in rows if not r["match"] and not r["error"] and r["first_diff"] is None]
    note = (f"\n{len(local_agrees)} mismatching case(s) equal this machine's canonical result bit for bit: "
            f"the golden file, not {args.backend}, differs from the code here") if local_agrees else ""
    _emit(args.format, f"{table}\n\n{summary}{note}", f"# bitparity verify\n\n{table}\n\n{summary}{note}",
          {"backend": args.backend, "tier": cli_common.tier(args), "spec_version": SPEC_VERSION,
           "golden": str(path), "matched": matched, "cases": rows})
    return 0 if matched == len(rows) else 1


def _add_verify_parser(sub):
    p = sub.add_parser("verify", help="run the suite on one backend and check every case against the golden digests")
    p.add_argument("--backend", required=True, choices=NAMES)
    cli_common.add_tier_args(p)
    cli_common.add_format_args(p)
    p.add_argument("--golden", help="golden digest file of the published spec release (default: the one bitparity "
                                    "ships, bitparity/golden/spec-v<SPEC_VERSION>.json)")
    p.set_defaults(func=_verify)


# -- diff ---------------------------------------------------------------------------

def _diff(args):
    docs = []
    for path in (args.a, args.b):
        try:
            with open(path) as f:
                docs.append(schema.validate(json.load(f)))
        except (OSError, ValueError) as err:         # json.JSONDecodeError is a ValueError
            return _fail("diff", f"{path}: {err}")
    a, b = docs
    why = diff.incomparable(a, b)
    if why:
        return _fail("diff", f"{why}: their digests are not comparable")
    result = diff.diff(a, b)
    head = "\n".join(f"{tag}: {path}  ({report.where(d)}; backends {', '.join(d['backends'])})"
                     for tag, path, d in (("a", args.a, a), ("b", args.b, b)))
    summary = (f"{result['cases']} common cases ({result['only_a']} only in a, {result['only_b']} only in b): "
               + ("canonical digests DIFFER" if diff.failed(result) else "every canonical digest agrees"))
    body = f"{head}\n\n{diff.table(result)}\n\n{summary}"
    _emit(args.format, body, f"# bitparity diff\n\n{body}", result)
    return 1 if diff.failed(result) else 0


def _add_diff_parser(sub):
    p = sub.add_parser("diff", help="compare two `compare --out` run documents case by case")
    p.add_argument("a", help="a run document (e.g. from a CUDA machine)")
    p.add_argument("b", help="another run document (e.g. from an Ascend machine)")
    cli_common.add_format_args(p)
    p.set_defaults(func=_diff)


# -- backends -----------------------------------------------------------------------

def _backends(_args):
    print(report.backends_table())
    return 0


def _add_backends_parser(sub):
    sub.add_parser("backends", help="list the backends and whether they can run here").set_defaults(func=_backends)


# -- demo ---------------------------------------------------------------------------

def _demo(args):
    from .demo import TOPICS, plots

    if args.plots is not None:
        try:
            plots.pyplot()
        except ImportError as error:
            return _fail("demo", f"--plots: {error}")
    for option, why in (("--plots", args.plots is not None and _makeable(args.plots)),
                        ("--json", args.json and _writable(args.json))):
        if why:
            return _fail("demo", f"{option} {why}")
    topics = list(TOPICS) if args.topic == "all" else [args.topic]
    results = {}
    for topic in topics:
        results[topic] = TOPICS[topic](args.plots)
        print()
    if args.json is not None:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {args.json}")
    return 0


def _add_demo_parser(sub):
    from .demo import TOPICS

    dm = sub.add_parser("demo", help="runnable lessons: why float32 results differ, and bitparity's answer "
                                     "(docs/learn/)")
    dm.add_argument("topic", nargs="?", choices=(*TOPICS, "all"), default="all",
                    help="order, batch, fma, exp, rl, or all (default)")
    dm.add_argument("--plots", metavar="DIR", help="save each topic's figure as DIR/TOPIC.png (needs matplotlib)")
    dm.add_argument("--json", metavar="FILE", help="write each topic's key numbers to FILE")
    dm.set_defaults(func=_demo)


# -- probe and bench ------------------------------------------------------------------

def _print_or_write(text, out):
    """Print a report, or write it to out and say so."""
    if out is None:
        print(text)
        return
    with open(out, "w") as f:
        f.write(text + "\n")
    print(f"wrote {out}")


def _probe(args):
    # probe's cpu target is numpy and torch on the host CPU, not the compiled `cpu` backend: it needs no build.
    refused = args.backend != "cpu" and _unavailable("probe", [args.backend])
    if refused:
        return refused
    why = args.out and _writable(args.out)
    if why:
        return _fail("probe", f"--out {why}")
    _print_or_write(probe.render(probe.probe(args.backend), args.format, args.backend), args.out)
    return 0


def _add_probe_parser(sub):
    p = sub.add_parser("probe", help="test on a target the floating-point assumptions the spec rests on")
    p.add_argument("--backend", choices=probe.PROBE_BACKENDS, default="cpu",
                   help="cpu: numpy and torch; cuda: Triton (interpreter without a GPU) and torch CUDA; "
                        "ascend: host emulation or torch_npu (default: cpu)")
    cli_common.add_format_args(p)
    p.add_argument("--out", help="write the report to this file instead of stdout")
    p.set_defaults(func=_probe)


def _bench(args):
    refused = _unavailable("bench", args.backend or ())
    if refused:
        return refused
    why = args.out and _writable(args.out)
    if why:
        return _fail("bench", f"--out {why}")
    backends = args.backend or [b for b in bench.BENCH_BACKENDS if availability(b)[0]]
    try:
        bench.check(backends, args.op or list(ALL_OPS), cli_common.tier(args), args.repeats, args.warmup)
    except ValueError as err:
        return _fail("bench", err)
    rows = bench.run(args.backend, args.op or list(ALL_OPS), tier=cli_common.tier(args), repeats=args.repeats,
                     warmup=args.warmup, progress=not args.no_progress)
    _print_or_write(bench.render(rows, args.format), args.out)
    return 0


def _add_bench_parser(sub):
    p = sub.add_parser("bench", help="time each op against torch's native op and the copy bandwidth")
    p.add_argument("--backend", action="append", choices=bench.BENCH_BACKENDS,
                   help="backends to time (repeatable; default: all available)")
    p.add_argument("--op", action="append", choices=ALL_OPS,
                   help="ops to time, forward or gradient (<op>.backward, AdamW.step, ...) (repeatable; default: all)")
    cli_common.add_tier_args(p)
    cli_common.add_format_args(p)
    p.add_argument("--repeats", type=int, help="timed runs per measurement (default: by tier)")
    p.add_argument("--warmup", type=int, help="untimed runs first (default: by tier)")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    p.add_argument("--out", help="write the report to this file instead of stdout")
    p.set_defaults(func=_bench)


# -- rl-check -------------------------------------------------------------------------

def _agreement_rows(doc):
    return [(name, f"{doc[key]['max_abs_diff']:.3g}", f"{doc[key]['bitwise_equal']}/{doc[key]['tokens']}",
             f"{doc[key]['percent']:.1f}") for name, key in (("log-prob", "logprob"), ("value", "value"))]


def _rl_table(doc, label):
    table = tabulate(_agreement_rows(doc), headers=(f"{label}: rollout vs trainer", "max abs diff", "bitwise equal",
                                                    "%"), tablefmt="github")
    return (f"{table}\nloss {doc['loss']!r}, clip fraction {doc['clip_fraction']!r}; PPO ratio exactly 1 on every "
            f"token: {'yes' if doc['ratio_exactly_one'] else 'NO'}")


def _rl_report(doc, label):
    return f"{_rl_table(doc, label)}\ndigest (sha256): {doc['digest']}"


def _rl_check(args):
    from .rl import check

    if not 0 <= args.seed < 2**31:
        return _fail("rl-check", f"--seed must be in [0, 2**31); got {args.seed}")
    refused = _unavailable("rl-check", [args.backend])
    if refused:
        return refused
    why = args.json and _writable(args.json)
    if why:
        return _fail("rl-check", f"--json {why}")
    if args.steps < 1 or args.micro_batch < 1 or args.micro_batch & (args.micro_batch - 1):
        return _fail("rl-check", f"--steps must be >= 1 and --micro-batch a power of two; got {args.steps}, "
                                 f"{args.micro_batch}")
    if args.world_size not in (1, 2, 4, 8):
        return _fail("rl-check", f"--world-size must be 1, 2, 4 or 8 (a power of two: spec 28.1's blocks); got "
                                 f"{args.world_size}")
    for option, size in (("--tp", args.tp), ("--ep", args.ep)):
        if size not in (1, 2, 4, 8):
            return _fail("rl-check", f"{option} must be 1, 2, 4 or 8; got {size}")
    if (args.tp > 1 or args.ep > 1) and args.model is None and args.config is None:
        return _fail("rl-check", "--tp and --ep shard a Hugging Face model (spec 31.5): give --model or --config")
    spread = args.world_size > 1 or args.tp > 1 or args.ep > 1
    if args.rollout_correction is not None and (args.steps > 1 or spread):
        return _fail("rl-check", "--rollout-correction reports one step: use it without --steps, --world-size, --tp "
                                 "and --ep")
    if spread and (args.native or args.backend == "native"):
        return _fail("rl-check", "--native and --backend native compare one process's weights: use them without "
                                 "--world-size, --tp and --ep")
    why = args.rollout == "vllm" and _vllm_rollout_refusal(args)
    if why:
        return _fail("rl-check", why)
    args.hf_model = None
    if args.model is not None or args.config is not None:
        args.hf_model, why = _hf_model(args)
        if why:
            return _fail("rl-check", why)
    if args.steps > 1 or spread:
        return _rl_train(args)
    doc, _ = check.check(args.backend, args.seed, native=args.native, correction=args.rollout_correction,
                         model=args.hf_model, engine=_rollout_engine(args.rollout))
    doc["rollout_engine"] = args.rollout
    doc["spec_version"] = SPEC_VERSION
    c = doc["config"]
    if args.hf_model is None:
        about = (f"TinyMoEPolicy: vocab {c['vocab']}, hidden {c['hidden']}, {c['layers']} layers, {c['heads']} heads "
                 f"x {c['head_dim']}, {c['experts']} experts top-{c['top_k']}")
    else:
        about = _hf_about(args.hf_model)
    if args.rollout == "vllm":
        import vllm
        engine = (f"rollout: {doc['requests']} requests generated by vLLM {vllm.__version__} with the bitparity "
                  f"plugin, at most {doc['max_batch']} running")
    else:
        engine = (f"rollout: {doc['requests']} requests over {doc['steps']} steps, max batch {doc['max_batch']}, "
                  f"decode batch sizes {doc['decode_batch_sizes']}")
    print(f"bitparity rl-check: spec {SPEC_VERSION}, backend {args.backend}, seed {args.seed}\n"
          f"{about}\n"
          f"{engine}; trainer: reversed order, {doc['trainer_layout']['pad_extra']} extra "
          f"padding columns, micro-batches of {doc['trainer_layout']['micro_batch']}\n")
    print(_rl_report(doc, args.backend))
    if doc["published_digest"] is not None:
        print(f"spec §25.6's digest for seed {args.seed}: {'matches' if doc['matches_published'] else 'DIFFERS'}")
    if args.rollout_correction is not None:
        runs = [(args.backend, doc)] + ([("native", doc["native"])] if args.native else [])
        print("\nmismatch metrics (spec 27.2), rollout correction " +
              ", ".join(f"{k}={v}" for k, v in args.rollout_correction.items()) + ":\n" +
              tabulate([(name, *(f"{v:.6g}" for v in d["mismatch"].values())) for name, d in runs],
                       headers=("backend", *doc["mismatch"]), tablefmt="github"))
    if args.native:
        print("\n" + _rl_report(doc["native"], "native"))
        cells = [(r["max_batch"], r["micro_batch"], f"{r['max_abs_logp_diff']:.3g}", f"{r['logp_equal_percent']:.1f}",
                  f"{r['max_abs_value_diff']:.3g}", f"{r['value_equal_percent']:.1f}") for r in doc["native"]["sweep"]]
        print("\nnative, by rollout batch cap and trainer micro-batch (each row its own rollout and trainer step):\n" +
              tabulate(cells, headers=("max batch", "micro-batch", "max |dlogp|", "logp bitwise %", "max |dvalue|",
                                       "value bitwise %"), tablefmt="github"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.json}")
    canonical_ok = doc["consistent"] and doc["matches_published"] is not False
    return 1 if args.backend != "native" and not canonical_ok else 0


def _vllm_rollout_refusal(args):
    """Why `--rollout vllm` cannot run with these arguments (None: it can)."""
    if args.model is None and args.config is None:
        return "--rollout vllm runs a Hugging Face architecture in vLLM: give --model or --config"
    if args.steps > 1 or args.world_size > 1 or args.tp > 1 or args.ep > 1 or args.native:
        return ("--rollout vllm checks one step on one process: use it without --steps, --world-size, --tp, --ep and "
                "--native")
    if args.backend == "native":
        return ("--rollout vllm compares vLLM's canonical rollout with a canonical trainer: --backend native is not "
                "one")
    try:
        import vllm  # noqa: F401
    except ImportError as error:
        return f"--rollout vllm needs vLLM with bitparity's plugin (pip install 'bitparity[vllm]'): {error}"
    return None


def _rollout_engine(name):
    """The RL step's rollout function for --rollout NAME."""
    if name == "vllm":
        from .vllm.rollout import rollout
    else:
        from .rl.rollout import rollout
    return rollout


def _rl_train(args):
    """rl-check --steps N (N >= 2): N rollout-and-update iterations (spec 29.13), then the weights digest."""
    from .rl import check

    try:
        doc = check.train_check(args.backend, args.seed, args.steps, args.micro_batch, native=args.native,
                                world_size=args.world_size, config=args.hf_model, tp=args.tp, ep=args.ep)
    except RuntimeError as error:                # a rank failed or timed out: its message, no traceback
        print(f"bitparity rl-check: {error}", file=sys.stderr)
        return 1
    doc["spec_version"] = SPEC_VERSION
    u = doc["update"]
    ranks = f", data-parallel on {args.world_size} gloo ranks (127.0.0.1)" if args.world_size > 1 else ""
    if args.tp > 1 or args.ep > 1:
        ranks = (f", {args.world_size * args.tp * args.ep} gloo ranks (127.0.0.1): data-parallel {args.world_size} x "
                 f"tensor-parallel {args.tp} x expert-parallel {args.ep} (spec 31.5)")
    print(f"bitparity rl-check: spec {SPEC_VERSION}, backend {args.backend}, seed {args.seed}, {args.steps} steps"
          f"{ranks}\n" + ("" if args.hf_model is None else _hf_about(args.hf_model) + "\n") +
          f"update: AdamW lr {u['lr']}, betas {tuple(u['betas'])}, eps {u['eps']}, weight decay {u['weight_decay']}; "
          f"clip {u['max_grad_norm']}; micro-batches of {u['micro_batch']} sequences (spec 29.13)")
    for row in doc["per_step"]:
        print(f"\nstep {row['step']}: {row['requests']} requests\n" + _rl_table(row, args.backend)
              + f"\ngradient norm {row['grad_norm']!r} (clipped to {u['max_grad_norm']}); weights after the update "
              f"(sha256): {row['weights_digest']}")
    print(f"\nweights digest (sha256): {doc['weights_digest']}")
    if doc["published_weights_digest"] is not None:
        print(f"spec 29.13's weights digest for seed {args.seed}, {args.steps} steps: "
              f"{'matches' if doc['matches_published'] else 'DIFFERS'}")
    if args.native:
        native = doc["native"]
        print(f"\nnative (torch's ops, AdamW, clip and accumulation): weights digest {native['weights_digest']}; "
              f"max |weight - canonical weight| after {args.steps} steps: {native['max_abs_weight_drift']:.3g}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.json}")
    return 1 if args.backend != "native" and not (doc["consistent"] and doc["matches_published"] is not False) else 0


def _add_rl_check_parser(sub):
    p = sub.add_parser("rl-check", help="one RL step on TinyMoEPolicy (or, with --model/--config, a patched HF "
                                        "model): rollout vs trainer log-probs and values, bit for bit")
    p.add_argument("--backend", choices=NAMES, default="cpu", help="backend for the model and the RL ops "
                   "(default: cpu); exit status 1 if a canonical backend shows any mismatch between rollout and "
                   "trainer, or a digest other than spec §25.6's")
    p.add_argument("--native", action="store_true", help="also run the identical model on torch's own ops and "
                   "tabulate its mismatch by rollout batch cap and trainer micro-batch")
    p.add_argument("--seed", type=int, default=0, help="model, prompt and sampling seed (default 0)")
    p.add_argument("--steps", type=int, default=1, help="RL iterations: rollout, trainer step, then (from 2 on) a "
                   "PPO update through spec 29's backward and AdamW before the next rollout; prints each step and the "
                   "weights digest (default 1: one step, no update)")
    p.add_argument("--world-size", type=int, default=1, help="run the updates data-parallel on this many gloo "
                   "processes on 127.0.0.1 (1, 2, 4 or 8; spec 28.1): the same weights digest as one process")
    p.add_argument("--tp", type=int, default=1, help="shard the HF model (--model/--config) tensor-parallel over this "
                   "many gloo processes (1, 2, 4 or 8; spec 31.5: heads, MLP columns, vocabulary): the same log-probs "
                   "and weights digest as one process; composes with --world-size and --ep")
    p.add_argument("--ep", type=int, default=1, help="place a Qwen3-MoE model's experts over this many gloo "
                   "processes (1, 2, 4 or 8; spec 31.5): the same log-probs and weights digest as one process")
    p.add_argument("--micro-batch", type=int, default=4, help="sequences per micro-batch of the update, a power of "
                   "two (default 4); the weights do not depend on it")
    p.add_argument("--model", choices=MODELS, help="run the step on an unmodified Hugging Face model patched onto "
                   "bitparity ops (bitparity.patch) instead of TinyMoEPolicy: tiny (TinyMoEPolicy's architecture and "
                   "weights as a Qwen3MoeForCausalLM: spec §25.6's digest), qwen3_moe (GQA, a dense first layer, "
                   "norm_topk_prob off), qwen3 (dense, GQA) or llama (MQA); small built-in configs, weights from the "
                   "seed (bitparity.models.hf_policy); needs transformers")
    p.add_argument("--config", metavar="FILE", help="an HF config.json (model_type qwen3_moe, qwen3 or llama) to "
                   "build the HF model from instead of a built-in config; nothing is downloaded; its vocab_size must "
                   "hold the requests' token ids (< 4096)")
    p.add_argument("--json", metavar="FILE", help="write the report to FILE as JSON")
    p.add_argument("--rollout", choices=("bitparity", "vllm"), default="bitparity",
                   help="the rollout engine: bitparity's own continuous batching (default), or vLLM with bitparity's "
                        "plugin (bitparity.vllm; needs vLLM, --model or --config, one step): the trainer is the "
                        "patched HF model either way, and the digest is the same")
    p.add_argument("--rollout-correction", metavar="LEVEL,MODE,THRESHOLD[,LOW]", type=_correction,
                   help="also report the mismatch metrics and the fraction of tokens this rollout correction "
                        "(bitparity.rollout_correction) would drop, e.g. token,mask,2,0.5 (IcePop)")
    p.set_defaults(func=_rl_check)


def _hf_model(args):
    """(HFModel, None) for --model/--config, or (None, why not): an unreadable or unsupported config, a
    vocabulary or position count that does not hold the requests, a model bitparity.patch refuses."""
    try:
        from .models import hf_policy
        from .rl.rollout import default_requests
        if args.config is not None:
            model = hf_policy.from_file(args.config)
            if args.model is not None and args.model != model.model_type:
                return None, (f"--model {args.model} does not match --config's model_type {model.model_type} "
                              f"(give --config alone)")
        else:
            model = hf_policy.builtin(args.model)
        training = args.steps > 1 or args.world_size > 1 or args.tp > 1 or args.ep > 1
        hf_policy.check_fits(model, [default_requests(args.seed + s, vocab=model.vocab) for s in range(args.steps)],
                             training)
        hf_policy.check_patchable(model, args.backend)
        from .parallel.hf import check_shardable
        check_shardable(model.hf_config(), args.tp, args.ep)
    except ImportError as error:
        return None, f"--model and --config need transformers (pip install transformers): {error}"
    except (ValueError, TypeError) as error:
        return None, str(error).replace("\n", " ")
    return model, None


def _hf_about(model):
    from .models import hf_policy
    name = f"--config {model.source}" if model.source else f"model {model.name}"
    return f"{name}: {hf_policy.summary_line(model)}"


def _correction(text):
    """LEVEL,MODE,THRESHOLD[,LOW] -> rollout_correction's keyword arguments, checked here with the op's own rules
    (spec 27: THRESHOLD and LOW round to normal float32 values, LOW <= THRESHOLD after rounding), so a bad value
    is refused while the arguments are parsed, before the RL step runs."""
    parts = text.split(",")
    if len(parts) not in (3, 4):
        raise argparse.ArgumentTypeError(f"expected LEVEL,MODE,THRESHOLD[,LOW]; got {text!r}")
    from .ops import ROLLOUT_LEVELS, ROLLOUT_MODES
    if parts[0] not in ROLLOUT_LEVELS or parts[1] not in ROLLOUT_MODES:
        raise argparse.ArgumentTypeError(f"LEVEL must be one of {', '.join(ROLLOUT_LEVELS)} and MODE one of "
                                         f"{', '.join(ROLLOUT_MODES)}; got {text!r}")
    try:
        bounds = [float(p) for p in parts[2:]]
    except ValueError:
        raise argparse.ArgumentTypeError(f"THRESHOLD and LOW must be numbers; got {text!r}") from None
    from .ops import _f32, _normal_float32
    try:
        for name, bound in zip(("THRESHOLD", "LOW"), bounds):
            _normal_float32(name, bound)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{error} (in {text!r})") from None
    if len(bounds) == 2 and _f32(bounds[1]) > _f32(bounds[0]):
        raise argparse.ArgumentTypeError(f"LOW must be <= THRESHOLD after rounding to float32; got {text!r}")
    return {"level": parts[0], "mode": parts[1], "threshold": bounds[0],
            **({"threshold_low": bounds[1]} if len(bounds) == 2 else {})}


class _SubcommandParser(argparse.ArgumentParser):
    """A subcommand's parser that reports an argument it does not know itself, with its own usage.

    argparse's subparsers action parses a subcommand's arguments with parse_known_args and hands what
    it does not know up to the top-level parser, whose error then shows `bitparity`'s usage instead of
    the subcommand's."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


DESCRIPTION = ("Check that bitparity's operators give the same float32 bits on every backend here, and against the "
               "golden digests of the spec (docs/spec.md).")


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="bitparity", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"bitparity {__version__} (spec {SPEC_VERSION})")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_SubcommandParser)
    for add in (_add_compare_parser, _add_verify_parser, _add_diff_parser, _add_probe_parser, _add_bench_parser,
                _add_backends_parser, _add_demo_parser, _add_rl_check_parser):
        add(sub)
    args = parser.parse_args(argv)
    args.argv = argv
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
