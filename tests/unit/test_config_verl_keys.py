"""verl's launch keys: each one works, is accepted without effect (warning when it asks for
something not done here), or is refused with one line naming the key and what to use instead.

The launches below are written for these tests in the style of verl's example scripts (the keys
and values verl documents), not copied from them; each argument is what the shell passes on."""

import logging

import pytest

from verl.config import ConfigError, TrainerConfig
from verl.config.node import ConfigNode, field_specs
from verl.config.yaml_text import format_flow

GRPO_FSDP = [
    "algorithm.adv_estimator=grpo",
    "algorithm.use_kl_in_reward=False",
    "data.train_files=['/data/gsm8k/train.parquet','/data/math/train.parquet']",
    "data.val_files=/data/gsm8k/test.parquet",
    "data.train_batch_size=64",
    "data.max_prompt_length=512",
    "data.max_response_length=1024",
    "data.filter_overlong_prompts=True",
    "data.truncation='error'",
    "data.image_key=images",
    "+data.apply_chat_template_kwargs.enable_thinking=False",
    "actor_rollout_ref.model.path=Qwen/Qwen3-0.6B",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.model.use_fused_kernels=False",
    "actor_rollout_ref.model.lora_rank=0",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",
    "actor_rollout_ref.actor.optim.clip_grad=0.5",
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.use_torch_compile=False",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.actor.fsdp_config.reshard_after_forward=True",
    "actor_rollout_ref.actor.fsdp_config.model_dtype=bf16",
    "actor_rollout_ref.actor.fsdp_config.forward_prefetch=False",
    "actor_rollout_ref.actor.checkpoint.save_contents=['model','optimizer','extra']",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.mode=async",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.rollout.load_format=safetensors",
    "actor_rollout_ref.rollout.layered_summon=True",
    "actor_rollout_ref.rollout.enforce_eager=False",
    "actor_rollout_ref.rollout.free_cache_engine=True",
    "actor_rollout_ref.rollout.prompt_length=512",
    "actor_rollout_ref.rollout.response_length=1024",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=4096",
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4",
    "actor_rollout_ref.ref.strategy=fsdp2",
    "actor_rollout_ref.ref.use_torch_compile=False",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "trainer.critic_warmup=0",
    "trainer.balance_batch=True",
    'trainer.logger=["console","wandb"]',  # bash passes '["console","wandb"]' on like this
    "trainer.project_name=verl_grpo_example",
    "trainer.experiment_name=qwen3_grpo",
    "trainer.n_gpus_per_node=4",
    "trainer.nnodes=1",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
    "ray_kwargs.ray_init.runtime_env.py_executable=null",
    "+ray_kwargs.ray_init.num_gpus=4",
    "global_profiler.save_path=/tmp/profile",
]

PPO_CRITIC = [
    "algorithm.adv_estimator=gae",
    "data.train_batch_size=32",
    "data.max_prompt_length=256",
    "data.max_response_length=256",
    "actor_rollout_ref.model.path=Qwen/Qwen3-0.6B",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size=8",
    "actor_rollout_ref.rollout.n=1",
    "actor_rollout_ref.rollout.name=hf",
    "critic.strategy=fsdp2",
    "critic.model.path=Qwen/Qwen3-0.6B",
    "critic.model.use_remove_padding=True",
    "critic.model.enable_gradient_checkpointing=True",
    "critic.optim.lr=1e-5",
    "critic.optim.clip_grad=0.3",
    "critic.ppo_micro_batch_size_per_gpu=2",
    "critic.fsdp.param_offload=True",
    "critic.fsdp.optimizer_offload=False",
    "critic.ulysses_sequence_parallel_size=1",
    "trainer.critic_warmup=3",
    "trainer.n_gpus_per_node=2",
    "trainer.max_actor_ckpt_to_keep=2",
    "trainer.max_critic_ckpt_to_keep=2",
]

DYNAMIC_BSZ = [
    "data.train_batch_size=16",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=8192",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=8192",
    "actor_rollout_ref.rollout.max_num_batched_tokens=8192",
    "actor_rollout_ref.rollout.max_model_len=2048",
    "actor_rollout_ref.rollout.enable_chunked_prefill=True",
    "algorithm.rollout_correction.rollout_is=token",
    "algorithm.rollout_correction.rollout_is_threshold=3.0",
    "reward.custom_reward_function.path=/tmp/my_reward.py",
    "reward.custom_reward_function.name=score",
]


def _warnings(caplog, args):
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="verl.config"):
        cfg = TrainerConfig.from_cli(args)
        cfg.validate()
    return cfg, [r.getMessage() for r in caplog.records if r.name == "verl.config"]


