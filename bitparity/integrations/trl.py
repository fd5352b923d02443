"""TRL's GRPOTrainer on canonical bits (TRL 1.16; docs/integrations.md §3).

`GRPOTrainer` is TRL's trainer with three changes, all through TRL's own extension points:

- `_get_per_token_logps_and_entropies` (the one method TRL's old-log-prob, reference and loss passes all call)
  runs the patched model's forward to its logits and takes `bitparity.token_logprobs` and `bitparity.entropy`
  at the trainer's temperature. TRL 1.16's own version calls the model with `fused_lm_head=True`, whose chunked
  `torch.mm` and online logsumexp never reach the patched `lm_head`. Position ids count each row's tokens from
  0 (`cumsum(mask) - 1`, as `generate` and vLLM number them); TRL passes none, so a left-padded row would be
  numbered from its padding.
- The models TRL builds from a path inside `__init__` (the reference model when `beta > 0`) are patched like the
  policy, on the policy's backend, before TRL adds its fused head or wraps them: never HF's modules with
  bitparity's attention.
- Settings that would take a forward off the patched modules are refused before TRL builds anything; with
  vLLM, the colocate engine's dtype is checked against the policy's once TRL has built it.

Rollouts: `hf_rollout` is a `rollout_func` (TRL's experimental hook) that generates with the patched model and
`bitparity.hf.Sampler`; with `use_vllm=True` TRL's colocate mode runs vLLM with the bitparity plugin
(`BITPARITY_VLLM=1`), and TRL's importance-sampling correction compares vLLM's processed log-probs with this
trainer's. When a `rollout_func` gives log-probs and TRL does not compare them (no vLLM), the trainer logs
`bitparity/rollout_logp_difference/max`.
"""

import contextlib

import torch
import trl
from transformers import GenerationConfig
from trl.models import unwrap_model_for_generation
from trl.trainer import grpo_trainer

from .. import hf, ops

TRL_VERSION = "1.16"
if not trl.__version__.startswith(TRL_VERSION + "."):
    raise ImportError(f"bitparity.integrations.trl overrides TRL {TRL_VERSION}'s GRPOTrainer internals; "
                      f"TRL {trl.__version__} is installed")


def _check_policy(model):
    if not isinstance(model, torch.nn.Module) or not hasattr(model, hf._ORIGINALS):
        raise TypeError(f"model must be a model patched by bitparity.patch (load it with from_pretrained, then "
                        f"bitparity.patch(model)); got {type(model).__name__}")


def _check_args(args):
    """Settings of GRPOConfig that would take a forward off the patched modules, refused by name."""
    if not isinstance(args, trl.GRPOConfig):
        raise TypeError(f"args must be a trl.GRPOConfig (TRL's default one runs bf16 autocast); got "
                        f"{type(args).__name__}")
    refused = [
        ("bf16", args.bf16, "runs the forward under torch.autocast (GRPOConfig's default, with use_cpu=True too); "
                            "a patched op rounds once to the model's dtype (spec 30.1): set bf16=False and load a "
                            "bfloat16 model with dtype=torch.bfloat16"),
        ("fp16", args.fp16, "runs the forward under torch.autocast; set fp16=False"),
        ("cast_lm_head_to_fp32", args.cast_lm_head_to_fp32,
         "replaces lm_head's forward by F.linear, bypassing the patched head (generation too)"),
        ("use_liger_kernel", args.use_liger_kernel, "replaces the model's layers by Liger's kernels"),
        ("use_transformers_continuous_batching",
         args.use_transformers_continuous_batching or args.use_transformers_paged,
         "generates through transformers' paged attention, not the patched attention (and casts a bf16 run's "
         "model to bfloat16)"),
        ("model_init_kwargs['use_kernels']", (args.model_init_kwargs or {}).get("use_kernels", False),
         "replaces modules by Hub kernels"),
    ]
    for name, value, why in refused:
        if value:
            raise ValueError(f"args.{name}=True {why}")
    if args.use_vllm:
        if args.vllm_mode != "colocate":
            raise ValueError(f"args.vllm_mode={args.vllm_mode!r}: only 'colocate' is supported. Server mode's "
                             "weight sync is vLLM's NCCL weight-transfer engine (CUDA only), which loads through "
                             "vLLM's layerwise reload, not the plugin model's load_weights")
        if args.vllm_model_impl != "vllm":
            raise ValueError(f"args.vllm_model_impl={args.vllm_model_impl!r} asks vLLM for its Transformers "
                             "backend, not the bitparity plugin's model: leave it at 'vllm'")
        from ..vllm import plugin
        if not plugin.takes_over():
            raise ValueError(f"args.use_vllm=True needs {plugin.TAKEOVER_ENV}=1 in the environment before vLLM is "
                             "imported: TRL's colocate engine is LLM(model=path), and only then does the bitparity "
                             "plugin serve the checkpoint's architecture")


@contextlib.contextmanager
def _patch_created_models(backend):
    """While TRL's __init__ runs, every model it loads from a path is patched on `backend` as it is created."""
    create = grpo_trainer.create_model_from_path

    def create_patched(*args, **kwargs):
        return hf.patch(create(*args, **kwargs), backend=backend)

    grpo_trainer.create_model_from_path = create_patched
    try:
        yield
    finally:
        grpo_trainer.create_model_from_path = create


