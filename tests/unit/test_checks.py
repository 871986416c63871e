"""verl.utils.preflight: the tutorial's troubleshooting table as clear errors or automatic fixes."""

import numpy as np
import pytest
import torch
from transformers import AutoConfig, GPT2Config, PretrainedConfig

from verl.distributed.worker_group import LocalWorkerGroup
from verl.errors import VerlError
from verl.protocol import Batch
from verl.utils.preflight import (
    check_context_length,
    check_torch_version,
    explain_oom,
    installed_torch_version,
    normalize_reward,
    oom_hint,
)


# ------------------------------------------------------------------------------- torch version
@pytest.mark.parametrize("version", ["2.6.0", "2.6.0a0+git1234", "2.7.0a0", "2.13.0+cpu", "3.0.0"])
def test_torch_2_6_and_newer_pass_the_version_check(version):
    check_torch_version(version)


@pytest.mark.parametrize("version", ["2.5.1+cu121", "2.4.0", "2.0.0", "1.13.1"])
def test_older_torch_raises_import_error_with_minimum_version_and_install_command(version):
    with pytest.raises(ImportError) as err:
        check_torch_version(version)
    message = str(err.value)
    assert f"found {version}" in message
    assert ">= 2.6" in message and "pip install --upgrade 'torch>=2.6'" in message


def test_missing_or_unreadable_torch_version_raises_import_error_with_install_command():
    with pytest.raises(ImportError, match="not installed.*pip install"):
        check_torch_version(None)
    with pytest.raises(ImportError, match="cannot read.*'unknown'"):
        check_torch_version("unknown")


def test_installed_torch_version_is_read_without_importing_torch_and_matches_it():
    assert installed_torch_version() == torch.__version__


# ------------------------------------------------------------------------------------ rewards
def test_a_scalar_reward_for_a_batch_of_one_becomes_shape_1():
    for reward in (0.85, 1, True, np.float32(0.85), torch.tensor(0.85)):
        out = normalize_reward(reward, batch_size=1)
        assert out.shape == (1,) and out.dtype == torch.float32
        assert out.item() == pytest.approx(float(reward))


@pytest.mark.parametrize("reward", [
    torch.tensor([0.5, -1.0, 2.0]),
    torch.tensor([[0.5], [-1.0], [2.0]]),
    torch.tensor([[0.5, -1.0, 2.0]]),
    [0.5, -1.0, 2.0],
    np.array([[0.5], [-1.0], [2.0]]),
])
def test_rewards_of_shape_b_b1_or_1b_become_shape_b(reward):
    out = normalize_reward(reward, batch_size=3)
    assert out.dtype == torch.float32
    assert out.tolist() == [0.5, -1.0, 2.0]


def test_integer_and_bool_rewards_become_float():
    assert normalize_reward(torch.tensor([1, 0]), 2).tolist() == [1.0, 0.0]
    assert normalize_reward(torch.tensor([True, False]), 2).dtype == torch.float32


def test_a_scalar_reward_for_several_rows_is_an_error_naming_the_expected_shape():
    with pytest.raises(VerlError) as err:
        normalize_reward(0.85, batch_size=4)
    assert "single number" in str(err.value) and "[B] with B=4" in str(err.value)
    with pytest.raises(VerlError, match=r"shape \[\].*\[B\] with B=4"):
        normalize_reward(torch.tensor(0.85), batch_size=4)


@pytest.mark.parametrize("reward, shape", [
    (torch.zeros(2, 3), "[2, 3]"),
    (torch.zeros(3), "[3]"),
    (torch.zeros(2, 1, 1), "[2, 1, 1]"),
])
def test_a_reward_of_the_wrong_shape_names_the_shape_received_and_expected(reward, shape):
    with pytest.raises(ValueError) as err:
        normalize_reward(reward, batch_size=2)
    assert f"shape {shape}" in str(err.value) and "[B] with B=2" in str(err.value)


def test_non_numeric_rewards_are_errors_naming_what_was_received():
    with pytest.raises(VerlError, match="got str"):
        normalize_reward("0.5", 1)
    with pytest.raises(VerlError, match="hold numbers"):
        normalize_reward(["good", "bad"], 2)


