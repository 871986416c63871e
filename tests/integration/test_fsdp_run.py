"""FSDP2 across 2 CPU ranks (torchrun, gloo): the code path of one process shards for real.

Both ranks get the same batch: with loss counts over both ranks and gradients summed, the two
copies are one batch of every sample twice, whose gradient is that of one process on the batch, so
the 2-rank actor must end with the weights of the 1-rank actor. Ranks holding different data:
``test_dp_loss_scaling.py``.
"""

import textwrap
from pathlib import Path

import pytest
import torch

from verl.config import TrainerConfig
from verl.data.collate import collate_prompts
from verl.distributed.fsdp import full_state_dict, parallelize
from verl.models.loading import load_causal_lm
from verl.models.logprob import compute_response_logprobs
from verl.rollout import assemble_rollout
from verl.workers.actor import Actor

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PAD, EOS = 0, 2
PROMPT = [[10, 11, 12, 13]]
GENERATE = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=PAD)

RANK_SCRIPT = textwrap.dedent('''
    import sys
    import torch
    torch.set_num_threads(1)
    import torch.distributed as dist
    from tests.integration.test_fsdp_run import GENERATE, PROMPT, actor_config, make_actor
    from verl.distributed.fsdp import full_state_dict

    model_dir, out = sys.argv[1], sys.argv[2]
    batch = torch.load(f"{out}/batch.pt", weights_only=False)
    results = {}
    for fsdp_size in (-1, 1):
        actor = make_actor(model_dir, actor_config(fsdp_size))
        actor.update(batch)
        state = actor.state_dict()  # a collective: every rank gathers
        resumed = make_actor(model_dir, actor_config(fsdp_size))
        resumed.load_state_dict(state)
        actor.update(batch)
        resumed.update(batch)
        with torch.no_grad():
            generated = actor.model.generate(input_ids=torch.tensor(PROMPT), **GENERATE)
        embed = actor.model.model.embed_tokens.weight
        results[fsdp_size] = dict(
            world=dist.get_world_size(), mesh=tuple(embed.device_mesh.shape), local_rows=embed.to_local().shape[0],
            final=full_state_dict(actor.model), resumed=full_state_dict(resumed.model), generated=generated)
    if dist.get_rank() == 0:
        torch.save(results, f"{out}/rank0.pt")
    dist.destroy_process_group()
''')


def actor_config(fsdp_size: int = -1):
    actor = dict(ppo_epochs=1, shuffle=False, optim=dict(lr=1e-3), fsdp_config=dict(fsdp_size=fsdp_size))
    return TrainerConfig(actor_rollout_ref=dict(actor=actor)).actor_rollout_ref.actor


def make_actor(model_dir, cfg):
    model = parallelize(load_causal_lm(str(model_dir)), cfg.fsdp_config, device="cpu")
    return Actor(model, cfg, torch.device("cpu"), samples_per_mini_batch=4, total_steps=1)


def make_batch(model_dir):
    torch.manual_seed(0)
    prompts = collate_prompts([dict(input_ids=ids, raw_prompt="", data_source="t", ground_truth="", extra_info={},
                                    index=i) for i, ids in enumerate([[10, 11, 12], [20, 21], [30], [40, 41, 42]])],
                              PAD)
    responses = torch.tensor([[50, 51, 52, 53], [60, 61, 62, 63], [EOS, 0, 0, 0], [70, EOS, 0, 0]])
    batch = assemble_rollout(prompts, responses, 4, [EOS], PAD)
    with torch.no_grad():
        old, _ = compute_response_logprobs(load_causal_lm(str(model_dir)), batch["input_ids"], batch["attention_mask"],
                                           batch["position_ids"], batch["responses"])
    batch["old_log_probs"] = old + 0.05 * torch.randn_like(old)
    batch["advantages"] = torch.randn(4, 4) * batch["response_mask"]
    return batch


def test_two_ranks_shard_the_actor_and_end_with_the_weights_of_one_process(tiny_model_dir, tmp_path):
    batch = make_batch(tiny_model_dir)
    torch.save(batch, tmp_path / "batch.pt")
    from helpers import run_torchrun  # here, not at the top: the rank processes import this module

    run_torchrun(RANK_SCRIPT, tiny_model_dir, tmp_path, tmp_path=tmp_path)
    results = torch.load(tmp_path / "rank0.pt", weights_only=False)

    one = make_actor(tiny_model_dir, actor_config())  # this process: a one-rank group
    one.update(batch)
    one.update(batch)
    with torch.no_grad():
        generated = one.model.generate(input_ids=torch.tensor(PROMPT), **GENERATE)
    expected = {k: v.detach().clone() for k, v in full_state_dict(one.model).items()}
    vocab = expected["model.embed_tokens.weight"].shape[0]

    assert results[-1]["mesh"] == (2,) and results[-1]["local_rows"] == (vocab + 1) // 2  # sharded over 2 ranks
    assert results[1]["mesh"] == (2, 1) and results[1]["local_rows"] == vocab  # replicated x2, shards of 1
    for fsdp_size, result in results.items():
        assert result["world"] == 2
        assert result["final"].keys() == expected.keys()
        for key, value in expected.items():
            torch.testing.assert_close(result["final"][key], value, atol=1e-6, rtol=0, msg=f"{fsdp_size} {key}")
            assert torch.equal(result["resumed"][key], result["final"][key]), f"{fsdp_size} {key}"
        assert torch.equal(result["generated"], generated)
