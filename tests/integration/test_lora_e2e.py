"""LoRA end to end through ``main_ppo`` with upstream verl's LoRA launch keys
(examples/tuning/lora/run_qwen3_8b_fsdp.sh, ..._merge_fsdp.sh, ..._from_adapter_fsdp.sh; with the hf
rollout for vLLM): only the adapters train, the export is a plain merged model with the adapter
beside it, that adapter starts a new run, and a resumed run equals the uninterrupted one."""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tests.integration.helpers import echo_launch, run_torchrun_module
from verl.data import write_parquet
from verl.trainer.main_ppo import main

pytestmark = pytest.mark.slow
torch.set_num_threads(1)

# A reward a random tiny model earns unevenly within a group: the parity of the first character.
REWARD_FILE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(ord(solution_str[0]) % 2) if solution_str else 0.0
'''

# The LoRA-relevant lines of upstream's scripts, as written there (rank and lengths scaled to the tiny model).
UPSTREAM_LORA_KEYS = [
    "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False",
    "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
    "actor_rollout_ref.model.target_modules=all-linear", "+actor_rollout_ref.model.lora.merge=True",
    "actor_rollout_ref.model.use_remove_padding=True", "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=256",
    "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.load_format=safetensors", "actor_rollout_ref.rollout.layered_summon=True",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=256",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True", "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=256",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True", "trainer.val_before_train=False",
]


# Graded, so that no group has all-equal rewards (zero advantages leave a gradient of rounding noise,
# which Adam would scale up to a full step in a direction that depends on the world size).
GRADED_REWARD_FILE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return len(set(solution_str)) / (1 + len(solution_str))
'''


def _args(tiny_model_dir, tmp_path, *overrides, steps=2, reward_file=REWARD_FILE):
    return [*echo_launch(tiny_model_dir, tmp_path, reward_file, steps=steps, lr="5e-2"),
            "actor_rollout_ref.rollout.name=hf", *UPSTREAM_LORA_KEYS, *overrides]


def _steps(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "critic/score/mean" in r]


def test_upstream_lora_launch_trains_the_adapters_and_exports_a_merged_model(tiny_model_dir, tmp_path):
    assert main(_args(tiny_model_dir, tmp_path, "trainer.save_freq=2")) == 0
    out = tmp_path / "out"
    steps = _steps(out)
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["actor/grad_norm"] > 0 for r in steps) and "actor/kl_loss" in steps[0]
    assert steps[1]["actor/ref_kl"] != 0  # after one update the adapters move the policy off the base

    # The checkpoint holds the adapters alone (the base weights are the model path's), with a
    # fingerprint of the base weights it was trained on.
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    state = torch.load(out / "global_step_2" / "state.pt", weights_only=False)
    assert state["actor"]["model"] and all(".lora_" in name for name in state["actor"]["model"])
    assert len(state["actor"]["frozen_fingerprint"]) == len(base)  # lm_head: the tied embedding's second name

    # The export is a plain Hugging Face model (merged weights), the adapter beside it.
    exported = AutoModelForCausalLM.from_pretrained(out / "huggingface").state_dict()
    assert exported.keys() == base.keys()
    assert not torch.equal(exported["model.layers.0.self_attn.q_proj.weight"],
                           base["model.layers.0.self_attn.q_proj.weight"])
    torch.testing.assert_close(exported["model.norm.weight"], base["model.norm.weight"], atol=0, rtol=0)
    adapter = load_file(out / "huggingface" / "lora_adapter" / "adapter_model.safetensors")
    assert adapter and all("lora_" in k for k in adapter)

    # run_qwen3_8b_from_adapter_fsdp.sh: continue from that adapter (no lora_rank given).
    args = [a for a in _args(tiny_model_dir, tmp_path / "again", steps=1) if "lora_rank" not in a]
    assert main(args + [f"actor_rollout_ref.model.lora_adapter_path={out / 'huggingface' / 'lora_adapter'}",
                        "actor_rollout_ref.model.use_shm=True"]) == 0
    # Its first step starts from the adapted policy: the KL to the base is there at once.
    assert _steps(tmp_path / "again" / "out")[0]["actor/ref_kl"] != 0


