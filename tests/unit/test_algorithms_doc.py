"""docs/algorithms.md stays true: every algorithm name the code offers has a row, every config key
a row names exists, and the example command is a valid config."""

import re
import shlex
from pathlib import Path

import pytest

from verl.algorithms import ADV_ESTIMATORS, AGG_MODES, KL_KINDS, POLICY_LOSSES
from verl.config import TrainerConfig
from verl.trainer.ppo.build import check_algorithm_names

DOC = (Path(__file__).resolve().parents[2] / "docs" / "algorithms.md").read_text()
# Cells split at the pipes that are not escaped (formulas write |d| as \|d\|).
ROWS = [[cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip()[1:-1])] for line in DOC.splitlines()
        if line.startswith("| ") and not line.startswith("| name")]
SHORT = {"actor.": "actor_rollout_ref.actor.", "rollout.": "actor_rollout_ref.rollout."}


def _names(cell: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", cell))


def _keys(cell: str) -> list[str]:
    """Full dotted keys of a "config keys" cell; `.x` continues the previous key's section."""
    keys, section = [], ""
    for raw in re.findall(r"`([^`]+)`", cell):
        key = raw.split("=")[0]
        for short, full in SHORT.items():
            if key.startswith(short):
                key = full + key[len(short):]
        if key.startswith("."):
            key = section + key
        if key.endswith(".*"):
            key = key[:-2]
        section = key.rsplit(".", 1)[0]
        keys.append(key)
    return keys


def test_the_doc_is_one_table_with_five_columns():
    assert len(ROWS) > 30 and all(len(row) == 5 for row in ROWS), [r for r in ROWS if len(r) != 5]


@pytest.mark.parametrize("table", [ADV_ESTIMATORS, POLICY_LOSSES, AGG_MODES, KL_KINDS],
                         ids=["estimators", "policy losses", "agg modes", "kl kinds"])
def test_every_name_the_code_offers_has_a_row(table):
    documented = set().union(*(_names(row[0]) for row in ROWS))
    documented |= {part.strip(" `") for row in ROWS for part in row[0].split("/")}
    assert set(table) <= documented, set(table) - documented


def test_every_config_key_named_exists():
    config = TrainerConfig()
    keys = [key for row in ROWS for key in _keys(row[3])]
    assert len(keys) > 25
    for key in keys:
        assert config.describe(key), key


def test_the_example_command_is_a_valid_config():
    command = re.search(r"```bash\n(.*?)```", DOC, flags=re.S).group(1).replace("\\\n", " ")
    args = shlex.split(command)[3:]  # after "python -m verl.trainer.main_ppo"
    config = TrainerConfig.from_cli(args)
    config.validate()
    check_algorithm_names(config)
    assert config.algorithm.filter_groups.enable and config.actor_rollout_ref.actor.clip_ratio_high == 0.28
