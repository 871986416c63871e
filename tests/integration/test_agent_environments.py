"""Multi-turn rollouts with someone to talk to: an environment (``reset``/``step``) or a verl interaction
(``BaseInteraction`` from a yaml) answers each assistant turn of a tiny Qwen2 taught the game; their
rewards reach the trajectory and the reward function, and replies that cannot be used stop the rollout
with one line naming the row and the fix."""

import json

import pytest
import torch

from agent_models import memorize
from verl.agent.agent_loop import AgentLoop, AgentSettings
from verl.data import collate_prompts
from verl.rollout import HFRollout, SamplingParams


class ThreeRounds:
    """An environment that asks for three answers: each earns 0.25, the third ends the episode."""

    def reset(self, sample):
        self.rounds = 0
        return f"Round one, target {sample['ground_truth']}."

    def step(self, message):
        self.rounds += 1
        self.seen = message
        return (None, 0.25, True) if self.rounds == 3 else (f"Round {self.rounds + 1}.", 0.25, False)


@pytest.fixture(scope="module")
def chatty_model(tmp_path_factory):
    """Answers "ok" to every message of the game below."""
    return memorize(tmp_path_factory, "chatty-model", [[
        {"role": "user", "content": "Play."}, {"role": "user", "content": f"Round one, target {t}."},
        {"role": "assistant", "content": "ok"}, {"role": "user", "content": "Round 2."},
        {"role": "assistant", "content": "ok"}, {"role": "user", "content": "Round 3."},
        {"role": "assistant", "content": "ok"}] for t in (7, 8)])


def _game_rows(tok):
    rows = []
    for i in range(2):
        messages = [{"role": "user", "content": "Play."}]
        ids = tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                  add_special_tokens=False)["input_ids"]
        rows.append({"input_ids": torch.tensor(ids), "raw_prompt": messages, "data_source": "game",
                     "ground_truth": str(7 + i), "extra_info": {}, "index": i})
    return collate_prompts(rows, tok.pad_token_id)


def test_an_environment_answers_each_turn_until_it_is_done(chatty_model):
    model, tok, _ = chatty_model
    loop = AgentLoop(HFRollout(model, tok), tok, {}, AgentSettings(), environment=ThreeRounds)
    out = loop.generate(_game_rows(tok), SamplingParams(max_new_tokens=60, do_sample=False))

    for i in range(2):
        prompt = tok.decode(out["prompts"][i][out["attention_mask"][i, :out["prompts"].shape[1]].bool()])
        assert prompt == f"Q: Play.\nQ: Round one, target {7 + i}.\nA: "  # reset's message joined the prompt
        seen = out["attention_mask"][i, out["prompts"].shape[1]:].bool()
        not_trained = tok.decode(out["responses"][i][seen & ~out["response_mask"][i].bool()])
        assert not_trained == "Q: Round 2.\nA: Q: Round 3.\nA: "  # the environment's replies, out of the loss
        assert tok.decode(out["responses"][i][out["response_mask"][i].bool()]) == "ok</s>" * 3
    assert out["agent_turns"].tolist() == [3.0, 3.0]
    assert out["agent_reward"].tolist() == [0.75, 0.75]
    assert [list(r) for r in out["agent_turn_rewards"]] == [[0.25, 0.25, 0.25]] * 2


class UnscoredRounds(ThreeRounds):
    """Like ThreeRounds, but its second turn gives no reward (None)."""

    def step(self, message):
        reply, reward, done = super().step(message)
        return reply, (None if self.rounds == 2 else reward), done


class SilentRounds(ThreeRounds):
    """Forgets to reply on its second turn, without ending the episode."""

    def step(self, message):
        reply, reward, done = super().step(message)
        return (None, reward, False) if self.rounds == 2 else (reply, reward, done)


class WordyRounds(ThreeRounds):
    def step(self, message):
        reply, _, done = super().step(message)
        return reply, "high", done


