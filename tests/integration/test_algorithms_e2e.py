"""Every algorithm selectable by name runs end to end through ``main_ppo`` on the tiny model.

Runs are 3 steps of 4 prompts x 2 samples with 4-token responses: they prove the wiring (the
option reaches the math, the metrics say so), not learning (see test_algorithms_learn.py).
"""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from verl.data import write_parquet
from verl.trainer.main_ppo import main

pytestmark = pytest.mark.slow

STEPS = 3

# A reward a random model earns unevenly: the parity of the first character it writes. Groups
# then differ (dynamic sampling keeps some) and advantages are not all 0.
REWARD_FILE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    first = ord(solution_str[0]) if solution_str else 0
    return {"score": float(first % 2), "acc": first % 2 == 1}
'''

ALWAYS_REWARD_FILE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0
'''

NEVER_REWARD_FILE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 0.0
'''


def _rows(n):
    return [{"prompt": [{"role": "user", "content": f"say {i % 10}:"}], "data_source": "echo",
             "reward_model": {"style": "rule", "ground_truth": str(i % 10)}} for i in range(n)]


def run(tiny_model_dir, tmp_path, *overrides, reward=REWARD_FILE):
    train = write_parquet(_rows(32), tmp_path / "train.parquet")
    reward_file = tmp_path / "reward.py"
    reward_file.write_text(reward)
    out = tmp_path / "out"
    args = [f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={train}",
            f"custom_reward_function.path={reward_file}", "data.train_batch_size=4", "data.max_prompt_length=16",
            "data.max_response_length=4", "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.optim.lr=1e-3",
            f"trainer.total_training_steps={STEPS}", f"trainer.default_local_dir={out}", "trainer.progress_bar=false",
            "trainer.val_before_train=false", "trainer.write_report=false", *overrides]  # no report: half the file's time
    assert main(args) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "critic/score/mean" in r]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    return steps


def _weights(folder):
    return AutoModelForCausalLM.from_pretrained(folder).state_dict()


def _same_weights(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


# --------------------------------------------------------------------------- advantage estimators

@pytest.mark.parametrize("estimator,extra", [
    ("gae", ["critic.optim.lr=1e-3"]),
    ("grpo", []),
    ("grpo", ["algorithm.norm_adv_by_std_in_grpo=false"]),  # Dr. GRPO
    ("rloo", []),
    ("reinforce_plus_plus", []),
    ("reinforce_plus_plus_baseline", []),
    ("remax", []),
])
def test_each_advantage_estimator_trains(estimator, extra, tiny_model_dir, tmp_path):
    steps = run(tiny_model_dir, tmp_path, f"algorithm.adv_estimator={estimator}", *extra)
    for m in steps:
        assert torch.isfinite(torch.tensor([m["actor/pg_loss"], m["actor/grad_norm"]])).all()
        assert m["critic/advantages/max"] >= m["critic/advantages/min"]
    assert ("timing_s/gen_baseline" in steps[0]) == (estimator == "remax")
    assert ("critic/vf_loss" in steps[0]) == (estimator == "gae")
    assert not _same_weights(_weights(tmp_path / "out" / "huggingface"), _weights(tiny_model_dir))


def test_remax_subtracts_the_greedy_score(tiny_model_dir, tmp_path):
    # Every response, the greedy one included, scores 1: return 1 minus baseline 1 is 0 on every
    # token. Without the baseline the advantages would be 1.
    steps = run(tiny_model_dir, tmp_path, "algorithm.adv_estimator=remax", reward=ALWAYS_REWARD_FILE)
    assert all(m["critic/score/mean"] == 1 for m in steps)
    assert all(m["critic/advantages/max"] == 0 == m["critic/advantages/min"] for m in steps)


# --------------------------------------------------------------------------- policy losses and aggregation

@pytest.mark.parametrize("mode", ["vanilla", "gspo"])
def test_each_policy_loss_trains_with_clip_higher_and_dual_clip(mode, tiny_model_dir, tmp_path):
    steps = run(tiny_model_dir, tmp_path, f"actor_rollout_ref.actor.policy_loss.loss_mode={mode}",
                "actor_rollout_ref.actor.clip_ratio_low=0.2", "actor_rollout_ref.actor.clip_ratio_high=0.28",
                "actor_rollout_ref.actor.clip_ratio_c=3.0", "actor_rollout_ref.actor.ppo_epochs=2")
    for key in ("actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"):
        assert key in steps[-1], key
    # The second epoch runs on updated weights: the policy has moved off the sampling policy.
    assert any(m["actor/ppo_kl"] != 0 for m in steps)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_each_loss_aggregation_mode_trains(mode, tiny_model_dir, tmp_path):
    steps = run(tiny_model_dir, tmp_path, f"actor_rollout_ref.actor.loss_agg_mode={mode}",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.entropy_coeff=0.01",
                "actor_rollout_ref.actor.use_kl_loss=true")
    assert all(torch.isfinite(torch.tensor(m["actor/pg_loss"])) for m in steps)


def test_unknown_policy_loss_stops_before_training_with_a_hint(tiny_model_dir, tmp_path, capsys):
    code = main([f"actor_rollout_ref.model.path={tiny_model_dir}", "actor_rollout_ref.actor.policy_loss.loss_mode=gpso",
                 f"trainer.default_local_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2 and "did you mean actor_rollout_ref.actor.policy_loss.loss_mode=gspo" in err
    assert not (tmp_path / "metrics.jsonl").exists()


def test_unknown_estimator_stops_before_training_with_a_hint(tiny_model_dir, capsys):
    code = main([f"actor_rollout_ref.model.path={tiny_model_dir}", "algorithm.adv_estimator=rlo"])
    assert code == 2 and "did you mean algorithm.adv_estimator=rloo" in capsys.readouterr().err


# --------------------------------------------------------------------------- KL and entropy

@pytest.mark.parametrize("kind", ["k1", "abs", "k2", "k3", "kl", "mse", "low_var_kl"])
def test_each_kl_loss_estimator_trains(kind, tiny_model_dir, tmp_path):
    steps = run(tiny_model_dir, tmp_path, "actor_rollout_ref.actor.use_kl_loss=true",
                f"actor_rollout_ref.actor.kl_loss_type={kind}", "actor_rollout_ref.actor.kl_loss_coef=0.1")
    assert all("actor/kl_loss" in m for m in steps)
    # Step 1 samples from the reference itself; later steps from a policy that moved away.
    assert steps[0]["actor/ref_kl"] == 0.0 and steps[-1]["actor/ref_kl"] != 0.0
    assert all(m["actor/kl_loss"] != 0.0 for m in steps[1:])
    if kind not in ("k1", "kl"):  # the others are >= 0 per token; k1 may be negative
        assert all(m["actor/kl_loss"] >= 0 for m in steps)


def test_adaptive_kl_controller_moves_its_coefficient_across_steps(tiny_model_dir, tmp_path):
    steps = run(tiny_model_dir, tmp_path, "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive",
                "algorithm.kl_ctrl.kl_coef=0.1", "algorithm.kl_ctrl.target_kl=1.0", "algorithm.kl_ctrl.horizon=40")
    coefs = [m["actor/reward_kl_penalty_coeff"] for m in steps]
    # The measured KL is far below the target, so the error is clipped to -20% and each step
    # of 8 samples multiplies the coefficient by 1 - 0.2 x 8 / 40 = 0.96.
    assert coefs == pytest.approx([0.1, 0.096, 0.09216])
    fixed = run(tiny_model_dir, tmp_path / "fixed", "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.kl_coef=0.1")
    assert [m["actor/reward_kl_penalty_coeff"] for m in fixed] == pytest.approx([0.1] * STEPS)


def test_entropy_bonus_enters_the_loss(tiny_model_dir, tmp_path):
    plain = run(tiny_model_dir, tmp_path / "plain", "trainer.seed=3")
    bonus = run(tiny_model_dir, tmp_path / "bonus", "trainer.seed=3", "actor_rollout_ref.actor.entropy_coeff=0.5")
    assert "actor/entropy_loss" in bonus[0] and "actor/entropy_loss" not in plain[0]
    # Same seed, same first rollout: only the objective differs, so the first update does too.
    assert plain[0]["critic/score/mean"] == bonus[0]["critic/score/mean"]
    assert plain[0]["actor/grad_norm"] != bonus[0]["actor/grad_norm"]


# --------------------------------------------------------------------------- critic

def test_value_clipping_acts_only_when_the_range_is_small(tiny_model_dir, tmp_path):
    common = ("algorithm.adv_estimator=gae", "critic.optim.lr=1e-2", "critic.ppo_epochs=2")
    tight = run(tiny_model_dir, tmp_path / "tight", *common, "critic.cliprange_value=1e-6")
    loose = run(tiny_model_dir, tmp_path / "loose", *common, "critic.cliprange_value=1e6")
    # The second epoch predicts off the old values: a tiny range clips, a huge one never does.
    assert all(m["critic/vf_clipfrac"] > 0 for m in tight)
    assert all(m["critic/vf_clipfrac"] == 0 for m in loose)


def test_critic_warmup_leaves_the_actor_unchanged(tiny_model_dir, tmp_path):
    warm = run(tiny_model_dir, tmp_path / "warm", "algorithm.adv_estimator=gae", f"critic.warmup_steps={STEPS}")
    assert all("critic/vf_loss" in m and "actor/pg_loss" not in m for m in warm)
    assert _same_weights(_weights(tmp_path / "warm" / "out" / "huggingface"), _weights(tiny_model_dir))
    after = run(tiny_model_dir, tmp_path / "after", "algorithm.adv_estimator=gae", f"critic.warmup_steps={STEPS - 1}")
    assert ["actor/pg_loss" in m for m in after] == [False] * (STEPS - 1) + [True]
    assert not _same_weights(_weights(tmp_path / "after" / "out" / "huggingface"), _weights(tiny_model_dir))


# --------------------------------------------------------------------------- DAPO

def test_dynamic_sampling_fills_the_step_with_informative_groups(tiny_model_dir, tmp_path):
    steps = run(tiny_model_dir, tmp_path, "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc",
                "algorithm.filter_groups.max_num_gen_batches=20", "actor_rollout_ref.rollout.n=4")
    for m in steps:
        assert m["filter_groups/trained_groups"] == 4 and m["filter_groups/cap_hit"] == 0
        seen = m["filter_groups/kept_groups"] + m["filter_groups/dropped_groups"]
        assert seen == 4 * m["filter_groups/num_gen_batches"]
        # Every trained group has a 0 and a 1, so GRPO advantages are never all 0.
        assert m["critic/advantages/max"] > 0 > m["critic/advantages/min"]
    assert sum(m["filter_groups/num_gen_batches"] for m in steps) > STEPS  # some groups were dropped


def test_dynamic_sampling_cap_trains_on_what_it_has_and_says_so(tiny_model_dir, tmp_path):
    steps = run(tiny_model_dir, tmp_path, "algorithm.filter_groups.enable=true",
                "algorithm.filter_groups.max_num_gen_batches=2", reward=NEVER_REWARD_FILE)
    for m in steps:
        drawn, kept, cap_hit = (m[f"filter_groups/{k}"] for k in ("num_gen_batches", "kept_groups", "cap_hit"))
        assert (drawn, kept, cap_hit) == (2, 0, 1)
        assert m["filter_groups/dropped_groups"] == 8


def test_overlong_penalty_lowers_the_score_of_long_responses(tiny_model_dir, tmp_path):
    steps = run(tiny_model_dir, tmp_path, "reward_model.overlong_buffer.enable=true",
                "reward_model.overlong_buffer.len=2", "reward_model.overlong_buffer.penalty_factor=0.5",
                reward=NEVER_REWARD_FILE)
    for m in steps:
        # The random model never writes EOS, so every response has the full 4 tokens: the
        # penalty at max_response_length is the whole factor.
        assert m["response_length/min"] == 4
        assert m["reward_extra/overlong_penalty/mean"] == pytest.approx(-0.5)
        assert m["critic/score/mean"] == pytest.approx(-0.5)


def test_masking_truncated_responses_removes_them_from_the_loss(tiny_model_dir, tmp_path):
    # Every response of the random model is cut off at 4 tokens: with all of them masked the loss
    # has no tokens, and AdamW without weight decay leaves the weights exactly as they were.
    args = ("actor_rollout_ref.actor.optim.weight_decay=0.0", "actor_rollout_ref.actor.use_kl_loss=true")
    masked = run(tiny_model_dir, tmp_path / "masked", *args, "actor_rollout_ref.actor.mask_truncated_responses=true")
    assert all(m["actor/truncated_masked_ratio"] == 1.0 for m in masked)
    assert _same_weights(_weights(tmp_path / "masked" / "out" / "huggingface"), _weights(tiny_model_dir))
    run(tiny_model_dir, tmp_path / "kept", *args)
    assert not _same_weights(_weights(tmp_path / "kept" / "out" / "huggingface"), _weights(tiny_model_dir))


# --------------------------------------------------------------------------- off-policy correction

def test_rollout_importance_correction_weights_tokens_when_top_k_narrows_sampling(tiny_model_dir, tmp_path):
    steps = run(tiny_model_dir, tmp_path, "actor_rollout_ref.actor.rollout_is_correction=true",
                "actor_rollout_ref.actor.rollout_is_threshold=2.0", "actor_rollout_ref.rollout.top_k=3")
    for m in steps:
        # top-k renormalises over 3 tokens: the engine's probabilities exceed the actor's, so
        # the ratio pi_old / pi_rollout is below 1 and the weights are too.
        assert m["actor/rollout_log_prob_diff"] > 0.01
        assert 0 < m["actor/rollout_is_weight"] < 1
        assert m["actor/rollout_is_clipfrac"] == 0


def test_rollout_log_probs_match_the_actor_without_sampling_filters(tiny_model_dir, tmp_path):
    steps = run(tiny_model_dir, tmp_path, "actor_rollout_ref.rollout.calculate_log_probs=true")
    assert all(m["actor/rollout_log_prob_diff"] < 1e-4 for m in steps)
    assert "actor/rollout_is_weight" not in steps[0]


@pytest.mark.parametrize("micro", [None, 2])
def test_seq_mean_token_sum_norm_divides_by_the_configured_max_response_length(tiny_model_dir, micro):
    # Responses of 4, 4, 1 and 2 tokens in 4 columns, advantage 1 and ratio 1 on every token: the
    # loss is -(4 + 4 + 1 + 2) / (4 sequences x norm_len 8), in one pass or in micro-batches of 2.
    from verl.config import TrainerConfig
    from verl.data.collate import collate_prompts
    from verl.distributed.fsdp import parallelize
    from verl.models.loading import load_causal_lm
    from verl.models.logprob import compute_response_logprobs
    from verl.rollout import assemble_rollout
    from verl.workers.actor import Actor

    model = load_causal_lm(str(tiny_model_dir))
    prompts = collate_prompts([dict(input_ids=[10 + i, 20], raw_prompt="", data_source="t", ground_truth="",
                                    extra_info={}, index=i) for i in range(4)], 0)
    batch = assemble_rollout(prompts, torch.tensor([[50, 51, 52, 53], [60, 61, 62, 63], [2, 0, 0, 0], [70, 2, 0, 0]]),
                             4, [2], 0)
    with torch.no_grad():
        batch["old_log_probs"], _ = compute_response_logprobs(model, batch["input_ids"], batch["attention_mask"],
                                                              batch["position_ids"], batch["responses"])
    batch["advantages"] = batch["response_mask"].float()
    cfg = TrainerConfig(actor_rollout_ref=dict(actor=dict(loss_agg_mode="seq-mean-token-sum-norm")))
    actor_cfg = cfg.actor_rollout_ref.actor
    actor = Actor(parallelize(model, actor_cfg.fsdp_config, device="cpu"), actor_cfg, torch.device("cpu"),
                  samples_per_mini_batch=4, total_steps=1, norm_len=8)
    metrics = actor.update(batch, micro_batch_size=micro)
    assert metrics["actor/pg_loss"] == pytest.approx(-11 / 32, abs=1e-5)
