"""Remove padding: log-prob, value and update passes on packed sequences equal the padded ones.

fp32 on the CPU, where transformers' sdpa/eager masks keep packed sequences apart by their
restarting position ids; models that cannot (OPT) are refused with the key named.
"""

import pytest
import torch

from verl.config import TrainerConfig
from verl.data.collate import collate_prompts
from verl.errors import VerlError
from verl.models.loading import load_causal_lm
from verl.models.logprob import compute_response_logprobs
from verl.models.tiny import make_tiny_model_folder
from verl.models.value_model import ValueModel
from verl.rollout import assemble_rollout
from verl.workers.actor import PolicyModel
from verl.workers.critic import Critic

CPU = torch.device("cpu")
PAD, EOS, RESPONSE_LENGTH = 0, 2, 6
RESPONSES = [[EOS], [70, 71, 72, 73, 74, 75], [70, EOS], [50, 51, 52, 53, EOS], [60, 61, 62, 63, 64, EOS]]


def make_batch():
    prompts = collate_prompts([dict(input_ids=[10 + i, 20 + i, 30, 31, 32][: 1 + (2 * i) % 5], raw_prompt="",
                                    data_source="t", ground_truth="", extra_info={}, index=i)
                               for i in range(len(RESPONSES))], PAD)
    responses = torch.tensor([r + [PAD] * (RESPONSE_LENGTH - len(r)) for r in RESPONSES])
    return assemble_rollout(prompts, responses, RESPONSE_LENGTH, [EOS], PAD)


def inputs(batch):
    return batch["input_ids"], batch["attention_mask"], batch["position_ids"], batch["responses"]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_log_probs_entropies_and_gradients_equal_the_padded_ones(tiny_model_dir, attn):
    batch = make_batch()
    mask = batch["response_mask"].bool()
    results = {}
    for packed in (False, True):
        model = load_causal_lm(str(tiny_model_dir), attn_implementation=attn)
        lp, ent = compute_response_logprobs(model, *inputs(batch), temperature=0.7, with_entropy=True,
                                            remove_padding=packed)
        ((lp * batch["response_mask"]).sum() + 0.1 * (ent * batch["response_mask"]).sum()).backward()
        results[packed] = lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}
    (lp0, ent0, grads0), (lp1, ent1, grads1) = results[False], results[True]
    torch.testing.assert_close(lp1[mask], lp0[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent1[mask], ent0[mask], atol=1e-5, rtol=0)
    assert (lp1[~mask] == 0).all()
    for name, grad in grads0.items():
        assert (grads1[name] - grad).norm() <= 1e-5 * grad.norm() + 1e-9, name


def test_packed_values_and_critic_update_equal_the_padded_ones(tiny_model_dir):
    batch = make_batch()
    torch.manual_seed(0)
    batch["values"] = 0.1 * torch.randn(len(batch), RESPONSE_LENGTH) * batch["response_mask"]
    batch["returns"] = torch.randn(len(batch), RESPONSE_LENGTH) * batch["response_mask"]
    out = {}
    for packed in (False, True):
        value_model = ValueModel(load_causal_lm(str(tiny_model_dir)))
        torch.manual_seed(1)
        torch.nn.init.normal_(value_model.model.get_output_embeddings().weight)
        cfg = TrainerConfig(critic=dict(model=dict(use_remove_padding=packed), optim=dict(lr=0.1, eps=1.0),
                                        grad_clip=1e6)).critic
        critic = Critic(value_model, cfg, CPU, samples_per_mini_batch=len(batch), ppo_epochs=1, total_steps=1)
        values = critic.compute_values(batch)
        critic.update(batch)
        out[packed] = values, {k: v.detach().clone() for k, v in value_model.state_dict().items()}
    torch.testing.assert_close(out[True][0], out[False][0], atol=1e-5, rtol=0)
    for key, value in out[False][1].items():
        torch.testing.assert_close(out[True][1][key], value, atol=1e-5, rtol=1e-5, msg=key)


def test_a_model_whose_mask_ignores_position_ids_is_refused_naming_the_key(tmp_path):
    opt = load_causal_lm(str(make_tiny_model_folder(tmp_path / "opt", arch="opt", num_layers=1, hidden_size=32,
                                                    intermediate_size=64)))
    with pytest.raises(VerlError, match="actor_rollout_ref.model.use_remove_padding=true: opt .* does not keep "
                                        "packed sequences apart"):
        PolicyModel(opt, CPU, remove_padding=True)
    PolicyModel(load_causal_lm(str(make_tiny_model_folder(tmp_path / "llama", arch="llama", num_layers=1,
                                                          hidden_size=32, intermediate_size=64))),
                CPU, remove_padding=True)  # accepted
