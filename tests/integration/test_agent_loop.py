"""Multi-turn rollouts on a real model: a tiny Qwen2 taught one tool-use trace calls the tool, reads
the result the loop splices in, and answers. The trajectory holds the exact ids the model drew,
the tool result is in the sequence but out of the loss, and the log-probs the engine reported for
the model's tokens equal the actor's recomputation over the whole trajectory."""

import copy
import json

import pytest
import torch

from agent_models import CALL, TOOL_CONVERSATION, memorize, tool_task_args, write_tool_task
from verl.agent.agent_loop import AgentLoop, AgentSettings
from verl.data import collate_prompts
from verl.models.logprob import compute_response_logprobs
from verl.rollout import HFRollout, SamplingParams
from verl.tools.function_tool import tools_from_functions


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    """Question, tool call, tool result (not trained on at RL time), answer."""
    return memorize(tmp_path_factory, "tool-model", [TOOL_CONVERSATION])


def _prompts(tok, n_rows=2):
    rows = []
    for _ in range(n_rows):
        text = tok.apply_chat_template([{"role": "user", "content": "12*34="}], tokenize=False,
                                       add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        rows.append({"input_ids": torch.tensor(ids), "raw_prompt": None, "data_source": "test", "ground_truth": "408",
                     "extra_info": {}, "index": len(rows)})
    return collate_prompts(rows, tok.pad_token_id)


def test_the_model_calls_the_tool_reads_the_result_and_answers(tool_model):
    model, tok, _ = tool_model
    calls = []

    def multiply_logged(a: int, b: int) -> int:
        """Multiply two whole numbers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        calls.append((a, b))
        return a * b
    multiply_logged.__name__ = "multiply"
    loop = AgentLoop(HFRollout(model, tok), tok, {t.name: t for t in tools_from_functions([multiply_logged])},
                     AgentSettings(max_assistant_turns=4))
    out = loop.generate(_prompts(tok), SamplingParams(max_new_tokens=120, do_sample=False, logprobs=True))

    assert calls == [(12, 34), (12, 34)]  # one call per trajectory, run by the loop
    for i in range(2):
        seen = out["attention_mask"][i, out["prompts"].shape[1]:].bool()
        trained = out["response_mask"][i].bool()
        text = tok.decode(out["responses"][i][seen])
        assert text == f"{CALL}</s>408\nA: 408</s>"  # the whole trajectory, the result spliced in
        # Only the model's own tokens are trained on: both assistant turns, each with its eos.
        assert tok.decode(out["responses"][i][trained]) == f"{CALL}</s>408</s>"
        assert tok.decode(out["responses"][i][seen & ~trained]) == "408\nA: "
    assert out["agent_turns"].tolist() == [2.0, 2.0] and out["agent_tool_calls"].tolist() == [1.0, 1.0]
    assert out["agent_tool_errors"].tolist() == [0.0, 0.0]

    # The engine's log-probs of the model's tokens are the actor's over the whole trajectory.
    mask = out["response_mask"].bool()
    for packed in (False, True):  # padded and packed forward passes (use_remove_padding)
        with torch.no_grad():
            actor = compute_response_logprobs(model, out["input_ids"], out["attention_mask"], out["position_ids"],
                                              out["responses"], remove_padding=packed)
        actor = actor[0] if isinstance(actor, tuple) else actor
        torch.testing.assert_close(out["rollout_log_probs"][mask], actor[mask], atol=1e-4, rtol=0)
    assert (out["rollout_log_probs"][~mask] == 0).all()


def test_a_call_to_an_unknown_tool_and_the_turn_limit_end_the_trajectory_with_feedback(tool_model):
    model, tok, _ = tool_model
    loop = AgentLoop(HFRollout(model, tok), tok, {}, AgentSettings(max_assistant_turns=1))
    out = loop.generate(_prompts(tok, 1), SamplingParams(max_new_tokens=120, do_sample=False))
    seen = out["attention_mask"][0, out["prompts"].shape[1]:].bool()
    # One assistant turn allowed: the call is made, and the trajectory stops before any tool result.
    assert tok.decode(out["responses"][0][seen]) == f"{CALL}</s>"
    assert out["agent_turns"].tolist() == [1.0]

    loop = AgentLoop(HFRollout(model, tok), tok, {}, AgentSettings(max_assistant_turns=2))
    out = loop.generate(_prompts(tok, 1), SamplingParams(max_new_tokens=160, do_sample=False))
    seen = out["attention_mask"][0, out["prompts"].shape[1]:].bool()
    text = tok.decode(out["responses"][0][seen])
    assert "Error: no tool named 'multiply'; tools: " in text and out["agent_tool_errors"].tolist() == [1.0]
    assert json.loads(CALL[len("<tool_call>"):-len("</tool_call>")])["name"] == "multiply"


@pytest.mark.parametrize("engine", ["hf", "native"])
def test_main_ppo_trains_on_multi_turn_rollouts_with_a_file_of_tool_functions(tool_model, tmp_path, engine):
    from verl.trainer.main_ppo import main

    write_tool_task(tmp_path)
    out = tmp_path / "out"
    assert main(tool_task_args(tool_model[2], tmp_path, out, "actor_rollout_ref.actor.optim.lr=1e-4",
                               "actor_rollout_ref.rollout.temperature=0.5", "trainer.total_training_steps=2",
                               f"actor_rollout_ref.rollout.name={engine}")) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "agent/num_turns/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:  # every trajectory called the tool once and answered: two assistant turns
        assert r["agent/num_turns/mean"] == 2 and r["agent/tool_calls/mean"] == 1 and r["agent/tool_errors"] == 0
        assert r["critic/score/mean"] == 1.0
        assert "actor/pg_loss" in r
    assert rows[0]["val-core/calc/reward/mean@1"] == 1.0  # greedy validation runs the loop too


PYTHON_CALL = '<tool_call>{"name": "python", "arguments": {"code": "print(12*34)"}}</tool_call>'


def test_the_built_in_python_tool_runs_the_models_code_in_the_sandbox(tmp_path_factory, tmp_path):
    from verl.tools.registry import load_tools

    model, tok, _ = memorize(tmp_path_factory, "python-model", [[
        {"role": "user", "content": "12*34="}, {"role": "assistant", "content": PYTHON_CALL},
        {"role": "tool", "content": "408"}, {"role": "assistant", "content": "408"}]])
    (tmp_path / "tools.yaml").write_text("tools:\n  - class_name: verl.tools.python_tool.PythonTool\n")
    loop = AgentLoop(HFRollout(model, tok), tok, load_tools(tmp_path / "tools.yaml"), AgentSettings())
    out = loop.generate(_prompts(tok, 1), SamplingParams(max_new_tokens=120, do_sample=False))
    seen = out["attention_mask"][0, out["prompts"].shape[1]:].bool()
    # the program ran in the sandbox and its output is the spliced tool message; the model answers
    assert tok.decode(out["responses"][0][seen]) == f"{PYTHON_CALL}</s>408\nA: 408</s>"
    assert out["agent_tool_calls"].tolist() == [1.0] and out["agent_tool_errors"].tolist() == [0.0]


# Every estimator but gdpo (which needs a reward function with named components) on multi-turn
# trajectories: tool results are out of the loss, so every estimator sees the model's tokens only.
ESTIMATORS = ["gae", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "gpg",
              "optimal_token_baseline"]


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_every_estimator_trains_on_multi_turn_rollouts(tool_model, tmp_path, estimator):
    from verl.trainer.main_ppo import main

    write_tool_task(tmp_path)
    out = tmp_path / "out"
    critic = ["critic.ppo_micro_batch_size_per_gpu=1"] if estimator == "gae" else []
    assert main(tool_task_args(tool_model[2], tmp_path, out, f"algorithm.adv_estimator={estimator}", *critic,
                               "actor_rollout_ref.rollout.temperature=1.0", "trainer.total_training_steps=1",
                               "trainer.val_before_train=false", "actor_rollout_ref.actor.optim.lr=1e-3")) == 0
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert 0 < row["agent/tool_calls/mean"] < 1  # some trajectories called the tool, some did not
    # a learning signal: rewards differ (remax's greedy baseline, itself a multi-turn rollout, earns 1)
    assert row["critic/advantages/max"] > row["critic/advantages/min"]
    assert row["actor/grad_norm"] > 0
    assert ("critic/vf_loss" in row) == (estimator == "gae")  # the estimator asked for is the one that ran


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
    assert len(warned) == 1 and warned[0].startswith("UnscoredRounds.step returned reward None (first: row ")
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
    (WordyRounds, "WordyRounds.step returned reward 'high' for row 0: a turn's reward must be a finite number (or "
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


COUNTER_TOOL = '''
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse


class Multiply(BaseTool):
    """A stateful verl tool named like the trained call: it multiplies, starting from a per-row offset."""

    def __init__(self, config, tool_schema):
        super().__init__(config, tool_schema)
        self.offsets, self.released = {}, []

    async def create(self, instance_id=None, offset=0, **kwargs):
        instance_id = instance_id or f"i{len(self.offsets)}"
        self.offsets[instance_id] = offset
        return instance_id, ToolResponse()

    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text=str(parameters["a"] * parameters["b"] + self.offsets[instance_id])), 0.5, {}

    async def calc_reward(self, instance_id, **kwargs):
        return 0.25

    async def release(self, instance_id, **kwargs):
        self.released.append(instance_id)
'''


def _counter_tool_yaml(folder, module: str, monkeypatch):
    """A tool YAML declaring COUNTER_TOOL's Multiply, written as ``module`` (importable from ``folder``)."""
    (folder / f"{module}.py").write_text(COUNTER_TOOL)
    (folder / "tools.yaml").write_text(
        f"tools:\n  - class_name: {module}.Multiply\n    config: {{type: native}}\n    tool_schema:\n"
        "      type: function\n      function: {name: multiply, description: Multiply.}\n")
    monkeypatch.syspath_prepend(str(folder))
    return folder / "tools.yaml"


def test_a_verl_tool_class_gets_each_rows_create_kwargs_from_extra_info(tool_model, tmp_path, monkeypatch):
    from verl.tools.registry import load_tools

    model, tok, _ = tool_model
    tools = load_tools(_counter_tool_yaml(tmp_path, "row_tools", monkeypatch))
    prompts = _prompts(tok)
    prompts["extra_info"] = [{"tools_kwargs": {"multiply": {"create_kwargs": {"offset": k}}}} for k in (0, 1000)]
    out = AgentLoop(HFRollout(model, tok), tok, tools, AgentSettings(max_assistant_turns=2)).generate(
        prompts, SamplingParams(max_new_tokens=120, do_sample=False))
    results = []
    for i in range(2):
        seen = out["attention_mask"][i, out["prompts"].shape[1]:].bool()
        results.append(tok.decode(out["responses"][i][seen & ~out["response_mask"][i].bool()]))
    assert results == ["408\nA: ", "1408\nA: "]  # each row's own instance, created with its kwargs
    assert out["agent_reward"].tolist() == [0.75, 0.75]  # execute's 0.5 + calc_reward's 0.25
    assert sorted(tools["multiply"].released) == ["i0", "i1"]


def test_a_row_without_the_create_kwargs_a_tool_takes_is_warned_once_and_counted(tool_model, tmp_path, monkeypatch,
                                                                                 caplog):
    from verl.tools.registry import load_tools

    model, tok, _ = tool_model
    tools = load_tools(_counter_tool_yaml(tmp_path, "row_tools2", monkeypatch))
    prompts = _prompts(tok)
    prompts["extra_info"] = [{"tools_kwargs": {"multiply": {"create_kwargs": {"offset": 1000}}}}, {}]
    with caplog.at_level("WARNING", logger="verl.agent.agent_loop"):
        out = AgentLoop(HFRollout(model, tok), tok, tools, AgentSettings(max_assistant_turns=2)).generate(
            prompts, SamplingParams(max_new_tokens=120, do_sample=False))
    assert out["agent_defaulted"].tolist() == [0.0, 1.0]  # the second row created its instance with offset=0
    warned = [r.getMessage() for r in caplog.records if "tools_kwargs" in r.getMessage()]
    assert warned == ["tool multiply: rows without extra_info.tools_kwargs.multiply.create_kwargs.offset (first: row "
                      "1) create it with the default of offset; agent/defaulted_values counts them"]


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


class _SwapWhileToolsRun:
    """New weights (version 1) become pending when the tool is called: the partial rollout must take
    them before the next assistant turn (the weights change with tool calls in flight)."""

    def __init__(self, model, state):
        self.model, self.state = model, state
        self.version, self.ready, self.applied = 0, False, 0

    def pending(self) -> bool:
        return self.ready and self.version == 0

    def apply(self) -> None:
        self.model.load_state_dict(self.state)
        self.version, self.applied = 1, self.applied + 1


def test_a_partial_rollout_takes_new_weights_while_the_tool_runs_and_says_which_version_drew_what(tool_model):
    model, tok, _ = tool_model
    rollout_model, new = copy.deepcopy(model), copy.deepcopy(model)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.01 * torch.randn_like(p))
    swap = _SwapWhileToolsRun(rollout_model, new.state_dict())

    def multiply(a: int, b: int) -> int:
        """Multiply two whole numbers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        swap.ready = True
        return a * b
    loop = AgentLoop(HFRollout(rollout_model, tok), tok, {t.name: t for t in tools_from_functions([multiply])},
                     AgentSettings(max_assistant_turns=4))
    out = loop.generate(_prompts(tok), SamplingParams(max_new_tokens=120, do_sample=False, logprobs=True), swap=swap)
    assert swap.applied == 1 and out["policy_version_last"].tolist() == [1, 1]
    assert out["agent_tool_calls"].tolist() == [1.0, 1.0] and out["agent_turns"].tolist() == [2.0, 2.0]
    trained = out["response_mask"].bool()
    seen = out["attention_mask"][:, out["prompts"].shape[1]:].bool()
    tool_result = seen & ~trained
    # the first turn: the trained tokens before the tool's result; the second: those after it
    first_turn = trained & (tool_result.long().cumsum(1) == 0)
    second_turn = trained & ~first_turn
    assert first_turn.any() and second_turn.any()
    logprobs = {}
    for name, m in (("old", model), ("new", new)):
        with torch.no_grad():
            logprobs[name], _ = compute_response_logprobs(m, out["input_ids"], out["attention_mask"],
                                                          out["position_ids"], out["responses"])
    rollout = out["rollout_log_probs"]
    torch.testing.assert_close(rollout[first_turn], logprobs["old"][first_turn], atol=1e-4, rtol=0)
    torch.testing.assert_close(rollout[second_turn], logprobs["new"][second_turn], atol=1e-4, rtol=0)
    assert (logprobs["old"] - logprobs["new"])[second_turn].abs().max() > 1e-3