def test_an_environment_turn_without_a_reward_counts_zero_warned_once_and_counted(chatty_model, caplog):
    model, tok, _ = chatty_model
    loop = AgentLoop(HFRollout(model, tok), tok, {}, AgentSettings(), environment=UnscoredRounds)
    with caplog.at_level("WARNING", logger="verl.agent.agent_loop"):
        out = loop.generate(_game_rows(tok), SamplingParams(max_new_tokens=60, do_sample=False))
        loop.generate(_game_rows(tok), SamplingParams(max_new_tokens=60, do_sample=False))
    assert [list(r) for r in out["agent_turn_rewards"]] == [[0.25, 0.0, 0.25]] * 2
    assert out["agent_defaulted"].tolist() == [1.0, 1.0]
    warned = [r.getMessage() for r in caplog.records if "returned reward None" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("UnscoredRounds.step (row 0) returned reward None: ")
    from verl.trainer.ppo.core import compute_data_metrics

    assert compute_data_metrics(out.union(_scores(out)), 60)["agent/defaulted_values"] == 2.0


def _scores(out):
    from verl.protocol import Batch

    return Batch({"token_level_scores": torch.zeros(out["responses"].shape),
                  "token_level_rewards": torch.zeros(out["responses"].shape),
                  "advantages": torch.zeros(out["responses"].shape), "returns": torch.zeros(out["responses"].shape)})


@pytest.mark.parametrize("environment,message", [
    (SilentRounds, "SilentRounds.step returned no reply (None) with done=False for row 0 (turn 2): return the next "
                   "user message, or done=True to end the episode"),
    (WordyRounds, "WordyRounds.step (row 0) returned reward 'high': a turn's reward must be a finite number (or "
                  "None for none)"),
])
def test_an_environment_reply_that_cannot_be_used_stops_the_rollout_naming_row_and_fix(chatty_model, environment,
                                                                                      message):
    from verl.errors import VerlError

    model, tok, _ = chatty_model
    loop = AgentLoop(HFRollout(model, tok), tok, {}, AgentSettings(), environment=environment)
    with pytest.raises(VerlError) as err:
        loop.generate(_game_rows(tok), SamplingParams(max_new_tokens=60, do_sample=False))
    assert str(err.value) == message


ROUNDS_INTERACTION = '''
from verl.interactions.base import BaseInteraction


class RoundsInteraction(BaseInteraction):
    """A verl interaction: asks for rounds 2 and 3, ends after the third answer."""

    def __init__(self, config):
        super().__init__(config)
        self.state, self.finalized, self.seen = {}, [], []

    async def start_interaction(self, instance_id=None, target=None, **kwargs):
        self.state[instance_id] = {"round": 1, "target": target}
        return instance_id

    async def generate_response(self, instance_id, messages, **kwargs):
        self.seen.append([m["role"] for m in messages])
        state = self.state[instance_id]
        state["round"] += 1
        if state["round"] > 3:
            return True, "Done.", 0.5, {}
        return False, f"Round {state['round']}.", 0.25, {}

    async def finalize_interaction(self, instance_id, **kwargs):
        self.finalized.append(self.state.pop(instance_id)["target"])
'''


def _write_interaction(folder, monkeypatch):
    (folder / "rounds_mod.py").write_text(ROUNDS_INTERACTION)
    (folder / "interaction.yaml").write_text("interaction:\n  - class_name: rounds_mod.RoundsInteraction\n"
                                             "    config: {}\n")
    monkeypatch.syspath_prepend(str(folder))
    return folder / "interaction.yaml"


def test_a_verl_interaction_yaml_answers_each_turn_and_its_scores_reach_extra_info(chatty_model, tmp_path,
                                                                                  monkeypatch):
    from verl.agent.interactions import interaction_environment

    model, tok, _ = chatty_model
    environment = interaction_environment(_write_interaction(tmp_path, monkeypatch))
    rows = []
    for i in range(2):
        messages = [{"role": "user", "content": "Play."}, {"role": "user", "content": f"Round one, target {7 + i}."}]
        ids = tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                  add_special_tokens=False)["input_ids"]
        rows.append({"input_ids": torch.tensor(ids), "raw_prompt": messages, "data_source": "game", "index": i,
                     "ground_truth": str(7 + i), "extra_info": {"interaction_kwargs": {"name": "rounds",
                                                                                       "target": 7 + i}}})
    loop = AgentLoop(HFRollout(model, tok), tok, {}, AgentSettings(), environment=environment)
    out = loop.generate(collate_prompts(rows, tok.pad_token_id), SamplingParams(max_new_tokens=60, do_sample=False))

    for i in range(2):
        seen = out["attention_mask"][i, out["prompts"].shape[1]:].bool()
        trained = out["response_mask"][i].bool()
        assert tok.decode(out["responses"][i][seen & ~trained]) == "Q: Round 2.\nA: Q: Round 3.\nA: "
        assert tok.decode(out["responses"][i][trained]) == "ok</s>" * 3
        # verl's fields for the reward function: 3 assistant + 2 user turns + the prompt
        info = out["extra_info"][i]
        assert info["num_turns"] == 6 and info["turn_scores"] == [0.25, 0.25, 0.5] and info["tool_rewards"] == []
        assert info["interaction_kwargs"]["target"] == 7 + i  # the row's own extra_info is kept
    assert out["agent_reward"].tolist() == [1.0, 1.0]
    rounds = environment.interactions["rounds"]  # one instance for all trajectories, as in verl
    assert sorted(rounds.finalized) == [7, 8] and not rounds.state  # every trajectory finalized
    # it read the conversation: the prompt's messages, then each assistant turn and its own replies
    assert sorted(rounds.seen)[-1] == ["user", "user", "assistant", "user", "assistant", "user", "assistant"]


