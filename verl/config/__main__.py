"""`python -m verl.config > verl/config/ppo_trainer.yaml` regenerates the commented default YAML."""

from verl.config.schema import render_default_yaml

print(render_default_yaml(), end="")