def test_a_grpo_fsdp_launch_parses_and_its_keys_land_where_they_act(caplog):
    cfg, warnings = _warnings(caplog, GRPO_FSDP)
    assert warnings == []
    arr = cfg.actor_rollout_ref
    assert cfg.data.train_files == ["/data/gsm8k/train.parquet", "/data/math/train.parquet"]
    assert cfg.data.chat_template_kwargs == {"enable_thinking": False}
    assert arr.actor.strategy == "fsdp2" and arr.ref.strategy == "fsdp2"
    assert arr.actor.optim.warmup_style == "cosine"
    # Moved by validate(): verl's optim.clip_grad and fsdp_config.model_dtype.
    assert arr.actor.grad_clip == 0.5 and arr.actor.optim.clip_grad is None
    assert arr.model.dtype == "bfloat16" and arr.actor.fsdp_config.model_dtype is None
    assert arr.rollout.n == 5 and arr.rollout.name == "vllm"
    assert arr.rollout.engine_kwargs["vllm"] == {"swap_space": 4}
    assert arr.rollout.checkpoint_engine["update_weights_bucket_megabytes"] == 4096
    assert cfg.trainer.logger == ["console", "wandb"]
    assert cfg.ray_kwargs["ray_init"]["num_gpus"] == 4
    assert cfg.trainer.n_gpus_per_node == 4 and cfg.critic_enabled() is False


def test_a_ppo_launch_with_a_critic_parses():
    cfg = TrainerConfig.from_cli(PPO_CRITIC)
    assert cfg.critic.fsdp_config.param_offload is True  # critic.fsdp is critic.fsdp_config
    cfg.validate()
    assert cfg.critic.warmup_steps == 3 and cfg.trainer.critic_warmup == 0
    assert cfg.critic.grad_clip == 0.3
    # The global micro-batch of 8 samples is 4 per rank over 2 ranks.
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 4
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size is None
    assert cfg.critic_enabled()
    cfg.validate()  # the moves are idempotent
    assert cfg.critic.warmup_steps == 3


def test_a_dynamic_batch_launch_parses_and_verls_reward_and_correction_keys_act():
    cfg = TrainerConfig.from_cli(DYNAMIC_BSZ)
    cfg.validate()
    arr = cfg.actor_rollout_ref
    assert arr.actor.use_dynamic_bsz and arr.actor.ppo_max_token_len_per_gpu == 4096
    assert arr.rollout.log_prob_max_token_len_per_gpu == 8192 and arr.ref.log_prob_use_dynamic_bsz
    assert arr.actor.rollout_is_correction is True and arr.actor.rollout_is_threshold == 3.0
    assert cfg.custom_reward_function.path == "/tmp/my_reward.py" and cfg.custom_reward_function.name == "score"


@pytest.mark.parametrize("arg, expected", [
    ("actor_rollout_ref.actor.entropy_from_logits_with_chunking=True", "entropy_from_logits_with_chunking=true"),
    ("actor_rollout_ref.model.use_fused_kernels=True", "use_fused_kernels=true has no effect here"),
    ("actor_rollout_ref.actor.fsdp_config.offload_policy=True", "offload_policy=true"),
    ("actor_rollout_ref.actor.profiler.enable=True", "actor_rollout_ref.actor.profiler.enable=true"),
    ("global_profiler.tool=torch", "global_profiler.tool=torch has no effect here: profiling"),
    ("trainer.rollout_data_dir=/tmp/rollouts", "trainer.rollout_data_dir=/tmp/rollouts"),
    ("trainer.max_critic_ckpt_to_keep=3", "max_critic_ckpt_to_keep=3 has no effect here"),
    ("+reward_model.reward_kwargs.max_resp_len=512", "reward_model.reward_kwargs.max_resp_len"),
    ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "every rank holds whole sequences"),
    ("actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size=4", "data-parallel size is the world size"),
    ("critic.ulysses_sequence_parallel_size=2", "critic.ulysses_sequence_parallel_size=2 has no effect here"),
])
def test_no_effect_keys_warn_once_when_they_ask_for_something_not_done(caplog, arg, expected):
    _, warnings = _warnings(caplog, ["actor_rollout_ref.rollout.n=4", arg])
    assert len(warnings) == 1 and expected in warnings[0], warnings


def test_a_config_validated_again_says_its_warnings_once_and_another_config_says_them_anew(caplog):
    """main_ppo validates before the warm start and the trainer again when it is built: before, every warning
    of the launch was said twice."""
    args = ["actor_rollout_ref.rollout.n=4", "actor_rollout_ref.model.use_fused_kernels=true",
            "actor_rollout_ref.rollout.temperature=0"]
    cfg, warnings = _warnings(caplog, args)
    assert len(warnings) == 2, warnings  # the inert key, and greedy sampling of a group
    with caplog.at_level(logging.WARNING, logger="verl.config"):
        cfg.validate()
        cfg.validate(dp_size=1)
    assert [r.getMessage() for r in caplog.records if r.name == "verl.config"] == warnings
    assert _warnings(caplog, args)[1] == warnings  # a new config of the same keys: said again


