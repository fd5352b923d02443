"""beam_search against HF transformers' own beam search on a deterministic table "model" (spec 23.1),
its bits across backends, and its validation."""

import pytest
import torch
import transformers
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

import bitparity as bp
from bitparity.compare.metrics import canonical_bits

from .conftest import implementing

VOCAB, EOS, STEPS = 16, 0, 9
transformers.logging.set_verbosity_error()


def _table(seed, eos_boost):
    """logits[position, last token] -> [V]: a fixed random next-token table; eos_boost makes EOS likelier."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(32, VOCAB, VOCAB, generator=g) * 2
    table[:, :, EOS] += eos_boost
    return table


def _step_fn(table):
    def step(sequences):
        return table[sequences.shape[1] - 1][sequences[:, -1]]
    return step


class TableConfig(PretrainedConfig):
    model_type = "bitparity-table"

    def __init__(self, vocab_size=VOCAB, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size


class TableModel(PreTrainedModel, GenerationMixin):
    """The same table as a causal LM: the logits at position i depend on (i, token i) only."""
    config_class = TableConfig

    def __init__(self, table):
        super().__init__(TableConfig())
        self.table = table
        self.unused = torch.nn.Parameter(torch.zeros(1))            # PreTrainedModel wants a parameter

    def forward(self, input_ids, **kwargs):
        positions = torch.arange(input_ids.shape[1])
        return CausalLMOutput(logits=self.table[positions[None, :], input_ids])

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        return {"input_ids": input_ids}


def _hf(table, prompts, num_beams, length_penalty, early_stopping):
    out = TableModel(table).generate(
        prompts, num_beams=num_beams, num_return_sequences=num_beams, max_new_tokens=STEPS, eos_token_id=EOS,
        pad_token_id=EOS, do_sample=False, use_cache=False, length_penalty=length_penalty,
        early_stopping=early_stopping, return_dict_in_generate=True, output_scores=True)
    batch = prompts.shape[0]
    return out.sequences.reshape(batch, num_beams, -1), out.sequences_scores.reshape(batch, num_beams)


PROMPTS = torch.tensor([[1, 2], [3, 4], [5, 6], [7, 8]])


@pytest.mark.parametrize("seed, eos_boost, num_beams, length_penalty, early_stopping", [
    (0, 0.0, 3, 1.0, False), (1, 1.0, 3, 1.0, False), (2, 1.0, 4, 2.0, False), (3, 1.0, 3, 0.5, True),
    (4, 0.5, 2, -1.0, "never"), (5, 1.0, 3, 1.5, "never"), (6, 1.0, 4, 0.0, True),
])
def test_agrees_with_hf_transformers(seed, eos_boost, num_beams, length_penalty, early_stopping):
    table = _table(seed, eos_boost)
    want_seq, want_scores = _hf(table, PROMPTS, num_beams, length_penalty, early_stopping)
    got = bp.beam_search(_step_fn(table), PROMPTS, num_beams=num_beams, max_new_tokens=STEPS, eos_token_id=EOS,
                         length_penalty=length_penalty, early_stopping=early_stopping, backend="numpy")
    assert torch.equal(got.sequences, want_seq)
    # HF's log_softmax and its division by length**penalty round differently from the canonical ones.
    torch.testing.assert_close(got.scores, want_scores, rtol=1e-5, atol=1e-6)
    assert (got.sequences.gather(2, got.lengths[:, :, None] - 1) == EOS).any()     # the EOS rules were exercised


def test_lengths_count_the_prompt_and_eos():
    table = _table(1, 1.0)
    got = bp.beam_search(_step_fn(table), PROMPTS, num_beams=3, max_new_tokens=STEPS, eos_token_id=EOS, backend="numpy")
    for b in range(PROMPTS.shape[0]):
        for i in range(3):
            seq = got.sequences[b, i, : got.lengths[b, i]].tolist()
            generated = seq[PROMPTS.shape[1]:]
            assert EOS not in generated[:-1] and (generated[-1] == EOS or len(generated) == STEPS)
            assert (got.sequences[b, i, got.lengths[b, i]:] == EOS).all()
    ended = got.sequences.gather(2, got.lengths[:, :, None] - 1) == EOS
    assert ended.any() and not ended.all()             # some hypotheses finished on EOS, others ran to the end
    assert (got.scores[:, :-1] >= got.scores[:, 1:]).all()                   # best first


@pytest.mark.parametrize("backend", implementing("topk")[1:])
def test_bits_across_backends(backend):
    table = _table(2, 1.0)
    kwargs = {"num_beams": 3, "max_new_tokens": STEPS, "eos_token_id": EOS, "length_penalty": 1.5}
    want = bp.beam_search(_step_fn(table), PROMPTS, backend="numpy", **kwargs)
    got = bp.beam_search(_step_fn(table), PROMPTS, backend=backend, **kwargs)
    assert torch.equal(got.sequences, want.sequences) and torch.equal(got.lengths, want.lengths)
    assert torch.equal(canonical_bits(got.scores), canonical_bits(want.scores))


def test_a_request_alone_equals_it_in_a_batch():
    step = _step_fn(_table(5, 1.5))
    kwargs = {"num_beams": 3, "max_new_tokens": STEPS, "eos_token_id": EOS, "backend": "numpy"}
    batched = bp.beam_search(step, PROMPTS, **kwargs)
    alone = bp.beam_search(step, PROMPTS[2:3], **kwargs)
    width = alone.sequences.shape[2]
    assert torch.equal(alone.sequences[0], batched.sequences[2, :, :width])
    assert torch.equal(canonical_bits(alone.scores[0]), canonical_bits(batched.scores[2]))


@pytest.mark.parametrize("kwargs, error, match", [
    ({"num_beams": 0}, ValueError, r"num_beams must be in \[1, inf\]"),
    ({"num_beams": 9}, ValueError, "num_beams must be at most V / 2"),
    ({"max_new_tokens": 0}, ValueError, "max_new_tokens must be in"),
    ({"eos_token_id": -1}, ValueError, "eos_token_id must be an integer >= 0"),
    ({"eos_token_id": VOCAB}, ValueError, "eos_token_id below V"),
    ({"early_stopping": "sometimes"}, ValueError, "early_stopping must be True, False or 'never'"),
    ({"early_stopping": 1}, ValueError, "early_stopping must be True, False or 'never'"),
    ({"length_penalty": float("nan")}, ValueError, "length_penalty must be finite"),
    ({"input_ids": PROMPTS.int()}, TypeError, "input_ids must have dtype torch.int64"),
    ({"input_ids": PROMPTS[0]}, ValueError, r"input_ids must have shape \[B, P\]"),
    ({"input_ids": PROMPTS.tolist()}, TypeError, "input_ids must be a torch.Tensor"),
    ({"step_fn": lambda s: torch.zeros(s.shape[0] + 1, VOCAB)}, ValueError, "step_fn must return logits of shape"),
    ({"step_fn": 3}, TypeError, r"^step_fn must be callable .*got int"),
    ({"input_ids": PROMPTS - 2}, ValueError, "^input_ids must be token ids >= 0; got -1"),
    # V is known once step_fn has answered, so this step_fn reads no id.
    ({"input_ids": PROMPTS + VOCAB - 8, "step_fn": lambda s: torch.zeros(s.shape[0], VOCAB)}, ValueError,
     rf"^input_ids must lie in \[0, V\) = \[0, {VOCAB}\) \(V from step_fn's logits\); got {VOCAB}"),
])
def test_rejects_bad_input(kwargs, error, match):
    args = {"step_fn": _step_fn(_table(0, 0.0)), "input_ids": PROMPTS, "num_beams": 2, "max_new_tokens": 3,
            "eos_token_id": EOS, "backend": "numpy", **kwargs}
    with pytest.raises(error, match=match):
        bp.beam_search(args.pop("step_fn"), args.pop("input_ids"), **args)
