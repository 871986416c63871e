"""On-policy distillation: the loss against numbers worked by hand, and the checks of the
`distillation.*` keys that run before any model loads."""

import pytest
import torch

from verl.config import ConfigError, TrainerConfig
from verl.trainer.ppo.distillation import check_tokenizers, loss_settings, resolve_teachers
from verl.workers.actor import ADDITIVE_METRICS
from verl.algorithms.distillation import distillation_loss

# Two response tokens: the student's log-probs and the teacher's.
STUDENT = [[-1.0, -2.0]]
TEACHER = [[-1.5, -1.0]]


def _settings(**kw):
    cfg = TrainerConfig(distillation=dict(enabled=True, distillation_loss=kw))
    return loss_settings(cfg)


def _loss(settings, task_loss=0.0):
    log_prob = torch.tensor(STUDENT, requires_grad=True)
    loss, metrics = distillation_loss(torch.tensor(task_loss), {}, settings=settings, log_prob=log_prob,
                                      old_log_prob=log_prob.detach(), teacher_log_prob=torch.tensor(TEACHER),
                                      mask=torch.ones(1, 2), loss_agg_mode="token-mean", counts={})
    loss.backward()
    return loss.item(), metrics, log_prob.grad


def test_policy_gradient_k1_uses_minus_the_reverse_kl_as_advantage():
    # d = log s - log t = [0.5, -1.0]; advantages -d = [-0.5, 1.0]; on-policy the ratio is 1, so each
    # token's loss is -A = [0.5, -1.0]: token mean -0.25, and d/dlog s = -A / 2 = [0.25, -0.5].
    loss, metrics, grad = _loss(_settings(loss_mode="k1", use_policy_gradient=True, use_task_rewards=False))
    assert loss == pytest.approx(-0.25)
    assert metrics["actor/distillation/loss"].item() == pytest.approx(-0.25)
    assert metrics["actor/distillation/abs_loss"].item() == pytest.approx(0.75)  # (0.5 + 1.0) / 2
    assert grad[0].tolist() == pytest.approx([0.25, -0.5])
    assert metrics["actor/distillation/pg_clipfrac"].item() == 0


def test_loss_max_clamp_bounds_each_token_both_ways():
    # d = [0.5, -1.0] clamped to [-0.6, 0.6] -> [0.5, -0.6]: loss (0.5 - 0.6) / 2 = -0.05; abs_loss is unclamped.
    loss, metrics, _ = _loss(_settings(loss_mode="k1", use_policy_gradient=True, use_task_rewards=False,
                                       loss_max_clamp=0.6))
    assert loss == pytest.approx(-0.05)
    assert metrics["actor/distillation/abs_loss"].item() == pytest.approx(0.75)


def test_direct_k2_is_backpropagated_and_added_to_the_task_loss_with_its_coefficient():
    # k2 = 0.5 d^2 = [0.125, 0.5] -> token mean 0.3125; total = task 2.0 + 0.5 * 0.3125 = 2.15625.
    # d/dlog s of 0.5 * mean(0.5 d^2) = 0.5 * d / 2 = [0.125, -0.25].
    loss, metrics, grad = _loss(_settings(loss_mode="k2", use_policy_gradient=False, distillation_loss_coef=0.5),
                                task_loss=2.0)
    assert loss == pytest.approx(2.15625)
    assert metrics["actor/distillation/loss"].item() == pytest.approx(0.3125)
    assert grad[0].tolist() == pytest.approx([0.125, -0.25])


def test_direct_k3_matches_its_formula():
    # k3 = r - 1 - log r with log r = log t - log s = [-0.5, 1.0]:
    # [e^-0.5 - 1 + 0.5, e^1 - 1 - 1] = [0.10653, 0.71828] -> mean 0.41241.
    loss, _, _ = _loss(_settings(loss_mode="k3", use_task_rewards=False))
    assert loss == pytest.approx(0.412406, abs=1e-5)


def test_the_distillation_metrics_add_up_over_micro_batches():
    assert {"actor/distillation/loss", "actor/distillation/abs_loss"} <= ADDITIVE_METRICS


# --------------------------------------------------------------------------- the keys

def test_single_teacher_ignores_its_key_and_inert_keys_warn(caplog):
    cfg = TrainerConfig.from_cli(["distillation.enabled=True", "distillation.teacher_models.teacher_model.model_path=/t",
                                  "distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size=4",
                                  "distillation.distillation_loss.loss_mode=k1",
                                  "distillation.distillation_loss.use_policy_gradient=True"])
    assert resolve_teachers(cfg.distillation) == {"default": ("teacher_model", "/t")}
    assert "inference.tensor_model_parallel_size} have no effect here" in caplog.text