def test_verl_interactions_through_main_ppo_score_by_the_reward_function_alone_when_asked(chatty_model, tmp_path,
                                                                                         monkeypatch):
    from verl.data import write_parquet
    from verl.trainer.main_ppo import main

    _, _, model_dir = chatty_model
    yaml_path = _write_interaction(tmp_path, monkeypatch)
    (tmp_path / "reward.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    # verl's way: the reward function reads the interaction's last turn score\n"
        "    return extra_info['turn_scores'][-1] if extra_info['turn_scores'] else 0.0\n")
    rows = [{"prompt": [{"role": "user", "content": "Play."}, {"role": "user", "content": f"Round one, target {t}."}],
             "data_source": "game", "reward_model": {"style": "rule", "ground_truth": str(t)},
             "extra_info": {"interaction_kwargs": {"name": "rounds", "target": t}}} for t in (7, 8, 7, 8)]
    write_parquet(rows, tmp_path / "train.parquet")
    scores = {}
    for add in (True, False):
        out = tmp_path / f"out-{add}"
        assert main([f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={tmp_path / 'train.parquet'}",
                     f"data.val_files={tmp_path / 'train.parquet'}", f"custom_reward_function.path={tmp_path / 'reward.py'}",
                     "actor_rollout_ref.rollout.multi_turn.enable=true",
                     f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={yaml_path}",
                     f"actor_rollout_ref.rollout.multi_turn.add_agent_rewards={add}", "data.train_batch_size=2",
                     "data.max_prompt_length=40", "data.max_response_length=60", "actor_rollout_ref.rollout.n=2",
                     "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.optim.lr=1e-5",
                     "actor_rollout_ref.rollout.temperature=0.1", "trainer.total_training_steps=1",
                     "trainer.val_before_train=false", f"trainer.default_local_dir={out}",
                     "trainer.progress_bar=false"]) == 0
        row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
        assert row["reward/turn_3/mean"] == 0.5 and row["agent/num_turns/mean"] == 3
        scores[add] = row["critic/score/mean"]
    # the function's 0.5, plus the turns' 0.25 + 0.25 + 0.5 unless add_agent_rewards=false
    assert scores == {True: 1.5, False: 0.5}


SILENT_INTERACTION = '''
from verl.interactions.base import BaseInteraction


class SilentInteraction(BaseInteraction):
    async def start_interaction(self, instance_id=None, **kwargs):
        return instance_id

    async def generate_response(self, instance_id, messages, **kwargs):
        return False, None, 0.0, {}
'''


def test_a_verl_interaction_without_a_reply_that_does_not_terminate_stops_the_rollout(chatty_model, tmp_path,
                                                                                    monkeypatch):
    from verl.agent.interactions import interaction_environment
    from verl.errors import VerlError

    model, tok, _ = chatty_model
    (tmp_path / "silent_mod.py").write_text(SILENT_INTERACTION)
    (tmp_path / "interaction.yaml").write_text("interaction:\n  - class_name: silent_mod.SilentInteraction\n"
                                               "    config: {}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    loop = AgentLoop(HFRollout(model, tok), tok, {}, AgentSettings(),
                     environment=interaction_environment(tmp_path / "interaction.yaml"))
    with pytest.raises(VerlError) as err:
        loop.generate(_game_rows(tok), SamplingParams(max_new_tokens=60, do_sample=False))
    assert str(err.value) == ("actor_rollout_ref.rollout.multi_turn.interaction_config_path: SilentInteraction."
                              "generate_response returned no reply (None) with should_terminate=False: return the "
                              "next user message, or should_terminate=True to end the interaction")
