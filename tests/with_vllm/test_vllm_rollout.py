"""The vLLM rollout for real: vLLM's CPU build (``bash scripts/setup.sh --vllm`` makes ``.venv-vllm``).

These tests import vLLM, so they run in that environment; the main suite runs them there through
tests/integration/test_vllm_env.py. Each compares vLLM with the parts of verl that do not use it:
the Hugging Face engine's greedy tokens, and the actor's own forward pass for log-probs, before and
after the actor's weights change and are synced into the engine.
"""

import dataclasses

import pytest
import torch

vllm = pytest.importorskip("vllm")

from verl.config import TrainerConfig  # noqa: E402
from verl.data.collate import collate_prompts  # noqa: E402
from verl.models.tiny import make_tiny_model_folder  # noqa: E402
from verl.protocol import Batch  # noqa: E402
from verl.rollout import HFRollout, SamplingParams  # noqa: E402
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker  # noqa: E402

EOS = 2
MAX_NEW = 12
TEXTS = ("12+34=", "5+6=", "99+1=", "say 7:", "7*8=", "hello")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # Hidden 128 over 4 heads: head size 32, which vLLM's CPU attention supports (16 it does not).
    return make_tiny_model_folder(tmp_path_factory.mktemp("tiny-qwen2-vllm"), num_layers=2, hidden_size=128,
                                  intermediate_size=256, seed=3)


def _config(model_dir, **rollout):
    return TrainerConfig(data=dict(max_prompt_length=16, max_response_length=MAX_NEW), trainer=dict(device="cpu"),
                         actor_rollout_ref=dict(model=dict(path=str(model_dir)),
                                                rollout=dict(name="vllm", n=3, **rollout),
                                                actor=dict(ppo_mini_batch_size=2, optim=dict(lr=1e-2))))


@pytest.fixture(scope="module")
def worker(model_dir):
    worker = ActorRolloutRefWorker(_config(model_dir, max_num_seqs=32).actor_rollout_ref, with_ref=False)
    with torch.no_grad():
        # Sharper logits than a random init's (greedy ties would make token parity a coin toss), and
        # an EOS likely enough that some responses stop early and some run to the limit.
        for p in worker.actor_model.parameters():
            p.mul_(4.0)
        worker.actor_model.get_output_embeddings().weight[EOS] *= 3
    worker.sync_rollout_weights()
    return worker


def _prompts(tokenizer):
    items = [dict(input_ids=tokenizer(t)["input_ids"], raw_prompt=t, data_source="test", ground_truth="0",
                  extra_info={}, index=i) for i, t in enumerate(TEXTS)]
    return collate_prompts(items, tokenizer.pad_token_id)


def _hf_greedy(worker):
    """The Hugging Face engine on an unwrapped copy of the actor's current weights."""
    from verl.distributed.fsdp import unsharded

    with unsharded(worker.actor_model) as model:
        hf = HFRollout(model, worker.tokenizer, seed=0)
        return hf.generate(_prompts(worker.tokenizer), SamplingParams(max_new_tokens=MAX_NEW, n=1, do_sample=False))


def _sampled(worker, **changes):
    params = dataclasses.replace(worker.sampling_params(), logprobs=True, **changes)
    out = worker.generate_sequences(_prompts(worker.tokenizer), params)
    return out, out.union(worker.compute_log_prob(out))["old_log_probs"]


def test_the_engine_runs_on_the_cpu_with_the_rollout_settings(worker):
    engine = worker.rollout
    assert engine.name == "vllm" and not engine.on_gpu
    cfg = engine.llm.llm_engine.vllm_config
    assert str(cfg.model_config.dtype) == "torch.float32", "dtype=auto follows the fp32 actor on a CPU"
    assert cfg.scheduler_config.max_num_seqs == 32
    assert cfg.model_config.max_model_len == 16 + MAX_NEW
    assert cfg.cache_config.kv_cache_memory_bytes == 64 << 20  # the small model's need, raised to the floor
    assert torch.get_num_threads() == 1, "the trainer's thread setting survives the engine"


def test_greedy_tokens_equal_the_hugging_face_engine(worker):
    ours = worker.generate_sequences(_prompts(worker.tokenizer),
                                     dataclasses.replace(worker.sampling_params(), n=1, do_sample=False))
    ref = _hf_greedy(worker)
    assert torch.equal(ours["responses"], ref["responses"])
    assert torch.equal(ours["response_mask"], ref["response_mask"])
    lengths = ours["response_mask"].sum(-1)
    assert lengths.min() < MAX_NEW and lengths.max() == MAX_NEW, "want EOS-stopped and full-length responses"
    stopped = lengths < MAX_NEW
    last = ours["responses"][stopped].gather(1, (lengths[stopped] - 1).unsqueeze(1)).squeeze(1)
    assert (last == EOS).all(), "a stopping EOS is kept in the response"


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_log_probs_equal_the_actors(worker, temperature):
    out, actor = _sampled(worker, temperature=temperature)
    assert out["responses"].shape[0] == len(TEXTS) * 3, "n samples per prompt"
    mask = out["response_mask"].bool()
    torch.testing.assert_close(out["rollout_log_probs"][mask], actor[mask], atol=1e-4, rtol=0)
    assert (out["rollout_log_probs"][~mask] == 0).all()


