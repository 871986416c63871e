"""The vLLM rollout adapter against a stand-in for vLLM's offline API.

vLLM and a GPU are on no machine this project tests on, so these tests check the adapter's own
work with a small stand-in module playing ``vllm.LLM``: what it asks the engine for (token-id
prompts without padding, one request per row, stop ids, log-probs of the processed distribution),
how it turns the engine's outputs into the rollout layout, and that weight syncs reach the
served model through ``collective_rpc`` and the worker extension. The stand-in mimics the
documented API shapes (``RequestOutput.outputs[0].token_ids / logprobs / stop_reason``).
"""

import sys
import types
from dataclasses import dataclass, field

import pytest
import torch

from verl.errors import VerlError
from verl.models.loading import load_causal_lm, load_tokenizer
from verl.protocol import Batch
from verl.rollout import SamplingParams, build_rollout
from verl.rollout import vllm as vllm_rollout
from verl.rollout.vllm_worker import VerlWeightLoader


@dataclass
class Logprob:
    logprob: float


@dataclass
class Completion:
    token_ids: list
    logprobs: list | None
    stop_reason: int | None


@dataclass
class RequestOutput:
    outputs: list


@dataclass
class FakeSamplingParams:
    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: list = field(default_factory=list)
    logprobs: int | None = None
    detokenize: bool = True
    seed: int | None = None


def make_fake_vllm(script, *, knows_logprobs_mode=True):
    """A module with ``LLM`` and ``SamplingParams``; ``script(prompt_ids) -> (tokens, stop_reason)``."""
    module = types.ModuleType("vllm")
    module.SamplingParams = FakeSamplingParams

    class LLM:
        instances = []

        def __init__(self, **kwargs):
            if "logprobs_mode" in kwargs and not knows_logprobs_mode:
                raise TypeError("LLM.__init__() got an unexpected keyword argument 'logprobs_mode'")
            self.kwargs = kwargs
            self.requests, self.params, self.prefix_resets = [], [], 0
            # The served copy, loaded from the folder as vLLM would; load_weights takes HF names.
            served = load_causal_lm(kwargs["model"])
            served.load_weights = lambda weights: served.load_state_dict(dict(weights))
            self.worker = type("Worker", (VerlWeightLoader,), {})()
            self.worker.model_runner = types.SimpleNamespace(model=served)
            LLM.instances.append(self)

        def generate(self, requests, params, use_tqdm=True):
            # vLLM takes one SamplingParams for all requests or a list with one per request.
            params = params if isinstance(params, list) else [params] * len(requests)
            assert len(params) == len(requests)
            self.requests.append(requests)
            self.params.append(params)
            outs = []
            for request, params in zip(requests, params):
                tokens, stop = script(request["prompt_token_ids"])
                logprobs = [{t: Logprob(-0.1 * (i + 1)), 99: Logprob(-9.0)} for i, t in enumerate(tokens)] \
                    if params.logprobs is not None else None
                outs.append(RequestOutput([Completion(tokens, logprobs, stop)]))
            return outs

        def collective_rpc(self, method, args=()):
            return [getattr(self.worker, method)(*args)]

        def reset_prefix_cache(self):
            self.prefix_resets += 1

    module.LLM = LLM
    return module


@pytest.fixture
def engine_env(monkeypatch):
    monkeypatch.setattr(vllm_rollout, "check_vllm_available", lambda: None)

    def install(script, **kw):
        fake = make_fake_vllm(script, **kw)
        monkeypatch.setitem(sys.modules, "vllm", fake)
        return fake
    return install


def rollout_config(**overrides):
    from verl.config import TrainerConfig

    cfg = TrainerConfig(actor_rollout_ref={"rollout": {"name": "vllm", "dtype": "bfloat16", "max_num_seqs": 32,
                                                       "gpu_memory_utilization": 0.9, **overrides}})
    return cfg.actor_rollout_ref.rollout


def build(tiny_model_dir, **kw):
    model, tokenizer = load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    engine = build_rollout("vllm", model, tokenizer, model_path=str(tiny_model_dir), rollout_config=rollout_config(),
                           max_model_len=64, seed=3, **kw)
    return engine, model, tokenizer


def prompts_batch(rows):
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)},
                 {"uid": [str(i) for i in range(len(rows))]})


