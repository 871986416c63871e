"""``PPOTrainer.step(batch)``: the tutorial's single-update API on a tiny local model."""

import pytest
import torch

from verl.config import TrainerConfig
from verl.algorithms import masked_mean
from verl.trainer.ppo import PPOTrainer
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker


def make_worker(model_dir, **actor):
    config = TrainerConfig(actor_rollout_ref=dict(
        model=dict(path=str(model_dir)), actor=dict(fsdp_config=dict(fsdp_size=1), optim=dict(lr=1e-3), **actor),
        rollout=dict(name="dummy"), ref=dict(fsdp_config=dict(fsdp_size=1))),
        data=dict(batch_size=2, seq_len=64), trainer=dict(max_steps=1))
    return ActorRolloutRefWorker(config=config.actor_rollout_ref)


def tutorial_batch(rewards=(0.85,)):
    # As in the tutorial: prompt tokens then response tokens, no padding, prompt_mask marks the prompt.
    prompt_ids = torch.tensor([1, 71, 13, 121, 29])
    response_ids = torch.tensor([1, 71, 13, 121, 29, 30, 71, 13, 121, 29])
    input_ids = torch.cat([prompt_ids, response_ids[1:]])
    prompt_mask = torch.zeros_like(input_ids)
    prompt_mask[:len(prompt_ids)] = 1
    n = len(rewards)
    return {"input_ids": input_ids.repeat(n, 1), "attention_mask": torch.ones(n, len(input_ids), dtype=torch.long),
            "prompt_mask": prompt_mask.repeat(n, 1), "reward": torch.tensor(rewards)}


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def changed(before, model):
    return any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_step_updates_the_actor_and_reports_losses(tiny_model_dir):
    worker = make_worker(tiny_model_dir)
    trainer = PPOTrainer(actor_rollout_ref_worker=worker,
                         config=dict(kl_coef=0.1, cliprange_value=0.2, ppo_epochs=1, mini_batch_size=1))
    actor_before, ref_before = params(worker.actor_model), params(worker.ref_model)
    out = trainer.step(tutorial_batch())
    for key in ("policy_loss", "value_loss", "kl", "clipfrac", "entropy", "policy_grad_norm", "value_grad_norm"):
        assert isinstance(out[key], float), key
    assert out["value_loss"] > 0 and out["entropy"] > 0
    assert changed(actor_before, worker.actor_model)
    assert not changed(ref_before, worker.ref_model)


def test_rewards_are_kl_penalised_on_the_last_token_and_gae_is_applied(tiny_model_dir):
    trainer = PPOTrainer(actor_rollout_ref_worker=make_worker(tiny_model_dir), config=dict(kl_coef=0.1, lam=0.95))
    batch = trainer.prepare(tutorial_batch(rewards=(2.0, -1.0)))
    mask = batch["response_mask"]
    assert mask.sum(-1).tolist() == [9, 9]
    # Before any update the policy equals the reference: the KL penalty is 0 and the reward sits
    # on the last response token only.
    assert torch.equal(batch["old_log_probs"], batch["ref_log_prob"])
    expected_scores = torch.zeros(2, 9)
    expected_scores[0, 8], expected_scores[1, 8] = 2.0, -1.0
    torch.testing.assert_close(batch["token_level_rewards"], expected_scores)
    # The fresh critic's value head is zero, so V = 0 and GAE returns are the discounted reward:
    # gamma = 1, lam = 0.95 -> return_t = r * 0.95 ** (8 - t), e.g. 2.0 * 0.95**8 = 1.3268 at t = 0.
    assert torch.count_nonzero(batch["values"]) == 0
    decay = torch.tensor([0.95 ** (8 - t) for t in range(9)])
    torch.testing.assert_close(batch["returns"], torch.stack([2.0 * decay, -1.0 * decay]))
    # Advantages are the same numbers whitened over the batch's tokens: zero mean.
    assert abs(masked_mean(batch["advantages"], mask).item()) < 1e-6