def test_samples_follow_the_row_seeds(worker):
    prompts = _prompts(worker.tokenizer)
    params = worker.sampling_params()

    def draw(seeds):
        return worker.generate_sequences(prompts.union(Batch({"rollout_seed": torch.tensor(seeds)})),
                                         params)["responses"]

    first, again, other = draw([11, 12, 13, 14, 15, 16]), draw([11, 12, 13, 14, 15, 16]), draw([21, 12, 13, 14, 15, 16])
    assert torch.equal(first, again), "same prompts and seeds, same samples"
    samples = first.view(len(TEXTS), 3, -1)
    assert any(not torch.equal(s[0], s[1]) for s in samples), "the n samples of a prompt differ"
    width = min(first.shape[1], other.shape[1])
    assert not torch.equal(first[:3, :width], other[:3, :width]), "a new seed, new samples"
    assert torch.equal(first[3:, :width], other[3:, :width]), "a row's samples do not depend on the other rows"


def test_parity_holds_after_an_update_is_synced(worker):
    before = _hf_greedy(worker)["responses"]
    out, _ = _sampled(worker)
    out = out.union(worker.compute_log_prob(out))
    batch = out.union(type(out)({"advantages": torch.randn_like(out["response_mask"], dtype=torch.float32)}))
    worker.update_actor(batch)  # syncs the new weights into vLLM
    after = _hf_greedy(worker)["responses"]
    assert not torch.equal(before, after), "the update must change what greedy decoding produces"
    ours = worker.generate_sequences(_prompts(worker.tokenizer),
                                     dataclasses.replace(worker.sampling_params(), n=1, do_sample=False))
    assert torch.equal(ours["responses"], after)
    sampled, actor = _sampled(worker)
    mask = sampled["response_mask"].bool()
    torch.testing.assert_close(sampled["rollout_log_probs"][mask], actor[mask], atol=1e-4, rtol=0)


def test_engine_kwargs_reach_vllm(model_dir):
    cfg = _config(model_dir, engine_kwargs={"vllm": {"max_num_seqs": 8}}, enable_prefix_caching=False)
    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, with_ref=False)
    vcfg = worker.rollout.llm.llm_engine.vllm_config
    assert vcfg.scheduler_config.max_num_seqs == 8, "engine_kwargs.vllm override the rollout keys"
    assert not vcfg.cache_config.enable_prefix_caching
    out = worker.generate_sequences(_prompts(worker.tokenizer))
    assert out["responses"].shape[0] == len(TEXTS) * 3


def test_this_cpu_build_cannot_serve_a_qwen2_vl_model_which_is_why_vision_runs_refuse_vllm(tmp_path):
    """Tried for real (issue 27): vLLM's model code for Qwen2-VL imports transformers' image processor, which
    needs torchvision, and no CPU torchvision matches this torch. When this test fails, vLLM can serve the
    model here: lift the refusal in verl/trainer/ppo/vision_run.py and test the engine's log-probs instead."""
    import importlib.util

    from verl.models.tiny_vision import make_tiny_vl_model_folder

    path = make_tiny_vl_model_folder(tmp_path / "tiny-qwen2-vl", arch="qwen2_vl")
    assert importlib.util.find_spec("torchvision") is None
    with pytest.raises(Exception, match=r"Qwen2VLForConditionalGeneration.*failed to be inspected"):
        vllm.LLM(model=str(path), dtype="float32", max_model_len=256, enforce_eager=True)


class _SwapAfter:
    """New weights offered once, after ``polls`` questions (the rollout asks once before it starts and once
    after every engine step): ``weights`` as version 1."""

    def __init__(self, engine, polls: int, weights):
        self.engine, self.polls, self.weights, self.version, self.asked = engine, polls, weights, 0, 0

    def pending(self) -> bool:
        self.asked += 1
        return self.weights is not None and self.asked > self.polls

    def apply(self) -> None:
        self.engine.sync_weights(self.weights)
        self.weights, self.version = None, 1


def _left_padded(rows, pad):
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    return ids, torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])


