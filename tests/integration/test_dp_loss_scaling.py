"""Data parallelism with DIFFERENT data on each rank gives the update of one big batch.

Two CPU ranks (torchrun, gloo) each hold their own share of an 8-sample batch: rank 0's responses
have 1-2 valid tokens, rank 1's 6-8. With losses normalised by each rank's own token count and
gradients averaged over ranks, a token of rank 0 would weigh several times a token of rank 1
(mean of per-rank means != global mean). For every ``loss_agg_mode``, the actor (policy, entropy
and KL terms) and the critic must end with the weights, grad norm and loss of one process
updating on the whole batch; also when the ranks hold different numbers of samples.
"""

import textwrap
from pathlib import Path

import pytest
import torch

from verl.algorithms.utils import AGG_MODES
from verl.config import TrainerConfig
from verl.data.collate import collate_prompts
from verl.distributed.fsdp import full_state_dict, parallelize
from verl.models.loading import load_causal_lm
from verl.models.logprob import compute_response_logprobs
from verl.models.value_model import ValueModel
from verl.protocol import Batch
from verl.rollout import assemble_rollout
from verl.workers.actor import Actor
from verl.workers.critic import Critic

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PAD, EOS, RESPONSE_LENGTH = 0, 2, 8
# Rows 0-3 have 1-2 valid tokens (EOS included), rows 4-7 have 6-8.
RESPONSES = [[EOS], [70, EOS], [EOS], [71, EOS],
             [50, 51, 52, 53, 54, EOS], [60, 61, 62, 63, 64, 65, 66, EOS], [80, 81, 82, 83, 84, 85, 86, 87],
             [90, 91, 92, 93, 94, 95, EOS]]
PER_RANK_MINI_BATCH = 2  # samples per mini-batch on each rank: two ranks make mini-batches of 4
# Rows each rank holds, and its micro-batch size. "uneven": rank 0 holds 3 samples, rank 1 four, so
# the second mini-batch is 1 + 2 samples (allowed: both ranks still run 2 mini-batches of 1 micro-batch).
LAYOUTS = {"even": ([0, 1, 2, 3], [4, 5, 6, 7], 1), "uneven": ([0, 1, 2], [4, 5, 6, 7], None)}
ROLES = ("actor", "critic")

RANK_SCRIPT = textwrap.dedent('''
    import sys
    import torch
    torch.set_num_threads(1)
    import torch.distributed as dist
    from tests.integration.test_dp_loss_scaling import AGG_MODES, LAYOUTS, PER_RANK_MINI_BATCH, ROLES, update
    from verl.distributed.process_group import ensure_process_group
    from verl.errors import VerlError

    model_dir, out = sys.argv[1], sys.argv[2]
    batch = torch.load(f"{out}/batch.pt", weights_only=False)
    ensure_process_group()
    rank = dist.get_rank()
    results = {}
    for layout, ranks_rows in LAYOUTS.items():
        rows, micro = ranks_rows[rank], ranks_rows[2]
        for role in ROLES:
            for mode in AGG_MODES:
                results[role, mode, layout] = update(role, mode, model_dir, batch.index(rows), PER_RANK_MINI_BATCH,
                                                     micro)
    # 3 samples in micro-batches of 1 are [2, 1] micro-batches per mini-batch, 4 are [2, 2]: FSDP would
    # hang in the extra forward, so both ranks must refuse up front.
    try:
        update("actor", "token-mean", model_dir, batch.index(LAYOUTS["uneven"][rank]), PER_RANK_MINI_BATCH, 1)
    except VerlError as error:
        results["mismatch"] = str(error)
    torch.save(results, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()
''')


def role_config(mode: str) -> TrainerConfig:
    # eps=1 makes AdamW's step about lr * gradient (SGD-like) instead of lr * sign(gradient), so the
    # weights show any error in the gradient's scale or direction, not only flipped signs; and no
    # clipping, which would rescale a gradient of the wrong size to the right one.
    role = dict(ppo_epochs=1, shuffle=False, loss_agg_mode=mode, grad_clip=1e6, optim=dict(lr=0.1, eps=1.0))
    return TrainerConfig(
        data=dict(max_response_length=RESPONSE_LENGTH),
        actor_rollout_ref=dict(actor=dict(entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1, **role)),
        critic=role)


