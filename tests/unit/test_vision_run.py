"""A vision-language policy's run (verl.trainer.ppo.vision_run): what it does not support yet is refused at
start with one line naming the key; what it needs is set and said; a text model's config is left alone."""

import pytest

from verl import TrainerConfig
from verl.errors import ConfigError
from verl.models.tiny import build_tiny_config
from verl.models.tiny_vision import build_tiny_vl_config, build_vl_tokenizer
from verl.trainer.ppo.vision_run import prepare_vision_run

VL = build_tiny_vl_config(build_vl_tokenizer())


def _config(*keys):
    return TrainerConfig.from_cli(["algorithm.adv_estimator=grpo", *keys])


@pytest.mark.parametrize("keys, message", [
    (("actor_rollout_ref.rollout.name=vllm",), "rollout.name=vllm"),
    (("actor_rollout_ref.rollout.multi_turn.enable=true",), "multi-turn rollouts"),
    (("async_training.enable=true",), "asynchronous RL"),
    (("actor_rollout_ref.actor.use_prefix_grouper=true",), "use_prefix_grouper=true"),
])
def test_what_a_vision_language_run_cannot_do_yet_is_refused_naming_the_key(keys, message):
    with pytest.raises(ConfigError, match=r"the policy is a vision-language model \(qwen2_vl\).*" +
                       message.replace("(", r"\(").replace(".", r"\.")):
        prepare_vision_run(_config(*keys), VL)


def test_packing_is_switched_off_and_said_auto_becomes_hf_and_a_text_model_is_left_alone():
    config = _config("actor_rollout_ref.model.use_remove_padding=true")
    lines = prepare_vision_run(config, VL)
    arr = config.actor_rollout_ref
    assert not arr.model.use_remove_padding and arr.actor.use_prefix_grouper is False and arr.rollout.name == "hf"
    assert "use_remove_padding=true: off" in lines[0] and "data.image_key=images" in lines[-1]
    critic = _config("algorithm.adv_estimator=gae", "critic.model.use_remove_padding=true")
    assert "critic.model.use_remove_padding=true: off" in prepare_vision_run(critic, VL)[0]
    assert not critic.critic.model.use_remove_padding
    text = _config("actor_rollout_ref.model.use_remove_padding=true", "actor_rollout_ref.rollout.name=native",
                   "algorithm.adv_estimator=gae")
    assert prepare_vision_run(text, build_tiny_config(300)) == []
    assert text.actor_rollout_ref.model.use_remove_padding and text.actor_rollout_ref.rollout.name == "native"
