"""The vLLM rollout's error paths and sizing rules, in the main environment (which has no vLLM).

The engine itself is tested for real in .venv-vllm (tests/with_vllm, run by
tests/integration/test_vllm_env.py). Here: asking for it where vLLM is missing names the fix, an
old vLLM without processed log-probs is refused (a minimal stand-in plays that vLLM: an error path
only), and the dtype and CPU KV-cache rules against numbers worked out by hand.
"""

import sys
import types

import pytest
import torch

from verl.config import TrainerConfig
from verl.errors import VerlError
from verl.models.tiny import build_tiny_config
from verl.protocol import Batch
from verl.rollout import SamplingParams
from verl.rollout import vllm as vllm_rollout
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker


def test_asking_for_vllm_without_it_names_the_fix(tiny_model_dir):
    if "vllm" in sys.modules or __import__("importlib").util.find_spec("vllm"):
        pytest.skip("vLLM is installed here")
    cfg = TrainerConfig(trainer=dict(device="cpu"),
                        actor_rollout_ref=dict(model=dict(path=str(tiny_model_dir)), rollout=dict(name="vllm")))
    with pytest.raises(VerlError, match=r"scripts/setup.sh --vllm.*rollout.name=native"):
        ActorRolloutRefWorker(cfg.actor_rollout_ref, with_ref=False)


def test_dtype_auto_is_bfloat16_on_a_gpu_and_the_actors_on_a_cpu():
    assert vllm_rollout.resolve_dtype("auto", torch.float32, on_gpu=True) == "bfloat16"
    assert vllm_rollout.resolve_dtype("auto", torch.float32, on_gpu=False) == "float32"
    assert vllm_rollout.resolve_dtype("auto", torch.bfloat16, on_gpu=False) == "bfloat16"
    assert vllm_rollout.resolve_dtype("float16", torch.float32, on_gpu=False) == "float16"


def test_cpu_kv_cache_is_sized_for_the_rollout():
    # 8 layers, 8 heads of 64 (hidden 512), 2 KV heads, fp32: 2 x 8 x 2 x 64 x 4 = 8192 bytes a token.
    config = build_tiny_config(259, num_layers=8, hidden_size=512, num_heads=8, num_kv_heads=2)
    assert vllm_rollout.cpu_kv_cache_bytes(config, 256, 1024, "float32") == 8192 * 256 * 1024  # 2 GiB
    assert vllm_rollout.cpu_kv_cache_bytes(config, 16, 64, "float32") == 64 << 20  # 8 MiB -> the 64 MiB floor
    assert vllm_rollout.cpu_kv_cache_bytes(config, 1024, 1024, "float32") == 4096 << 20  # 8 GiB -> the 4 GiB cap
    assert vllm_rollout.cpu_kv_cache_bytes(config, 256, 1024, "bfloat16") == 4096 * 256 * 1024


def test_an_old_vllm_without_processed_log_probs_refuses_sampled_log_probs(monkeypatch, tiny_model_dir):
    fake = types.ModuleType("vllm")  # plays a vLLM before 0.10.2: LLM() knows no logprobs_mode

    class LLM:
        def __init__(self, **kwargs):
            if "logprobs_mode" in kwargs:
                raise TypeError("LLM.__init__() got an unexpected keyword argument 'logprobs_mode'")
            self.llm_engine = types.SimpleNamespace()

    fake.LLM = LLM
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setattr(vllm_rollout, "check_vllm_available", lambda: None)
    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_OMP_THREADS_BIND"):  # set by the engine: restored after
        monkeypatch.setenv(name, "")
    cfg = TrainerConfig(actor_rollout_ref=dict(rollout=dict(name="vllm"))).actor_rollout_ref.rollout
    from verl.models.loading import load_causal_lm, load_tokenizer

    model = load_causal_lm(str(tiny_model_dir))
    engine = vllm_rollout.VLLMRollout(str(tiny_model_dir), load_tokenizer(str(tiny_model_dir)), eos_token_id=2,
                                      model_config=model.config, config=cfg)
    assert engine.processed_logprobs is False
    prompts = Batch({"input_ids": torch.tensor([[5, 6]]), "attention_mask": torch.ones(1, 2, dtype=torch.long),
                     "position_ids": torch.arange(2).unsqueeze(0)}, {"uid": ["0"]})
    with pytest.raises(VerlError, match=r"upgrade vLLM.*calculate_log_probs=false"):
        engine.generate(prompts, SamplingParams(max_new_tokens=2, logprobs=True))