def test_resumed_lora_run_equals_uninterrupted_run(tiny_model_dir, tmp_path):
    assert main(_args(tiny_model_dir, tmp_path / "a", steps=3)) == 0
    straight = AutoModelForCausalLM.from_pretrained(tmp_path / "a" / "out" / "huggingface").state_dict()
    resumed_args = _args(tiny_model_dir, tmp_path / "b", "trainer.save_freq=1", steps=3)
    assert main(resumed_args + ["trainer.total_training_steps=1"]) == 0
    assert main(resumed_args) == 0
    resumed = AutoModelForCausalLM.from_pretrained(tmp_path / "b" / "out" / "huggingface").state_dict()
    for key in straight:
        torch.testing.assert_close(resumed[key], straight[key], rtol=0, atol=0)
    assert [r["step"] for r in _steps(tmp_path / "b" / "out")] == [1, 2, 3]


def test_a_lora_checkpoint_refuses_to_resume_on_other_base_weights(tiny_model_dir, tmp_path, capsys):
    from verl.models.tiny import make_tiny_model_folder

    assert main(_args(tiny_model_dir, tmp_path, "trainer.save_freq=1", steps=1)) == 0
    other = make_tiny_model_folder(tmp_path / "other", seed=1, num_layers=2, hidden_size=64,
                                   intermediate_size=128)  # the architecture of tiny_model_dir, other weights
    args = [a if not a.startswith("actor_rollout_ref.model.path=") else f"actor_rollout_ref.model.path={other}"
            for a in _args(tiny_model_dir, tmp_path, "trainer.save_freq=1", steps=2)]
    assert main(args) != 0
    err = capsys.readouterr().err
    assert "holds its trained weights (LoRA adapters) but not its frozen base weights" in err
    assert "resume with the model.path the run was started with" in err


def test_a_resume_under_other_lora_settings_is_refused_naming_the_key_and_the_saved_value(tiny_model_dir, tmp_path,
                                                                                          capsys):
    """Before: another lora_alpha resumed without an error (the adapters' output silently rescaled), and LoRA
    turned on or off was refused as 'written for another model ... resume with the model.path'."""
    assert main(_args(tiny_model_dir, tmp_path, "trainer.save_freq=1", steps=1)) == 0
    for key, saved in (("lora_alpha=64", "lora_alpha=16"), ("lora_rank=0", "lora_rank=8")):
        assert main(_args(tiny_model_dir, tmp_path, "trainer.save_freq=1", f"actor_rollout_ref.model.{key}",
                          steps=2)) != 0
        err = capsys.readouterr().err
        assert (f"with actor_rollout_ref.model.{key}: it was saved with actor_rollout_ref.model.{saved}" in err
                and f"Resume with actor_rollout_ref.model.{saved}, or start a new run" in err)
    assert main(_args(tiny_model_dir, tmp_path, "trainer.save_freq=1", steps=2)) == 0  # the saved settings resume


def test_sft_with_lora_trains_the_adapters_only(tiny_model_dir, tmp_path):
    from verl.data.offline import addition_rows
    from verl.trainer.main_sft import main as sft_main

    train = write_parquet(addition_rows("sft", "train", n=64, seed=0), tmp_path / "train.parquet")
    out = tmp_path / "out"
    assert sft_main([f"model.path={tiny_model_dir}", f"data.train_files={train}", "data.train_batch_size=8",
                     "model.lora_rank=8", "model.lora_alpha=16", "optim.lr=1e-2", "trainer.total_training_steps=2",
                     f"trainer.default_local_dir={out}", "trainer.progress_bar=false", "trainer.logger=[]"]) == 0
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    exported = AutoModelForCausalLM.from_pretrained(out / "huggingface").state_dict()
    changed = {k for k in base if not torch.equal(base[k], exported[k])}
    # Merged adapters change the adapted projections; norms and embeddings stay the base's.
    assert changed and all(k.endswith("proj.weight") for k in changed), changed
    assert (out / "huggingface" / "lora_adapter" / "adapter_model.safetensors").is_file()


