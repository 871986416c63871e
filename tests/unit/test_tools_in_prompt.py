"""A multi-turn run's tool schemas reach every prompt through the tokenizer's chat template
(``apply_chat_template(..., tools=...)``), as a tool-tuned model's template (Qwen2.5's and
Hermes' put them in a ``<tools>`` block of the system turn) expects them."""

import json

from verl.config import TrainerConfig
from verl.data import write_parquet
from verl.data.custom import create_rl_dataset
from verl.models.tiny import build_char_tokenizer
from verl.tools import builtin
from verl.trainer.ppo.build import agent_tool_schemas

# A small template of that kind: the tools as JSON lines in a <tools> block before the conversation.
TOOLS_TEMPLATE = ("{% if tools %}<tools>\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n{% endif %}"
                  "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
                  "{% if add_generation_prompt %}assistant: {% endif %}")


def _prompt(tmp_path, tools, **data_keys):
    config = TrainerConfig()
    config.data.max_prompt_length = 1000
    for key, value in data_keys.items():
        setattr(config.data, key, value)
    write_parquet([{"prompt": [{"role": "user", "content": "123*45="}], "data_source": "calc",
                    "reward_model": {"ground_truth": "5535"}}], tmp_path / "p.parquet")
    tok = build_char_tokenizer(TOOLS_TEMPLATE)
    return tok.decode(create_rl_dataset(tmp_path / "p.parquet", tok, config.data, tools=tools)[0]["input_ids"])


def test_the_tools_of_a_multi_turn_run_are_rendered_into_every_prompt(tmp_path):
    multi_turn = TrainerConfig().actor_rollout_ref.rollout.multi_turn
    multi_turn.function_tool_path = builtin.__file__
    assert agent_tool_schemas(multi_turn) is None  # enable=false: single-turn, nothing offered
    multi_turn.enable = True
    schemas = agent_tool_schemas(multi_turn)
    lines = _prompt(tmp_path, schemas).splitlines()
    assert lines[0] == "<tools>" and lines[2:] == ["</tools>", "user: 123*45=", "assistant: "]
    function = json.loads(lines[1])["function"]  # the schema derived from the function's signature and docstring
    assert function["name"] == "calculator" and function["parameters"]["required"] == ["expression"]
    assert function["description"] == "Evaluate an arithmetic expression exactly."

    # data.chat_template_kwargs.tools, when set, is what the template gets instead
    assert _prompt(tmp_path, schemas, chat_template_kwargs={"tools": []}) == "user: 123*45=\nassistant: "