@pytest.mark.parametrize("reward", [0.85, torch.tensor(0.85), torch.tensor([[0.85]]), [0.85]])
def test_scalar_and_column_rewards_are_taken_as_one_per_row(tiny_model_dir, reward):
    trainer = PPOTrainer(actor_rollout_ref_worker=make_worker(tiny_model_dir))
    batch = tutorial_batch()
    batch["reward"] = reward
    assert trainer.prepare(batch)["reward"].tolist() == pytest.approx([0.85])


def test_a_reward_of_the_wrong_size_is_rejected_with_both_shapes(tiny_model_dir):
    trainer = PPOTrainer(actor_rollout_ref_worker=make_worker(tiny_model_dir))
    batch = tutorial_batch(rewards=(1.0, 0.0))
    batch["reward"] = torch.ones(3)
    with pytest.raises(ValueError, match=r"\[3\].*2|2.*\[3\]"):
        trainer.step(batch)


def _with(**changes):
    return {**tutorial_batch(), **changes}


BAD_BATCHES = [
    # A mask of another length: named with both shapes, not a reshape error.
    (_with(attention_mask=torch.ones(1, 5, dtype=torch.long)),
     r"^attention_mask has shape \[1, 5\] but input_ids has \[1, 14\]; give attention_mask the shape of input_ids"),
    (_with(prompt_mask=torch.ones(2, 14, dtype=torch.long)), r"^prompt_mask has shape \[2, 14\] but input_ids has \[1, 14\]"),
    # Ids of another tokenizer: named with row and position, not "index out of range in self" from the embedding.
    (_with(input_ids=torch.tensor([[1, 71, 13, 121, 29, 71, 13, 121, 29, 30, 71, 13, 121, 100_000]])),
     r"^input_ids holds token id 100000 \(row 0, position 13\), outside the model's \d+ token ids"),
    (_with(input_ids=torch.tensor([[1, -1, 13, 121, 29, 71, 13, 121, 29, 30, 71, 13, 121, 29]])),
     r"^input_ids holds token id -1 \(row 0, position 1\)"),
    (_with(input_ids=tutorial_batch()["input_ids"] + 0.5), r"^input_ids must hold token ids \(whole numbers\)"),
    # A reward that is not a number would turn the whole update into NaN.
    (_with(reward=torch.tensor([float("nan")])), r"^reward of row 0 is nan \(1 row\(s\) not finite\)"),
    (_with(reward=float("inf")), r"^reward of row 0 is inf"),
    # A prompt_mask that is not "prompt first": before, the marked tokens were taken as the prompt wherever they
    # stood, so a response mask given as prompt_mask (or 1 - prompt_mask) trained on a reordered sequence.
    (_with(prompt_mask=1 - tutorial_batch()["prompt_mask"]),
     r"^row 0 of the batch has a prompt token after its response begins \(prompt_mask is 0 at real token 0, 1 "
     r"later\): prompt_mask must be 1 on the prompt, which comes first"),
    (_with(prompt_mask=torch.tensor([[1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0]])),
     r"^row 0 of the batch has a prompt token after its response begins \(prompt_mask is 0 at real token 2"),
    # Before: "max() arg is an empty sequence"; a list of row dicts: "the batch dict lacks [...]".
    ({"input_ids": torch.zeros(0, 14, dtype=torch.long), "prompt_mask": torch.zeros(0, 14), "reward": torch.zeros(0)},
     r"^the batch has no rows \(input_ids has shape \[0, 14\]\)"),
    ([tutorial_batch()], r"^the batch is a list of 1 dict\(s\), not a dict; stack the rows into one dict of tensors"),
    # Rows of several lengths as lists (a tokenizer without padding): before, torch's "expected sequence of length 3
    # at dim 1 (got 4)".
    (_with(input_ids=[[1, 71, 13], [1, 71, 13, 121]]), r"^input_ids cannot be made one tensor \(expected sequence of "
                                                       r"length 3 at dim 1 \(got 4\)\): are its rows of different "
                                                       r"lengths\? Pad them to one length"),
    (_with(prompt_mask=[[1, 1], [1]]), r"^prompt_mask cannot be made one tensor"),
    # A column under another name (TRL's "rewards", a scorer's "score"): before, only "lacks ['reward']".
    ({**{k: v for k, v in tutorial_batch().items() if k != "reward"}, "rewards": torch.tensor([1.0])},
     r"^the batch dict lacks \['reward'\] \('rewards' is there: name it 'reward'\); PPOTrainer.step needs"),
    ({k: v for k, v in tutorial_batch().items() if k not in ("reward", "prompt_mask")} |
     {"prompt_masks": tutorial_batch()["prompt_mask"], "score": torch.tensor([1.0])},
     r"^the batch dict lacks \['prompt_mask', 'reward'\] \('prompt_masks' is there: name it 'prompt_mask'; 'score' "
     r"is there: name it 'reward'\)"),
]


