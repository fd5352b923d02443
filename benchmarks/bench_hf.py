"""Hugging Face models under bitparity.patch (spec 30) against the same model unpatched, on this machine: forward
and forward + backward time of a small and a Qwen3-0.6B-shaped config as median ms and ratios, then where a
patched forward spends its time, per replaced module kind.

    python benchmarks/bench_hf.py [--backend cpu] [--repeats 3] [--layers 2] [--tokens 128] [--vocab 151936]
"""

import argparse
import copy
import statistics
import time
from collections import defaultdict

import torch
from tabulate import tabulate
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

import bitparity as bp


def _configs(layers, vocab):
    """(name, model) pairs, built from configs (no download), weights from torch's seeded initialiser."""
    torch.manual_seed(0)
    small = Qwen3MoeConfig(vocab_size=4096, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                           num_experts=8, num_experts_per_tok=2, mlp_only_layers=[0], norm_topk_prob=False,
                           max_position_embeddings=512)
    # Qwen3-0.6B's shapes (hidden 1024, 16 query and 8 KV heads of 128, MLP 3072, its vocabulary), fewer layers.
    qwen3_06b = Qwen3Config(vocab_size=vocab, hidden_size=1024, intermediate_size=3072, num_hidden_layers=layers,
                            num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=2048,
                            tie_word_embeddings=True)
    return [("small Qwen3-MoE (D 64, GQA 4/2, dense layer 0, 8 experts top 2)", Qwen3MoeForCausalLM(small)),
            (f"Qwen3-0.6B shapes, {layers} layers, vocab {vocab}", Qwen3ForCausalLM(qwen3_06b))]


def _median_ms(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _forward(model, ids):
    def run():
        with torch.no_grad():
            model(ids)
    return run


def _forward_backward(model, ids):
    def run():
        model.zero_grad(set_to_none=True)
        model(ids, labels=ids).loss.backward()
    return run


def _breakdown(model, ids):
    """Seconds of one patched forward per bitparity op (the module-level names the patched modules call), and
    the rest (HF's glue, residual adds, the mask plan, data movement)."""
    spent = defaultdict(float)
    originals = {name: getattr(bp.ops, name) for name in OPS}

    def timed(name, op):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return op(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - start
        return run

    for name, op in originals.items():
        setattr(bp.ops, name, timed(name, op))
    try:
        start = time.perf_counter()
        _forward(model, ids)()
        total = time.perf_counter() - start
    finally:
        for name, op in originals.items():
            setattr(bp.ops, name, op)
    spent["other (HF glue, residual adds, mask plan, moves)"] = total - sum(spent.values())
    return total, spent


OPS = ("embedding", "rms_norm", "linear", "rotary", "attention", "silu_mul", "moe")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=151936)
    args = parser.parse_args()
    rows, breakdowns = [], []
    for name, model in _configs(args.layers, args.vocab):
        ids = torch.randint(0, model.config.vocab_size, (1, args.tokens))
        patched = bp.patch(copy.deepcopy(model), backend=args.backend)
        for what, make in (("forward", _forward), ("forward+backward", _forward_backward)):
            ours, theirs = _median_ms(make(patched, ids), args.repeats), _median_ms(make(model, ids), args.repeats)
            rows.append((name, what, f"{ours:.1f}", f"{theirs:.1f}", f"{ours / theirs:.1f}x"))
        total, spent = _breakdown(patched, ids)
        breakdowns += [(name, op, f"{1e3 * s:.1f}", f"{100 * s / total:.0f}%")
                       for op, s in sorted(spent.items(), key=lambda kv: -kv[1])]
    print(f"backend {args.backend}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{args.tokens} tokens, median of {args.repeats}")
    print(tabulate(rows, headers=("model", "pass", f"patched ({args.backend}) ms", "HF (torch) ms", "ratio"),
                   tablefmt="github"))
    print("\nwhere a patched forward spends its time")
    print(tabulate(breakdowns, headers=("model", "op", "ms", "share"), tablefmt="github"))


if __name__ == "__main__":
    main()
