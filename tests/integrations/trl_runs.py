"""What the TRL tests share: a tiny Qwen3 checkpoint saved with a word-level tokenizer built in code (TRL builds
its reference model and its vLLM engine from the path), an in-memory prompt dataset, a GRPOConfig for a few
CPU steps, and spies that record what TRL's loss compares.

Every run: 4 prompts, 2 generations each, 2 per device batch, steps_per_generation=2, gradient accumulation 1,
4 steps: TRL generates at steps 0 and 2 and keeps old log-probs (its generation is not aligned with the
optimizer step), and at steps 0 and 2 the loss runs on the weights that computed them.
"""

import hashlib

import torch

WORDS = [f"w{i}" for i in range(60)]
SPECIAL = ["[PAD]", "[EOS]", "[UNK]"]
PROMPTS = ["w1 w2 w3", "w4 w5", "w6 w7 w8 w9 w10", "w11"]
TEMPERATURE = 0.7
LOW_WORDS = set(WORDS[:30])


def save_checkpoint(path, seed=0):
    """A 2-layer Qwen3 (hidden 64, 4 query / 2 key-value heads of 32, vocabulary 63; stock vLLM's CPU attention
    takes no head_dim below 32) and its WordLevel tokenizer."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(SPECIAL + WORDS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", eos_token="[EOS]",
                                                     unk_token="[UNK]", padding_side="left")
    config = transformers.Qwen3Config(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=128,
                                      max_position_embeddings=128, tie_word_embeddings=False, initializer_range=0.2,
                                      pad_token_id=vocab["[PAD]"], eos_token_id=vocab["[EOS]"],
                                      bos_token_id=None, use_sliding_window=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.Qwen3ForCausalLM(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def dataset():
    from datasets import Dataset
    return Dataset.from_dict({"prompt": PROMPTS})


def reward_low_words(completions, **kwargs):
    """The number of words w0..w29: varies within a group, so advantages are not all zero and the weights move."""
    return [float(sum(word in LOW_WORDS for word in c.split())) for c in completions]


def config(output_dir, **settings):
    from trl import GRPOConfig
    options = dict(output_dir=str(output_dir), use_cpu=True, bf16=False, per_device_train_batch_size=2,
                   num_generations=2, steps_per_generation=2, gradient_accumulation_steps=1, max_steps=4,
                   max_completion_length=6, temperature=TEMPERATURE, learning_rate=0.05, logging_steps=1,
                   report_to=[], save_strategy="no", seed=0, beta=0.0, disable_tqdm=True)
    options.update(settings)
    return GRPOConfig(**options)


def bits(t):
    return t.detach().contiguous().view(torch.int32)


def spy_on_loss(trainer):
    """Record, at every loss call, TRL's global step, the loss pass's log-probs and what TRL compares them with
    (old and rollout log-probs, the IS ratio, the completion mask): trainer.records, a list of dicts."""
    trainer.records = []
    compute_logps, compute_loss = trainer._get_per_token_logps_and_entropies, trainer._compute_loss

    def logps(*args, **kwargs):
        out = compute_logps(*args, **kwargs)
        trainer._last_logps = out[0]
        return out

    def loss(model, inputs):
        out = compute_loss(model, inputs)
        trainer.records.append(dict(step=trainer.state.global_step, new=trainer._last_logps.detach(),
                                    mask=inputs["completion_mask"].bool(),
                                    **{key: inputs.get(key) for key in ("old_per_token_logps",
                                                                        "sampling_per_token_logps",
                                                                        "importance_sampling_ratio")}))
        return out

    trainer._get_per_token_logps_and_entropies, trainer._compute_loss = logps, loss


def weights_digest(model):
    digest = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(p.detach().float().contiguous().numpy().tobytes())
    return digest.hexdigest()


def logged(trainer, key):
    return [entry[key] for entry in trainer.state.log_history if key in entry]