@pytest.mark.parametrize("batch, message", BAD_BATCHES, ids=["mask", "prompt_mask", "vocab", "negative", "fraction",
                                                             "nan", "inf", "response_mask", "interleaved", "empty",
                                                             "list", "ragged", "ragged_mask", "rewards",
                                                             "score_and_masks"])
def test_a_malformed_batch_is_refused_before_the_update_naming_what_is_wrong(tiny_model_dir, batch, message):
    worker = make_worker(tiny_model_dir)
    trainer = PPOTrainer(actor_rollout_ref_worker=worker)
    before = params(worker.actor_model)
    with pytest.raises(ValueError, match=message):
        trainer.step(batch)
    assert not changed(before, worker.actor_model)
    # Whole numbers as floats are token ids; keys the step does not read are said, once.
    trainer.step(_with(input_ids=tutorial_batch()["input_ids"].float()))


def test_a_batch_object_is_taken_in_verls_layout_with_a_reward_and_named_without_one(tiny_model_dir):
    """Before: generate_sequences' output without a reward ran the log-prob passes, then failed with KeyError
    "no column 'reward'"; a Batch of the tutorial's columns failed with KeyError "no column 'responses'"."""
    from verl.protocol import Batch

    config = TrainerConfig(actor_rollout_ref=dict(model=dict(path=str(tiny_model_dir)),
                                                  rollout=dict(name="dummy", response_length=6, n=1)))
    worker = ActorRolloutRefWorker(config=config.actor_rollout_ref)
    trainer = PPOTrainer(actor_rollout_ref_worker=worker)
    ids = tutorial_batch((0.5, 1.0))["input_ids"][:, :5]
    prompts = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                     "position_ids": torch.arange(5).expand(2, 5).clone()})
    generated = worker.generate_sequences(prompts)
    before = params(worker.actor_model)
    with pytest.raises(ValueError, match=r"^the Batch given to PPOTrainer.step lacks \['reward'\] \(it has \['prompts', "
                                         r"'responses', .*\]\); give a Batch in verl's layout, e.g. worker.generate_"
                                         r"sequences' output with batch\['reward'\] = one reward per row \[B\]"):
        trainer.step(generated)
    assert not changed(before, worker.actor_model) and "old_log_probs" not in generated
    generated["reward"] = torch.tensor([0.5, 1.0])
    assert trainer.step(generated)["reward_mean"] == pytest.approx(0.75)
    assert trainer.step(Batch.from_dict(tutorial_batch((0.0, 1.0))))["reward_mean"] == pytest.approx(0.5)


def test_keys_the_step_does_not_read_are_said_once(tiny_model_dir, caplog):
    trainer = PPOTrainer(actor_rollout_ref_worker=make_worker(tiny_model_dir))
    with caplog.at_level("WARNING", logger="verl.trainer.ppo.step_batch"):
        trainer.step(_with(advantages=torch.ones(1, 14), labels=torch.ones(1, 14)))
        trainer.step(_with(advantages=torch.ones(1, 14), labels=torch.ones(1, 14)))
    said = [r.getMessage() for r in caplog.records]
    assert said == ["PPOTrainer.step does not read ['advantages', 'labels'] of the batch dict (it computes log-probs, "
                    "values and advantages itself); it reads input_ids, prompt_mask, reward, attention_mask"]