def test_several_teachers_are_routed_by_key_and_drop_the_default_entry():
    cfg = TrainerConfig.from_cli(["distillation.enabled=True",
                                  "+distillation.teacher_models.gsm8k.key=openai/gsm8k",
                                  "+distillation.teacher_models.gsm8k.model_path=/a",
                                  "+distillation.teacher_models.math.key=lighteval/MATH",
                                  "+distillation.teacher_models.math.model_path=/b"])
    assert resolve_teachers(cfg.distillation) == {"openai/gsm8k": ("gsm8k", "/a"), "lighteval/MATH": ("math", "/b")}


@pytest.mark.parametrize("args, named", [
    ([], "teacher_models.teacher_model.model_path"),
    (["distillation.teacher_models.teacher_model.model_path=/t", "distillation.distillation_loss.loss_mode=k1"],
     "use_policy_gradient=true"),
    (["+distillation.teacher_models.a.model_path=/a", "+distillation.teacher_models.b.model_path=/b",
      "+distillation.teacher_models.b.key=x"], "distillation.teacher_models.a.key is needed"),
    (["+distillation.teacher_models.a.model_path=/a", "+distillation.teacher_models.a.key=x",
      "+distillation.teacher_models.b.model_path=/b", "+distillation.teacher_models.b.key=x"], "its own key"),
    (["distillation.teacher_models.teacher_model.model_path=/t", "+distillation.teacher_models.teacher_model.path=/t"],
     "teacher_model.path is not a teacher setting"),
])
def test_teacher_settings_that_cannot_work_are_refused(args, named):
    cfg = TrainerConfig.from_cli(["distillation.enabled=True", *args])
    with pytest.raises(ConfigError, match=named):
        resolve_teachers(cfg.distillation)


@pytest.mark.parametrize("arg, named", [
    ("distillation.distillation_loss.loss_mode=forward_kl_topk", "full logits"),
    ("distillation.distillation_loss.loss_mode=k9", "only the single-sample estimators"),
    ("distillation.distillation_loss.policy_loss_mode=gspo", "only the vanilla policy loss"),
])
def test_loss_settings_not_implemented_are_refused_when_set(arg, named):
    with pytest.raises(ConfigError, match=named):
        TrainerConfig.from_cli([arg])


def test_a_teacher_with_another_tokenizer_is_refused_naming_both_models(tiny_model_dir, tmp_path):
    from verl.models.loading import load_tokenizer

    student = load_tokenizer(str(tiny_model_dir))
    other = load_tokenizer(str(tiny_model_dir))
    other.add_tokens(["<only-in-the-teacher>"])
    other.save_pretrained(tmp_path / "teacher")
    check_tokenizers(student, str(tiny_model_dir), {"default": ("teacher_model", str(tiny_model_dir))})
    with pytest.raises(ConfigError) as info:
        check_tokenizers(student, str(tiny_model_dir), {"default": ("teacher_model", str(tmp_path / "teacher"))})
    message = str(info.value)
    assert str(tmp_path / "teacher") in message and str(tiny_model_dir) in message
    assert "<only-in-the-teacher>" in message


def test_distillation_alone_needs_no_group_of_responses_but_with_task_rewards_grpo_does():
    # verl's distillation launches: GRPO named, one response per prompt, the teacher's signal only.
    base = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=1", "distillation.enabled=True",
            "distillation.teacher_models.teacher_model.model_path=/teacher"]
    TrainerConfig.from_cli([*base, "distillation.distillation_loss.use_task_rewards=False"]).validate()
    with pytest.raises(ConfigError, match="GRPO compares several responses per prompt"):
        TrainerConfig.from_cli([*base, "distillation.distillation_loss.use_task_rewards=True"]).validate()


def test_rows_need_their_ground_truth_only_when_the_task_rewards_are_trained_on():
    """A distillation that leaves the task rewards out of its loss (they are only logged) may train on
    prompts without answers; with them in the loss, as without distillation, the built-in scorers need them."""
    from verl.trainer.ppo.build import uses_builtin_scorers

    teacher = ["distillation.enabled=True", "+distillation.teacher_models.t.key=k", "+distillation.teacher_models.t.model_path=/t"]
    assert not uses_builtin_scorers(TrainerConfig.from_cli(teacher + ["distillation.distillation_loss.use_task_rewards=false"]))
    assert uses_builtin_scorers(TrainerConfig.from_cli(teacher)) and uses_builtin_scorers(TrainerConfig())
    assert not uses_builtin_scorers(TrainerConfig.from_cli(["custom_reward_function.path=/r.py"]))
