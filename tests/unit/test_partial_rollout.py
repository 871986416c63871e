"""verl.rollout.partial: new weights arrive mid-generation, every row stops, the unfinished ones go on
under the new weights (prefilled again, seeds continued), in both engines and in the multi-turn loop.

* a swap to the same weights changes nothing: the same tokens as one uninterrupted generation;
* after a real swap, the tokens before it are the old weights' and every log-prob the rollout reports
  is that of the weights that drew the token (recomputed by the actor under each), and each row
  says which version drew its last token.
"""

import copy

import pytest
import torch

from verl.models.logprob import compute_response_logprobs
from verl.rollout import HFRollout, SamplingParams
from verl.rollout.native import NativeRollout

from test_rollout_native import make_prompts, qwen2  # noqa: F401 - the fixture

BEFORE = 4  # tokens every row draws before the swap
PARAMS = SamplingParams(max_new_tokens=12, n=2, temperature=0.9, logprobs=True)
ENGINES = {"hf": HFRollout, "native": NativeRollout, "native-forward": lambda m, t: NativeRollout(m, t, fast=False)}


class ScriptedSwap:
    """New weights (``state``, version 1) become pending once every row has drawn ``after`` tokens.
    ``pending`` is asked once before generation and then after every decode step."""

    def __init__(self, model, state, after=BEFORE):
        self.model, self.state, self.after = model, state, after
        self.version, self.calls, self.applied = 0, 0, 0

    def pending(self) -> bool:
        self.calls += 1
        return self.version == 0 and self.calls > self.after

    def apply(self) -> None:
        self.model.load_state_dict(self.state)
        self.version, self.applied = 1, self.applied + 1


def perturbed(model, scale=0.05):
    torch.manual_seed(0)
    return {k: v + scale * torch.randn_like(v) if v.is_floating_point() else v for k, v in model.state_dict().items()}


def actor_log_probs(model, out):
    with torch.no_grad():
        lp, _ = compute_response_logprobs(model, out["input_ids"], out["attention_mask"], out["position_ids"],
                                          out["responses"], temperature=out.meta["temperature"])
    return lp


@pytest.mark.parametrize("engine", ENGINES)
def test_a_swap_to_the_same_weights_changes_nothing(qwen2, engine):  # noqa: F811
    model, tokenizer = qwen2
    model = copy.deepcopy(model)
    prompts = make_prompts(tokenizer)
    whole = ENGINES[engine](model, tokenizer).generate(prompts, PARAMS)
    swap = ScriptedSwap(model, model.state_dict())
    parts = ENGINES[engine](model, tokenizer).generate(prompts, PARAMS, swap=swap)
    assert swap.applied == 1
    assert torch.equal(parts["responses"], whole["responses"])
    torch.testing.assert_close(parts["rollout_log_probs"], whole["rollout_log_probs"], atol=1e-5, rtol=0)
    # rows still going after BEFORE tokens were finished by version 1; the others by version 0
    lengths = whole["response_mask"].sum(1)
    assert torch.equal(parts["policy_version_last"], (lengths > BEFORE).long())
    assert 0 < parts["policy_version_last"].sum() < len(lengths), "want rows that end before the swap and after"


@pytest.mark.parametrize("engine", ENGINES)
def test_after_a_swap_every_token_is_drawn_by_the_new_weights(qwen2, engine):  # noqa: F811
    model, tokenizer = qwen2
    old = copy.deepcopy(model)
    new = copy.deepcopy(model)
    new.load_state_dict(perturbed(model))
    prompts = make_prompts(tokenizer)
    worker_model = copy.deepcopy(model)
    swap = ScriptedSwap(worker_model, new.state_dict())
    out = ENGINES[engine](worker_model, tokenizer).generate(prompts, PARAMS, swap=swap)
    before = ENGINES[engine](old, tokenizer).generate(prompts, PARAMS)
    assert torch.equal(out["responses"][:, :BEFORE], before["responses"][:, :BEFORE])
    mask = out["response_mask"].bool()
    old_lp, new_lp = actor_log_probs(old, out), actor_log_probs(new, out)
    drawn_by_new = mask.clone()
    drawn_by_new[:, :BEFORE] = False
    drawn_by_old = mask & ~drawn_by_new
    rollout = out["rollout_log_probs"]
    torch.testing.assert_close(rollout[drawn_by_old], old_lp[drawn_by_old], atol=1e-4, rtol=0)
    torch.testing.assert_close(rollout[drawn_by_new], new_lp[drawn_by_new], atol=1e-4, rtol=0)
    assert (old_lp - new_lp)[drawn_by_new].abs().max() > 1e-2, "the two versions must tell apart"
    assert torch.equal(out["policy_version_last"], (out["response_mask"].sum(1) > BEFORE).long())


def test_nothing_pending_is_one_generation_and_a_swap_waiting_at_the_start_is_taken_first(qwen2):  # noqa: F811
    model, tokenizer = qwen2
    model = copy.deepcopy(model)
    prompts = make_prompts(tokenizer)
    whole = NativeRollout(model, tokenizer).generate(prompts, PARAMS)
    never = ScriptedSwap(model, model.state_dict(), after=10**9)
    out = NativeRollout(model, tokenizer).generate(prompts, PARAMS, swap=never)
    assert never.applied == 0 and torch.equal(out["responses"], whole["responses"])
    assert (out["policy_version_last"] == 0).all()
    new = perturbed(model)
    first = ScriptedSwap(model, new, after=0)
    out = NativeRollout(model, tokenizer).generate(prompts, PARAMS, swap=first)
    assert first.applied == 1 and (out["policy_version_last"] == 1).all()
    torch.testing.assert_close(out["rollout_log_probs"], actor_log_probs(model, out) * out["response_mask"],
                               atol=1e-4, rtol=0)


def test_with_max_num_seqs_a_swap_stops_the_rows_holding_slots_and_the_rest_start_under_the_new_weights(qwen2):  # noqa: F811
    """A pause stops every row, so rows waiting for a slot would have drawn nothing when it comes: the
    engine is handed max_num_seqs rows at a time, each group resumable; groups after the swap are the
    new weights' from their first token."""
    model, tokenizer = qwen2
    prompts = make_prompts(tokenizer)  # 5 prompts x 2 samples: groups of 4, 4 and 2 rows
    worker_model, new = copy.deepcopy(model), copy.deepcopy(model)
    new.load_state_dict(perturbed(model))
    swap = ScriptedSwap(worker_model, model.state_dict())  # the same weights: nothing changes
    out = NativeRollout(worker_model, tokenizer, max_num_seqs=4).generate(prompts, PARAMS, swap=swap)
    whole = NativeRollout(model, tokenizer).generate(prompts, PARAMS)
    assert torch.equal(out["responses"], whole["responses"])
    lengths = whole["response_mask"].sum(1)
    first = (lengths[:4] > BEFORE).long()  # the first group's rows still going at the swap end under version 1
    assert torch.equal(out["policy_version_last"], torch.cat([first, torch.ones(6, dtype=torch.long)]))

    swap = ScriptedSwap(copy.deepcopy(model), new.state_dict())
    out = NativeRollout(swap.model, tokenizer, max_num_seqs=4).generate(prompts, PARAMS, swap=swap)
    later = out["response_mask"][4:].bool()
    torch.testing.assert_close(out["rollout_log_probs"][4:][later], actor_log_probs(new, out)[4:][later],
                               atol=1e-4, rtol=0)