def test_a_mini_batch_larger_than_the_batch_is_said_once(tiny_model_dir, caplog):
    trainer = PPOTrainer(actor_rollout_ref_worker=make_worker(tiny_model_dir), config=dict(mini_batch_size=4))
    with caplog.at_level("WARNING", logger="verl.trainer.ppo.ppo_trainer"):
        trainer.step(tutorial_batch((0.5, 1.0)))
        trainer.step(tutorial_batch((0.5, 1.0)))
    assert [r.getMessage() for r in caplog.records] == [
        "PPOTrainer: mini_batch_size=4 is more than the 2 row(s) of this batch, so each step makes one update on the "
        "whole batch; give batches of at least mini_batch_size rows, or set mini_batch_size to the rows of a batch "
        "(or null: the whole batch)"]


def test_compute_loss_override_changes_the_objective_and_keeps_the_rest(tiny_model_dir, tmp_path):
    calls = []

    class LikelihoodTrainer(PPOTrainer):
        # Maximise the response likelihood instead of the PPO objective.
        def compute_loss(self, batch, log_prob, entropy, counts):
            calls.append(len(batch))
            loss = -(log_prob * batch["response_mask"]).sum() / counts["global_tokens"]
            return loss, {"actor/pg_loss": loss.detach()}

    worker = make_worker(tiny_model_dir)
    trainer = LikelihoodTrainer(actor_rollout_ref_worker=worker, config=dict(mini_batch_size=1),
                                output_dir=str(tmp_path / "run"), logger=dict(type="console"))
    batch = tutorial_batch(rewards=(0.0, 0.0))  # zero reward: PPO alone would not push these tokens up
    start = trainer.prepare(batch)["old_log_probs"].sum()
    trainer.step(batch)
    assert calls == [1, 1]  # one call per mini-batch of one row
    assert trainer.prepare(batch)["old_log_probs"].sum() > start
    # Logging and checkpoints are unchanged by the override.
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count('"step": 1') == 1
    trainer.save_checkpoint(str(tmp_path / "ckpt"))
    fresh = LikelihoodTrainer(actor_rollout_ref_worker=make_worker(tiny_model_dir))
    fresh.load_checkpoint(str(tmp_path / "ckpt"))
    assert fresh.global_step == 1 and not changed(params(worker.actor_model), fresh.worker.actor_model)


def test_the_trainer_config_in_place_of_the_worker_or_the_step_settings_names_where_it_goes(tiny_model_dir):
    """Before: AttributeError: unknown config key 'config', and TypeError: ... argument after ** must be a mapping."""
    from verl.config import ConfigError

    config = TrainerConfig(actor_rollout_ref=dict(model=dict(path=str(tiny_model_dir)), rollout=dict(name="dummy")))
    with pytest.raises(ConfigError, match=r"PPOTrainer\(actor_rollout_ref_worker=\.\.\.\) takes the worker built from the "
                                          r"config, got TrainerConfig; build it first: worker = ActorRolloutRefWorker"):
        PPOTrainer(actor_rollout_ref_worker=config)
    with pytest.raises(ConfigError, match=r"PPOTrainer\(config=\.\.\.\) takes the step's settings, a dict of kl_coef, .*"
                                          r"got TrainerConfig; a TrainerConfig's actor_rollout_ref section goes to"):
        PPOTrainer(actor_rollout_ref_worker=make_worker(tiny_model_dir), config=config)


def test_no_worker_or_a_model_in_place_of_the_worker_is_refused_naming_the_worker(tiny_model_dir):
    """Before: AttributeError: 'NoneType' object has no attribute 'config' (the step before the worker was built),
    and an AttributeError deep in the critic's build for a model from load_hf_model."""
    from verl.config import ConfigError
    from verl.utils.model import load_hf_model

    with pytest.raises(ConfigError, match=r"takes the worker built from the config, got NoneType; build it first"):
        PPOTrainer(actor_rollout_ref_worker=None)
    with pytest.raises(ConfigError, match=r"got Qwen2ForCausalLM; build it first: .*; the worker loads the model "
                                          r"itself from actor_rollout_ref.model.path$"):
        PPOTrainer(actor_rollout_ref_worker=load_hf_model(str(tiny_model_dir)))