def update(role: str, mode: str, model_dir, batch: Batch, samples_per_mini_batch: int, micro_batch_size):
    """One update of a fresh actor or critic; its full weights and metrics."""
    cfg = role_config(mode)
    model = load_causal_lm(str(model_dir))
    common = dict(samples_per_mini_batch=samples_per_mini_batch, total_steps=1, norm_len=RESPONSE_LENGTH)
    if role == "actor":
        actor_cfg = cfg.actor_rollout_ref.actor
        worker = Actor(parallelize(model, actor_cfg.fsdp_config, device="cpu"), actor_cfg, torch.device("cpu"),
                       **common)
    else:
        worker = Critic(parallelize(ValueModel(model), cfg.critic.fsdp_config, device="cpu"), cfg.critic,
                        torch.device("cpu"), ppo_epochs=1, **common)
    metrics = worker.update(batch, micro_batch_size=micro_batch_size)
    return full_state_dict(worker.model, every_rank=True), metrics  # gathering is a collective with W ranks


def one_process_rows(rows0: list[int], rows1: list[int]) -> list[int]:
    """The rows in the order whose mini-batches of 2 x PER_RANK_MINI_BATCH are the union of the
    ranks' mini-batches (each rank splits its rows into consecutive mini-batches)."""
    out = []
    for start in range(0, max(len(rows0), len(rows1)), PER_RANK_MINI_BATCH):
        out += rows0[start:start + PER_RANK_MINI_BATCH] + rows1[start:start + PER_RANK_MINI_BATCH]
    return out


def make_batch(model_dir) -> Batch:
    torch.manual_seed(0)
    prompts = collate_prompts([dict(input_ids=[10 + i, 20 + i, 30][: 1 + i % 3], raw_prompt="", data_source="t",
                                    ground_truth="", extra_info={}, index=i) for i in range(len(RESPONSES))], PAD)
    responses = torch.tensor([r + [PAD] * (RESPONSE_LENGTH - len(r)) for r in RESPONSES])
    batch = assemble_rollout(prompts, responses, RESPONSE_LENGTH, [EOS], PAD)
    mask = batch["response_mask"]
    assert mask.sum(-1).tolist() == [1, 2, 1, 2, 6, 8, 8, 7]
    with torch.no_grad():
        old, _ = compute_response_logprobs(load_causal_lm(str(model_dir)), batch["input_ids"], batch["attention_mask"],
                                           batch["position_ids"], batch["responses"])
    batch["old_log_probs"] = (old + 0.05 * torch.randn_like(old)) * mask
    batch["ref_log_prob"] = (old + 0.1 * torch.randn_like(old)) * mask
    batch["advantages"] = torch.randn(len(RESPONSES), RESPONSE_LENGTH) * mask
    batch["values"] = 0.1 * torch.randn(len(RESPONSES), RESPONSE_LENGTH) * mask
    batch["returns"] = torch.randn(len(RESPONSES), RESPONSE_LENGTH) * mask
    return batch


def test_two_ranks_with_different_data_update_like_one_process_on_the_whole_batch(tiny_model_dir, tmp_path):
    batch = make_batch(tiny_model_dir)
    torch.save(batch, tmp_path / "batch.pt")
    from helpers import run_torchrun  # here, not at the top: the rank processes import this module

    run_torchrun(RANK_SCRIPT, tiny_model_dir, tmp_path, tmp_path=tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]

    initial = {"actor": load_causal_lm(str(tiny_model_dir)).state_dict(),
               "critic": ValueModel(load_causal_lm(str(tiny_model_dir))).state_dict()}
    for layout, (rows0, rows1, _) in LAYOUTS.items():
        whole = batch.index(one_process_rows(rows0, rows1))
        for role in ROLES:
            for mode in AGG_MODES:
                # This process is a one-rank group: the reference, with no micro-batching.
                weights, metrics = update(role, mode, tiny_model_dir, whole, 2 * PER_RANK_MINI_BATCH, None)
                case = f"{role} {mode} {layout}"
                assert max((weights[k] - v).abs().max() for k, v in initial[role].items()) > 1e-3, case  # it moved
                for rank, results in enumerate(ranks):
                    rank_weights, rank_metrics = results[role, mode, layout]
                    assert rank_weights.keys() == weights.keys()
                    for key, value in weights.items():
                        torch.testing.assert_close(rank_weights[key], value, atol=1e-6, rtol=0,
                                                   msg=f"{case} rank {rank}: {key}")
                    loss_keys = [k for k in metrics if k.endswith(("_loss", "grad_norm"))]
                    assert len(loss_keys) == (4 if role == "actor" else 2)
                    for key in loss_keys:  # summed over ranks: the loss of the whole batch
                        assert rank_metrics[key] == pytest.approx(metrics[key], rel=1e-5, abs=1e-7), f"{case} {key}"

    for rank, results in enumerate(ranks):
        assert "rank 0: 3 samples -> [2, 1]; rank 1: 4 samples -> [2, 2]" in results["mismatch"], rank