@pytest.mark.parametrize("do_sample", [False, True])
def test_new_weights_midway_are_taken_and_the_rows_go_on_from_the_tokens_they_drew(worker, do_sample):
    """Partial rollouts on vLLM: every token before the swap is the unpaused generation's (same seeds), and
    a greedy row's rest is what the new weights draw after its prompt and those tokens, log-probs included."""
    engine, pad = worker.rollout, worker.tokenizer.pad_token_id
    worker.sync_rollout_weights()
    prompts = _prompts(worker.tokenizer)
    ids, mask = prompts["input_ids"], prompts["attention_mask"]
    params = dataclasses.replace(worker.sampling_params(), n=1, do_sample=do_sample, logprobs=True)
    seeds = torch.arange(100, 100 + len(TEXTS))
    before, before_lp = engine.generate_responses(ids, mask, params, seeds)
    generator = torch.Generator().manual_seed(0)
    new = {name: t + 0.5 * torch.randn(t.shape, generator=generator) if t.dim() == 2 else t.clone()
           for name, t in worker.rollout_weights().items()}
    drawn = 3  # engine steps before the swap: the first draws every row's first token
    swap = _SwapAfter(engine, drawn, new)
    try:
        out, out_lp, last = engine.generate_resumable(ids, mask, params, seeds, swap)
        assert swap.version == 1, "the swap was taken midway"
        went_on = last == 1
        assert went_on.any()
        for row in range(len(TEXTS)):
            held = min(drawn, out.shape[1])
            assert torch.equal(out[row, :held], before[row, :held]), "tokens before the swap are the unpaused ones"
            torch.testing.assert_close(out_lp[row, :held], before_lp[row, :held], atol=1e-5, rtol=0)
            assert went_on[row] == (EOS not in before[row, :drawn].tolist()), "rows that ended before it keep version 0"
        if not do_sample:
            rest = [prompts_row + before[row, :drawn].tolist()
                    for row, prompts_row in enumerate(engine._prompt_ids(ids, mask)) if went_on[row]]
            rest_ids, rest_mask = _left_padded(rest, pad)
            tail, tail_lp = engine.generate_responses(rest_ids, rest_mask,
                                                      dataclasses.replace(params, max_new_tokens=MAX_NEW - drawn),
                                                      seeds[went_on])
            width = tail.shape[1]
            assert torch.equal(out[went_on, drawn:drawn + width], tail), "the rest is the new weights' own"
            torch.testing.assert_close(out_lp[went_on, drawn:drawn + width], tail_lp, atol=1e-5, rtol=0)
            full = [torch.nn.functional.pad(t, (0, MAX_NEW - t.shape[1]), value=pad) for t in (out, before)]
            assert not torch.equal(full[0][went_on], full[1][went_on]), "the new weights drew otherwise"
    finally:
        worker.sync_rollout_weights()


def test_the_asynchronous_rollout_builds_vllm_from_the_folder_without_a_torch_copy(model_dir):
    """The rollout process of an asynchronous run (RolloutWorker) reads only the folder's config to set vLLM up:
    no torch model is held beside the engine (at 7B that would be 28 GB of host memory for nothing)."""
    from verl.models.loading import load_causal_lm, load_tokenizer
    from verl.workers.rollout_worker import RolloutWorker

    # (Not closed here: shutting an in-process engine down tears down vLLM's parallel state, which the
    # module's other engine shares; it is closed at exit.)
    worker = RolloutWorker(_config(model_dir, max_num_seqs=8).actor_rollout_ref, device="cpu",
                           max_response_length=MAX_NEW)
    assert worker.rollout.name == "vllm" and worker.model_config.model_type == "qwen2"
    held = [*vars(worker).values(), *vars(worker.rollout).values()]
    assert not any(isinstance(v, torch.nn.Module) for v in held), "no torch copy of the policy"
    greedy = SamplingParams(max_new_tokens=MAX_NEW, n=1, do_sample=False)
    out = worker.generate_sequences(_prompts(worker.tokenizer), greedy)
    folder = HFRollout(load_causal_lm(str(model_dir)), load_tokenizer(str(model_dir)), seed=0)
    assert torch.equal(out["responses"], folder.generate(_prompts(worker.tokenizer), greedy)["responses"])
    assert (out["policy_version_first"] == -1).all(), "the folder's weights, before any sync"


def test_a_partial_rollout_stopped_by_an_error_leaves_no_request_in_the_engine(worker):
    """An error between two engine steps (say, reading the weights that arrived) aborts the open requests: the
    next generation gets its own rows only."""

    class Failing:
        version, asked = 0, 0

        def pending(self):
            self.asked += 1
            if self.asked > 2:
                raise RuntimeError("the weights could not be read")
            return False

    engine = worker.rollout
    prompts = _prompts(worker.tokenizer)
    ids, mask = prompts["input_ids"], prompts["attention_mask"]
    params = dataclasses.replace(worker.sampling_params(), n=1, do_sample=False)
    seeds = torch.arange(len(TEXTS))
    expected, _ = engine.generate_responses(ids, mask, params, seeds)
    with pytest.raises(RuntimeError, match="could not be read"):
        engine.generate_resumable(ids, mask, params, seeds, Failing())
    assert not engine.llm.llm_engine.has_unfinished_requests()
    assert torch.equal(engine.generate_responses(ids, mask, params, seeds)[0], expected)