def test_a_trainer_made_again_on_the_same_output_folder_starts_its_metrics_over(tiny_model_dir, tmp_path):
    """Before: a notebook cell run twice appended to one metrics.jsonl, steps 1, 2, 1, 2 (two runs in one plot).
    Now as a run started again: the rows after the trainer's start go; a trainer resumed from a checkpoint keeps
    the rows up to its step."""
    import json

    worker, run = make_worker(tiny_model_dir), tmp_path / "run"

    def steps():
        return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]

    for _ in range(2):
        trainer = PPOTrainer(actor_rollout_ref_worker=worker, output_dir=str(run), logger=dict(type="console"))
        trainer.step(tutorial_batch())
        trainer.step(tutorial_batch())
        assert steps() == [1, 2]
    trainer.save_checkpoint(str(tmp_path / "ckpt"))
    resumed = PPOTrainer(actor_rollout_ref_worker=worker, output_dir=str(run), logger=dict(type="console"))
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    resumed.step(tutorial_batch())
    assert steps() == [1, 2, 3]


def test_a_logger_key_the_trainer_does_not_read_is_refused_and_the_logger_names_alone_are_taken(tiny_model_dir,
                                                                                                tmp_path):
    """Before: logger=dict(backend="tensorboard") logged to the console alone, and project_name= (verl's key)
    under the project "verl", without a word; logger="tensorboard" failed inside dict()."""
    from verl.errors import ConfigError

    worker = make_worker(tiny_model_dir)
    with pytest.raises(ConfigError, match="PPOTrainer\\(logger=...\\): unknown config key 'backend'; valid keys: type"):
        PPOTrainer(actor_rollout_ref_worker=worker, output_dir=str(tmp_path / "a"), logger=dict(backend="tensorboard"))
    with pytest.raises(ConfigError, match="'project_name'; did you mean project"):
        PPOTrainer(actor_rollout_ref_worker=worker, output_dir=str(tmp_path / "b"),
                   logger=dict(type="console", project_name="my-rl"))
    with pytest.raises(ConfigError, match="takes a dict such as dict\\(type='wandb'"):
        PPOTrainer(actor_rollout_ref_worker=worker, logger=5)
    for logger in ("tensorboard", ["console", "tensorboard"]):
        trainer = PPOTrainer(actor_rollout_ref_worker=worker, output_dir=str(tmp_path / "c"), logger=logger)
        assert "_TensorBoard" in [type(backend).__name__ for backend in trainer.tracker.backends]
        trainer.tracker.close()


def test_a_learning_rate_in_the_step_settings_names_the_workers_key(tiny_model_dir):
    """Before: "unknown config key 'lr'; valid keys: ..., critic_lr", and critic_lr is the critic's."""
    from verl.config import ConfigError

    worker = make_worker(tiny_model_dir)
    for key in ("lr", "learning_rate"):
        with pytest.raises(ConfigError, match=rf"^PPOTrainer\(config=\.\.\.\) has no {key}: the actor's optimiser is "
                                              r"the worker's, set by actor_rollout_ref.actor.optim.lr"):
            PPOTrainer(actor_rollout_ref_worker=worker, config={key: 1e-5, "kl_coef": 0.1})


def test_the_workers_methods_given_a_dict_name_the_batch_they_take(tiny_model_dir):
    """Before: AttributeError: 'dict' object has no attribute 'to' (a tokenizer's output to generate_sequences)."""
    from verl.errors import VerlError

    worker = make_worker(tiny_model_dir)
    encoded = dict(worker.tokenizer(["12+34="], return_tensors="pt"))
    for method in ("generate_sequences", "compute_log_prob", "compute_ref_log_prob", "update_actor"):
        with pytest.raises(VerlError, match=rf"^ActorRolloutRefWorker.{method} takes a verl.protocol.Batch, got dict: "
                                            r"wrap the tensors, Batch\("):
            getattr(worker, method)(encoded)