def test_the_engine_is_built_from_the_folder_with_the_rollout_settings(engine_env, tiny_model_dir):
    fake = engine_env(lambda ids: ([5], None))
    engine, model, _ = build(tiny_model_dir)
    llm = fake.LLM.instances[-1]
    assert llm.kwargs == dict(model=str(tiny_model_dir), skip_tokenizer_init=True, dtype="bfloat16",
                              tensor_parallel_size=1, gpu_memory_utilization=0.9, max_num_seqs=32, max_model_len=64,
                              seed=3, trust_remote_code=False, worker_extension_cls=vllm_rollout.WORKER_EXTENSION,
                              logprobs_mode="processed_logprobs")
    assert engine.eos_token_ids == [model.generation_config.eos_token_id]
    assert llm.prefix_resets == 0  # the engine loads no weights itself: its owner syncs the actor's


def test_rows_become_unpadded_token_requests_and_outputs_the_rollout_layout(engine_env, tiny_model_dir):
    eos = load_causal_lm(str(tiny_model_dir)).generation_config.eos_token_id
    # row 0 stops on EOS (included by the engine), row 1 on a stop id it left out, row 2 runs out of tokens
    answers = {(10, 11, 12): ([40, 41, eos], eos), (20,): ([50], eos), (30, 31): ([60, 61, 62, 63], None)}
    fake = engine_env(lambda ids: answers[tuple(ids)])
    engine, _, _ = build(tiny_model_dir)
    params = SamplingParams(max_new_tokens=4, temperature=0.7, top_k=5, top_p=0.9, logprobs=True)
    out = engine.generate(prompts_batch([[10, 11, 12], [20], [30, 31]]), params)
    llm = fake.LLM.instances[-1]
    assert llm.requests[-1] == [{"prompt_token_ids": [10, 11, 12]}, {"prompt_token_ids": [20]},
                                {"prompt_token_ids": [30, 31]}]
    assert len({p.seed for p in llm.params[-1]}) == 3  # each request draws with its own seed
    sent = llm.params[-1][0]
    assert (sent.n, sent.max_tokens, sent.temperature, sent.top_k, sent.top_p) == (1, 4, 0.7, 5, 0.9)
    assert (sent.stop_token_ids, sent.logprobs, sent.detokenize) == ([eos], 0, False)
    pad = engine.pad_token_id
    assert out["responses"].tolist() == [[40, 41, eos, pad], [50, eos, pad, pad], [60, 61, 62, 63]]
    assert out["response_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    # the sampled token's log-prob at each step (-0.1, -0.2, ...); 0 for the appended stop id and padding
    expected = torch.tensor([[-0.1, -0.2, -0.3, 0], [-0.1, 0, 0, 0], [-0.1, -0.2, -0.3, -0.4]])
    assert torch.allclose(out["rollout_log_probs"], expected)
    assert out["prompts"].shape == (3, 3) and out["input_ids"].shape == (3, 7)


def test_greedy_requests_switch_every_filter_off(engine_env, tiny_model_dir):
    fake = engine_env(lambda ids: ([7], None))
    engine, _, _ = build(tiny_model_dir)
    engine.generate(prompts_batch([[3]]), SamplingParams(max_new_tokens=2, do_sample=False, top_k=9, top_p=0.5))
    sent = fake.LLM.instances[-1].params[-1][0]
    assert (sent.temperature, sent.top_k, sent.top_p, sent.logprobs, sent.seed) == (0.0, -1, 1.0, None, None)


def test_sync_weights_puts_the_actors_weights_into_the_served_model(engine_env, tiny_model_dir):
    fake = engine_env(lambda ids: ([7], None))
    engine, model, _ = build(tiny_model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    engine.sync_weights(model.state_dict())
    served = fake.LLM.instances[-1].worker.model_runner.model
    for (name, a), b in zip(model.state_dict().items(), served.state_dict().values()):
        assert torch.equal(a, b), name
    assert fake.LLM.instances[-1].prefix_resets == 1  # reset after the sync


def test_old_vllm_without_processed_logprobs_refuses_sampled_log_probs(engine_env, tiny_model_dir):
    engine_env(lambda ids: ([7], None), knows_logprobs_mode=False)
    engine, _, _ = build(tiny_model_dir)
    assert engine.processed_logprobs is False
    with pytest.raises(VerlError, match=r"upgrade vLLM.*calculate_log_probs=false"):
        engine.generate(prompts_batch([[3]]), SamplingParams(max_new_tokens=2, logprobs=True))
    engine.generate(prompts_batch([[3]]), SamplingParams(max_new_tokens=2))  # without log-probs it samples