def test_no_effect_keys_at_their_defaults_or_asking_for_less_stay_quiet(caplog):
    quiet = ["actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.use_torch_compile=False",
             "actor_rollout_ref.rollout.load_format=dummy", "actor_rollout_ref.actor.profiler.enable=False",
             "data.dataloader_num_workers=2", "trainer.max_critic_ckpt_to_keep=null"]
    assert _warnings(caplog, quiet)[1] == []
    assert "No effect here" in TrainerConfig.describe("actor_rollout_ref.actor.use_torch_compile")


@pytest.mark.parametrize("arg, named", [
    ("actor_rollout_ref.actor.strategy=megatron", "Megatron-LM backend"),
    ("critic.strategy=veomni", "VeOmni backend"),
    ("model_engine=megatron", "Megatron-LM backend"),
    ("actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2", "Megatron"),
    ("critic.model.lora_adapter_path=/ckpt/adapter", "does not hold the value head"),
    ("critic.model.lora.rank=32", "set critic.model.lora_rank"),
    ("actor_rollout_ref.model.lora.rank=32", "set lora_rank"),
    ("critic.model.custom_chat_template='{{ messages }}'", "tokenizer_path"),
    ("actor_rollout_ref.actor.optim.optimizer=SGD", "AdamW"),
    ("actor_rollout_ref.rollout.ignore_eos=True", "generation stops at EOS"),
    ("actor_rollout_ref.rollout.agent.default_agent_loop=my_agent", "multi_turn.enable=true"),
    ("algorithm.rollout_correction.loss_type=gspo", "the bypass losses are ppo_clip and reinforce"),
    ("distillation.distillation_loss.loss_mode=forward_kl_topk", "full logits"),
    ("trainer.val_only=True", "total_training_steps=0"),
    ("data.tokenizer=other/tokenizer", "set actor_rollout_ref.model.tokenizer_path"),
])
def test_refused_keys_name_the_key_and_what_to_use_instead(arg, named):
    key = arg.split("=", 1)[0]
    with pytest.raises(ConfigError) as info:
        TrainerConfig.from_cli(["actor_rollout_ref.rollout.n=4", arg]).validate()
    message = str(info.value)
    assert key in message and named in message and "\n" not in message, message
    if "strategy" in key or "engine" in key:
        assert "FSDP" in message


@pytest.mark.parametrize("args, named", [
    (["actor_rollout_ref.rollout.response_length=2048"], "uses data.max_response_length: set that key"),
    (["actor_rollout_ref.ref.fsdp_config.model_dtype=bf16"], "set that key instead"),
    (["actor_rollout_ref.actor.ppo_micro_batch_size=3", "trainer.n_gpus_per_node=2"], "must divide by 2"),
    (["actor_rollout_ref.actor.optim.clip_grad=0.5", "actor_rollout_ref.actor.grad_clip=2.0"], "give only"),
    (["data.gen_batch_size=96"], "leave data.gen_batch_size unset"),
])
def test_combinations_that_cannot_be_honoured_are_refused_by_validate(args, named):
    cfg = TrainerConfig.from_cli(["actor_rollout_ref.rollout.n=4", *args])
    with pytest.raises(ConfigError, match=named):
        cfg.validate()


def test_refusals_hold_in_python_and_yaml_too():
    with pytest.raises(ConfigError, match="lora_adapter_path=/a is not supported here"):
        TrainerConfig(critic=dict(model=dict(lora_adapter_path="/a")))
    cfg = TrainerConfig()
    with pytest.raises(ConfigError, match="strategy=megatron"):
        cfg.actor_rollout_ref.actor.strategy = "megatron"
    with pytest.raises(ConfigError, match="critic.strategy=megatron"):
        TrainerConfig.from_yaml("critic:\n  strategy: megatron\n")
    # verl's -1 for "filled in at run time" is this project's null.
    assert TrainerConfig.from_cli(["critic.optim.total_training_steps=-1"]).critic.optim.total_training_steps is None


def _leaves(node: ConfigNode, prefix: str = ""):
    for name, spec in field_specs(type(node)).items():
        value = getattr(node, name)
        if isinstance(value, ConfigNode):
            yield from _leaves(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


def _hydra(value) -> str:
    """A value in Hydra's override grammar (strings quoted, so `~/x` or `a,b` stay text)."""
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_hydra(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_hydra(v) for v in value) + "]"
    return format_flow(value)


def test_every_key_round_trips_through_the_command_line_at_its_default():
    default = TrainerConfig()
    args = [f"{key}={_hydra(value)}" for key, value in _leaves(default)]
    assert len(args) > 300
    assert TrainerConfig.from_cli(args) == default