def test_the_workers_methods_given_ids_the_model_does_not_embed_name_the_row_and_the_tokenizer(tiny_model_dir):
    """Before: IndexError "index out of range in self" inside the model (prompts encoded with another, larger
    tokenizer, e.g. a Qwen2 tokenizer's ids for this byte-level model)."""
    from verl.errors import VerlError
    from verl.protocol import Batch

    worker = make_worker(tiny_model_dir)
    rows = worker.actor_model.config.vocab_size
    ids = torch.tensor([[5, 6, 7], [5, rows + 100, 7]])
    batch = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                   "position_ids": torch.arange(3).expand(2, 3).clone()})
    for method in ("generate_sequences", "compute_log_prob", "compute_ref_log_prob", "update_actor"):
        with pytest.raises(VerlError, match=rf"^ActorRolloutRefWorker.{method}: input_ids holds token id {rows + 100} "
                                            rf"\(row 1, position 1\), outside the model's {rows} token ids: "
                                            r"were the ids made by another tokenizer"):
            getattr(worker, method)(batch)


def test_padding_without_an_attention_mask_is_said_once_with_the_rows(tiny_model_dir, caplog, monkeypatch):
    """Before: rows padded to one length and given without attention_mask trained the padding as tokens (the
    reward on a pad token), without a word."""
    from verl.trainer.ppo import step_batch

    monkeypatch.setattr(step_batch, "_said", set())  # said once a process: not yet in this test
    trainer = PPOTrainer(actor_rollout_ref_worker=make_worker(tiny_model_dir))
    pad = trainer.worker.tokenizer.pad_token_id
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11], [5, 6, 7, 8, 9, pad, pad], [pad, pad, 7, 8, 9, 10, 11]])
    prompt_mask = torch.tensor([[1, 1, 1, 0, 0, 0, 0]] * 3)
    with caplog.at_level("WARNING", logger="verl.trainer.ppo.step_batch"):
        trainer.step({"input_ids": ids[:1], "prompt_mask": prompt_mask[:1], "reward": [1.0]})  # no padding: no word
        assert not caplog.records
        for _ in range(2):
            trainer.step({"input_ids": ids, "prompt_mask": prompt_mask, "reward": [1.0, 0.0, 0.5]})
    assert [r.getMessage() for r in caplog.records] == [
        f"PPOTrainer.step: 2 of 3 row(s) of input_ids begin or end with the pad token (id {pad}), e.g. row 1, and the "
        "batch has no attention_mask, so that padding is trained as prompt or response tokens; give attention_mask "
        "(0 on padding), as the tokenizer returns it"]


