"""Engine-vs-actor log-prob parity: the log-probs the HF rollout reports while sampling equal the
actor's forward pass when nothing but the temperature shapes the sampling distribution, and
describe the narrowed distribution when top-k does (DESIGN.md, testing tier 2)."""

import dataclasses

import pytest
import torch

from verl.config import TrainerConfig
from verl.data.collate import collate_prompts
from verl.models.logprob import response_logits
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker

EOS = 2
TEXTS = ("12+34=", "5+6=", "99+1=", "say 7:")


@pytest.fixture(scope="module")
def worker(tiny_model_dir):
    cfg = TrainerConfig(data=dict(max_response_length=12), trainer=dict(device="cpu"),
                        actor_rollout_ref=dict(model=dict(path=str(tiny_model_dir)), rollout=dict(n=3),
                                               actor=dict(ppo_mini_batch_size=2)))
    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, with_ref=False)
    with torch.no_grad():  # some responses stop at EOS, some run to the limit: both layouts are checked
        worker.actor_model.get_output_embeddings().weight[EOS] *= 30
    return worker


def _prompts(tokenizer):
    items = [dict(input_ids=tokenizer(t)["input_ids"], raw_prompt=t, data_source="test", ground_truth="0",
                  extra_info={}, index=i) for i, t in enumerate(TEXTS)]
    return collate_prompts(items, tokenizer.pad_token_id)


def _generate(worker, **changes):
    params = dataclasses.replace(worker.sampling_params(), logprobs=True, **changes)
    torch.manual_seed(0)
    out = worker.generate_sequences(_prompts(worker.tokenizer), params)
    return out, out.union(worker.compute_log_prob(out))["old_log_probs"]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_log_probs_equal_the_actors_without_top_k_or_top_p(worker, temperature):
    out, actor = _generate(worker, temperature=temperature)
    mask = out["response_mask"].bool()
    lengths = mask.sum(-1)
    assert lengths.min() < 12 and lengths.max() == 12, "want both early-stopped and full-length responses"
    torch.testing.assert_close(out["rollout_log_probs"][mask], actor[mask], atol=1e-4, rtol=0)
    assert (out["rollout_log_probs"][~mask] == 0).all()


def test_greedy_rollout_log_probs_are_the_untempered_ones(worker):
    out, actor = _generate(worker, do_sample=False)
    mask = out["response_mask"].bool()
    torch.testing.assert_close(out["rollout_log_probs"][mask], actor[mask], atol=1e-4, rtol=0)


def test_top_k_rollout_log_probs_describe_the_renormalised_distribution(worker):
    k = 5
    out, actor = _generate(worker, top_k=k)
    mask = out["response_mask"].bool()
    logits = response_logits(worker.actor_model, out["input_ids"], out["attention_mask"], out["position_ids"],
                             out["responses"].shape[1]).detach()
    top = logits.topk(k, dim=-1)
    # log-softmax over the k kept tokens, at the sampled token (which is always among them)
    in_top = (top.indices == out["responses"].unsqueeze(-1))
    assert in_top[mask].any(-1).all()
    renormalised = (top.values - top.values.logsumexp(-1, keepdim=True))
    expected = (renormalised * in_top).sum(-1)
    torch.testing.assert_close(out["rollout_log_probs"][mask], expected[mask], atol=1e-4, rtol=0)
    assert (out["rollout_log_probs"][mask] > actor[mask]).all()  # fewer tokens share the mass


def test_validation_sampling_reports_no_log_probs(worker):
    out = worker.generate_sequences(_prompts(worker.tokenizer), worker.sampling_params(validate=True))
    assert "rollout_log_probs" not in out


def test_the_models_own_generation_defaults_do_not_change_the_sampling(worker):
    # Hub checkpoints ship generation_config.json files with top_k, top_p, repetition_penalty; the
    # rollout samples from what SamplingParams says, so parity with the actor still holds.
    gen_cfg = worker.actor_model.generation_config
    saved = (gen_cfg.top_k, gen_cfg.top_p, gen_cfg.repetition_penalty)
    gen_cfg.top_k, gen_cfg.top_p, gen_cfg.repetition_penalty = 3, 0.5, 2.0
    try:
        out, actor = _generate(worker)
    finally:
        gen_cfg.top_k, gen_cfg.top_p, gen_cfg.repetition_penalty = saved
    mask = out["response_mask"].bool()
    torch.testing.assert_close(out["rollout_log_probs"][mask], actor[mask], atol=1e-4, rtol=0)
