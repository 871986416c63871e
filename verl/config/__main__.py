"""Generated config documents, kept in the repository and checked by a unit test:

    python -m verl.config > verl/config/ppo_trainer.yaml             # the commented default YAML
    python -m verl.config reference > docs/config_reference.md       # every key: type, default, help
    python -m verl.config verl-keys > docs/config_verl_keys.md       # verl keys refused / without effect
"""

import sys

from verl.config.schema import render_default_yaml, render_reference

if sys.argv[1:] == ["reference"]:
    print(render_reference(), end="")
elif sys.argv[1:] == ["verl-keys"]:
    from verl.config.verl_keys_doc import render_verl_keys

    print(render_verl_keys(), end="")
elif not sys.argv[1:]:
    print(render_default_yaml(), end="")
else:
    sys.exit("usage: python -m verl.config [reference | verl-keys]")