def test_a_batch_of_other_value_types_reads_as_the_tutorials_tensors():
    """int32 ids, bool or float masks, float64 rewards, numpy arrays, lists, one tensor per row and a
    non-contiguous view make the same step batch as the tutorial's tensors; attention_mask=None is no padding, as a
    Hugging Face model reads it. Before: a list of row tensors failed as "cannot be made one tensor (only integer
    tensors of a single element ...): are its rows of different lengths?", attention_mask=None and prompt_mask=None
    as "could not infer dtype of NoneType" with that padding hint, and a None reward as "reward of row 0 is nan"."""
    import numpy as np

    from verl.errors import VerlError
    from verl.trainer.ppo.step_batch import batch_from_dict
    from verl.utils.preflight import normalize_reward

    def read(data):
        return batch_from_dict(data, 0, normalize_reward, vocab_size=200)

    base = tutorial_batch((0.5, 1.0))
    base["input_ids"][1, -1] = 7
    expected = read(base)
    ids, mask, prompt_mask, reward = base["input_ids"], base["attention_mask"], base["prompt_mask"], base["reward"]
    for data in [dict(input_ids=ids.int(), attention_mask=mask.bool(), prompt_mask=prompt_mask.bool(),
                      reward=reward.double()),
                 dict(input_ids=ids.numpy().astype(np.int32), attention_mask=mask.float().numpy(),
                      prompt_mask=prompt_mask.numpy().astype(bool), reward=reward.numpy()),
                 dict(input_ids=ids.tolist(), attention_mask=mask.tolist(), prompt_mask=prompt_mask.tolist(),
                      reward=[np.float32(0.5), torch.tensor(1.0)]),
                 dict(input_ids=list(ids), attention_mask=list(mask.numpy()), prompt_mask=tuple(prompt_mask),
                      reward=reward),
                 dict(input_ids=ids.t().contiguous().t(), attention_mask=None, prompt_mask=prompt_mask, reward=reward)]:
        got = read(data)
        assert got.keys() == expected.keys()
        assert all(torch.equal(got[k], expected[k]) and got[k].dtype == expected[k].dtype for k in expected.keys())
    for key, message in [("prompt_mask", r"^the batch's prompt_mask is None; give a tensor \[B, T\]"),
                         ("input_ids", r"^the batch's input_ids is None")]:
        with pytest.raises(VerlError, match=message):
            read({**base, key: None})
    with pytest.raises(VerlError, match=r"^reward of row 1 is None; every row needs a finite number"):
        read({**base, "reward": [0.5, None]})


def test_the_workers_methods_take_int32_ids_and_numpy_columns_as_the_int64_tensors(tiny_model_dir):
    """Before: int32 responses failed inside the model with "expected target dtype to be Long or Byte, but got
    Int" (compute_log_prob, update_actor, a Batch handed to PPOTrainer.step), numpy columns of Batch.from_dict with
    "'numpy.ndarray' object has no attribute 'dim'", and one prompt's 1-D input_ids with "tuple index out of
    range"."""
    from verl.errors import VerlError
    from verl.protocol import Batch

    def worker():
        torch.manual_seed(0)
        config = TrainerConfig(actor_rollout_ref=dict(model=dict(path=str(tiny_model_dir)),
                                                      rollout=dict(name="dummy", response_length=4, n=1)))
        return ActorRolloutRefWorker(config=config.actor_rollout_ref)

    policy = worker()
    prompts = Batch({"input_ids": torch.tensor([[5, 6, 7], [8, 9, 10]]), "attention_mask": torch.ones(2, 3).long(),
                     "position_ids": torch.arange(3).expand(2, 3).clone()})
    generated = Batch(policy.generate_sequences(prompts).tensors)
    narrow = Batch({k: v.int() if k in ("input_ids", "responses", "prompts") else v
                    for k, v in generated.tensors.items()})
    as_numpy = Batch.from_dict({k: v.numpy() for k, v in generated.tensors.items()})
    expected = policy.compute_log_prob(generated)["old_log_probs"]
    for batch in (narrow, as_numpy):
        assert torch.equal(policy.compute_log_prob(batch)["old_log_probs"], expected)
        assert torch.equal(policy.compute_ref_log_prob(batch)["ref_log_prob"], expected)
    advantages = torch.tensor([[1.0], [-1.0]]).expand_as(expected).contiguous()
    updated = [worker().update_actor(b.union(Batch({"old_log_probs": expected, "advantages": advantages})))
               for b in (generated, narrow)]
    assert updated[0]["actor/grad_norm"] == updated[1]["actor/grad_norm"] > 0
    narrow["reward"] = torch.tensor([0.5, 1.0])
    assert PPOTrainer(actor_rollout_ref_worker=policy).step(narrow)["reward_mean"] == pytest.approx(0.75)
    with pytest.raises(VerlError, match=r"^ActorRolloutRefWorker.generate_sequences: input_ids has shape \[3\]; give "
                                        r"\[B, T\], one row per sequence \(input_ids.unsqueeze\(0\)"):
        policy.generate_sequences(Batch({"input_ids": torch.tensor([5, 6, 7]), "attention_mask": torch.ones(3)}))