def test_two_torchrun_ranks_train_the_same_adapters_as_one_process(tiny_model_dir, tmp_path):
    assert main(_args(tiny_model_dir, tmp_path / "one", reward_file=GRADED_REWARD_FILE)) == 0
    done = run_torchrun_module("verl.trainer.main_ppo", _args(tiny_model_dir, tmp_path / "two",
                                                              reward_file=GRADED_REWARD_FILE))
    assert done.returncode == 0, done.stderr[-4000:]
    one = AutoModelForCausalLM.from_pretrained(tmp_path / "one" / "out" / "huggingface").state_dict()
    two = AutoModelForCausalLM.from_pretrained(tmp_path / "two" / "out" / "huggingface").state_dict()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    key = "model.layers.0.mlp.up_proj.weight"
    assert (one[key] - base[key]).abs().max() > 1e-2  # the merged adapters moved the weights
    # Data parallel equals one big batch up to the order of float sums, which Adam's first steps
    # (about lr * sign(g) per element) magnify where a gradient element is near zero.
    for key in one:
        torch.testing.assert_close(two[key], one[key], atol=1e-3, rtol=0)


CRITIC_LORA = ["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=1", "critic.optim.lr=1e-2",
               "critic.model.lora_rank=8", "critic.model.lora_alpha=16"]


def test_a_lora_critic_trains_its_adapters_and_value_head_and_resumes_exactly(tiny_model_dir, tmp_path):
    assert main(_args(tiny_model_dir, tmp_path / "a", *CRITIC_LORA, "trainer.save_freq=3", steps=3,
                      reward_file=GRADED_REWARD_FILE)) == 0
    steps = _steps(tmp_path / "a" / "out")
    assert all(r["critic/grad_norm"] > 0 for r in steps) and steps[0]["critic/vf_loss"] > 0
    straight = torch.load(tmp_path / "a" / "out" / "global_step_3" / "state.pt", weights_only=False)["critic"]

    # The checkpoint holds what trains: the adapters and the new value head (moved off its zero start).
    head = {k for k in straight["model"] if k.endswith(("lm_head.weight", "lm_head.bias"))}
    assert len(head) == 2 and all(straight["model"][k].abs().max() > 0 for k in head)
    adapters = {k for k in straight["model"] if ".lora_" in k}
    assert adapters and set(straight["model"]) == adapters | head
    assert len(straight["optimizer"]["state"]) == len(adapters) + len(head)

    resumed_args = _args(tiny_model_dir, tmp_path / "b", *CRITIC_LORA, "trainer.save_freq=1", steps=3,
                         reward_file=GRADED_REWARD_FILE)
    assert main(resumed_args + ["trainer.total_training_steps=1"]) == 0
    assert main(resumed_args) == 0
    resumed = torch.load(tmp_path / "b" / "out" / "global_step_3" / "state.pt", weights_only=False)["critic"]
    for name, tensor in straight["model"].items():
        torch.testing.assert_close(resumed["model"][name], tensor, rtol=0, atol=0, msg=name)


def test_a_lora_checkpoint_of_one_process_resumes_on_two_torchrun_ranks(tiny_model_dir, tmp_path):
    # The checkpoint holds the adapters alone; each rank takes its shards of them and keeps the base
    # weights it loaded, and the run goes on as the uninterrupted one-process run does.
    assert main(_args(tiny_model_dir, tmp_path / "one", reward_file=GRADED_REWARD_FILE)) == 0
    args = _args(tiny_model_dir, tmp_path / "split", "trainer.save_freq=1", reward_file=GRADED_REWARD_FILE)
    assert main(args + ["trainer.total_training_steps=1"]) == 0
    done = run_torchrun_module("verl.trainer.main_ppo", args)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Resumed from" in done.stdout
    one = AutoModelForCausalLM.from_pretrained(tmp_path / "one" / "out" / "huggingface").state_dict()
    split = AutoModelForCausalLM.from_pretrained(tmp_path / "split" / "out" / "huggingface").state_dict()
    for key in one:
        torch.testing.assert_close(split[key], one[key], atol=1e-3, rtol=0)