# ----------------------------------------------------------------------------- context length
def test_prompt_plus_response_longer_than_the_context_names_lengths_limit_and_fixes(tiny_model_dir):
    config = AutoConfig.from_pretrained(tiny_model_dir)
    limit = config.max_position_embeddings
    check_context_length(config, limit - 64, 64)  # exactly fits
    with pytest.raises(ValueError) as err:
        check_context_length(config, limit, 64)
    message = str(err.value)
    assert isinstance(err.value, VerlError)
    assert f"prompt {limit} + response 64 = {limit + 64} tokens" in message
    assert f"at most {limit} (max_position_embeddings" in message
    for key in ("data.truncation", "data.max_prompt_length", "data.max_response_length"):
        assert key in message


def test_a_response_as_long_as_the_context_is_told_to_shorten_the_response_not_the_prompt():
    with pytest.raises(VerlError) as err:
        check_context_length(GPT2Config(n_positions=256), 32, 300)
    assert "Lower data.max_response_length (to 224 or less with the current prompt length)" in str(err.value)
    assert "to 0 or less" not in str(err.value)  # what it advised before: a prompt of no tokens
    with pytest.raises(VerlError, match=r"Lower data\.max_prompt_length \(to 192 or less with the current response "
                                        r"length\) and/or data\.max_response_length"):
        check_context_length(GPT2Config(n_positions=256), 200, 64)


def test_context_length_check_reads_other_architectures_and_custom_keys():
    with pytest.raises(VerlError, match="at most 128") as err:
        check_context_length(GPT2Config(n_positions=128), 100, 100, truncation_key="trunc",
                             max_prompt_key="max_len")
    assert "trunc=left" in str(err.value) and "max_len" in str(err.value)
    check_context_length(GPT2Config(n_positions=128), 100, None)


def test_a_model_config_without_a_stated_context_length_is_not_checked():
    check_context_length(PretrainedConfig(), 10**6, 10**6)


# ------------------------------------------------------------------------------ out of memory
def cuda_oom():
    return torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total)")


def test_oom_hint_explains_out_of_memory_errors_and_ignores_others():
    keys = dict(micro_batch_keys=["x.micro"], offload_keys=["x.offload"])
    for exc in (cuda_oom(), RuntimeError("CUDA error: out of memory")):
        error = oom_hint(exc, role_name="critic", **keys)
        assert isinstance(error, VerlError)
        assert "critic ran out of device memory" in str(error)
        assert "x.offload=true" in str(error) and "a smaller x.micro" in str(error)
    assert "Tried to allocate 2.00 GiB" in str(oom_hint(cuda_oom(), **keys))
    assert oom_hint(RuntimeError("shape mismatch"), **keys) is None
    assert oom_hint(ValueError("out of memory"), **keys) is None


def test_explain_oom_chains_the_original_and_lets_other_errors_pass_unchanged():
    original = cuda_oom()
    with pytest.raises(VerlError) as err:
        with explain_oom("critic", dict(micro_batch_keys=["m"], offload_keys=["o"])):
            raise original
    assert err.value.__cause__ is original
    other = RuntimeError("Expected all tensors to be on the same device")
    with pytest.raises(RuntimeError) as err:
        with explain_oom("critic"):
            raise other
    assert err.value is other


def prompts():
    return Batch({"input_ids": torch.zeros(2, 3, dtype=torch.long)})


class OutOfMemoryWorker:
    """Stands in for a worker whose forward pass runs out of GPU memory."""

    def generate_sequences(self, batch):
        raise cuda_oom()

    def compute_log_prob(self, batch):
        raise RuntimeError("a bug that is not about memory")


def test_worker_group_turns_a_worker_oom_into_an_error_naming_role_and_settings():
    group = LocalWorkerGroup(OutOfMemoryWorker(), "actor_rollout_ref")
    with pytest.raises(VerlError) as err:
        group.run("generate_sequences", prompts())
    message = str(err.value)
    assert "actor_rollout_ref.generate_sequences" in message
    for expected in ("actor_rollout_ref.actor.fsdp_config.param_offload=true",
                     "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
                     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                     "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                     "data.train_batch_size",
                     "actor_rollout_ref.model.enable_gradient_checkpointing=true",
                     "actor_rollout_ref.rollout.gpu_memory_utilization"):
        assert expected in message
    assert isinstance(err.value.__cause__, torch.cuda.OutOfMemoryError)
    with pytest.raises(RuntimeError, match="not about memory"):
        group.run("compute_log_prob", prompts())


def test_critic_group_oom_lists_the_critic_settings():
    with pytest.raises(VerlError) as err:
        LocalWorkerGroup(OutOfMemoryWorker(), "critic").run("generate_sequences", prompts())
    assert "critic.fsdp_config.param_offload=true" in str(err.value)
    assert "critic.ppo_micro_batch_size_per_gpu" in str(err.value)