def _masked_max_difference(a, b, mask):
    """max |a - b| over mask (0.0 for an empty mask), a Python float."""
    difference = (a - b).abs()[mask.bool()]
    return float(difference.max()) if difference.numel() else 0.0


class GRPOTrainer(trl.GRPOTrainer):
    """trl.GRPOTrainer whose log-probs and entropies are bitparity's (module docstring). model: a patched
    instance; args: a GRPOConfig (required: TRL's default enables bf16 autocast). Other arguments are TRL's."""

    def __init__(self, model, reward_funcs, args, **kwargs):
        _check_policy(model)
        _check_args(args)
        with _patch_created_models(model.lm_head.backend):
            super().__init__(model, reward_funcs, args, **kwargs)
        if self.use_vllm:
            engine = self.vllm_generation.llm.llm_engine.model_config.dtype
            if engine != model.dtype:
                raise ValueError(f"model's dtype is {model.dtype} but TRL's colocate vLLM engine runs in {engine}: "
                                 "TRL builds it with dtype 'auto', which downcasts a float32 checkpoint to "
                                 "bfloat16. Load the policy with dtype=torch.bfloat16 (or save the checkpoint in "
                                 "the dtype the policy trains in)")

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **multimodal):
        """TRL's method: log-probs [B, logits_to_keep] of the last logits_to_keep tokens, entropies of the same
        positions (or None), no auxiliary loss; in chunks of batch_size rows, as TRL's."""
        given = sorted(name for name, value in multimodal.items() if value is not None)
        if given:
            raise ValueError(f"bitparity.integrations.trl runs text-only causal LMs; got {', '.join(given)}")
        if compute_aux_loss:
            raise ValueError("the MoE load-balancing loss needs output_router_logits=True, which a patched model "
                             "refuses: set args.model_init_kwargs['output_router_logits']=False")
        batch_size = batch_size or input_ids.size(0)
        logps, entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):
            ids, mask = input_ids[start:start + batch_size], attention_mask[start:start + batch_size]
            positions = (mask.long().cumsum(dim=-1) - 1).clamp(min=0)
            # logits_to_keep + 1 rows: the logits at position t score the token at t + 1
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                           logits_to_keep=logits_to_keep + 1).logits[:, :-1]
            logps.append(ops.token_logprobs(logits, ids[:, -logits_to_keep:], self.temperature))
            if compute_entropy:
                entropies.append(ops.entropy(logits, temperature=self.temperature))
        return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None

    def _generate_and_score_completions(self, inputs):
        """TRL's method; where a rollout_func's log-probs reach no TRL metric (no vLLM), logs their largest
        difference from the trainer's old log-probs, when TRL computes those."""
        output = super()._generate_and_score_completions(inputs)
        rollout, old = output.get("sampling_per_token_logps"), output.get("old_per_token_logps")
        if not self.use_vllm and rollout is not None and old is not None:
            mode = "train" if self.model.training else "eval"
            difference = _masked_max_difference(old, rollout, output["completion_mask"])
            self._metrics[mode]["bitparity/rollout_logp_difference/max"].append(difference)
        return output


def hf_rollout(prompts, trainer):
    """A TRL rollout_func: the patched policy's `generate` with bitparity.hf.Sampler at the trainer's
    temperature, one completion per prompt (TRL repeats each prompt num_generations times), up to
    max_completion_length tokens, each cut after its first EOS. Request i of the generation at global step s
    draws with seed args.seed * 2**32 + s * len(prompts) + i, so a run's tokens depend on its seed and step only.
    Returns TRL's keys: prompt_ids, completion_ids and logprobs (the temperature-scaled kind, spec 22.1, what
    the trainer recomputes)."""
    prompt_ids = trainer._tokenize_prompts(prompts)[0]
    pad = trainer.processing_class.pad_token_id
    width = max(len(ids) for ids in prompt_ids)
    device = trainer.accelerator.device
    input_ids = torch.tensor([[pad] * (width - len(ids)) + list(ids) for ids in prompt_ids], device=device)
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompt_ids], device=device)
    first = trainer.args.seed * 2**32 + trainer.state.global_step * len(prompts)
    seeds = torch.arange(first, first + len(prompts), dtype=torch.int64)
    sampler = hf.Sampler(seeds, mask, temperature=trainer.temperature, logprobs="scaled")
    config = GenerationConfig(do_sample=False, max_new_tokens=trainer.max_completion_length, pad_token_id=pad,
                              eos_token_id=trainer.eos_token_ids)
    # as TRL's own generation: gradient checkpointing off (with it, HF generates without a cache but feeds only
    # the newest token), DeepSpeed/FSDP parameters gathered
    with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                     gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
                                     gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs
                                     ) as model, torch.no_grad():
        model.generate(input_ids=input_ids, attention_mask=mask, generation_config=config,
                       logits_processor=[sampler])
    completion_ids, logprobs = [], []
    for tokens, logps in zip(sampler.tokens.tolist(), sampler.logprobs.tolist()):
        ends = [j for j, token in enumerate(tokens) if token in trainer.eos_token_ids]
        n = ends[0] + 1 if ends else len(tokens)
        completion_ids.append(tokens[:n])
        logprobs.append(logps[:n])
    return {"prompt_ids": [list(ids) for ids in prompt_ids], "completion_ids": completion_ids, "logprobs": logprobs}

