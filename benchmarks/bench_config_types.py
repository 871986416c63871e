"""Which type system should own the config's typing: the config's own (`verl.config.coerce`),
pydantic, or OmegaConf structured configs? Measured side by side on TrainerConfig's schema.

    .venv/bin/python benchmarks/bench_config_types.py

pydantic and OmegaConf are given mirror dataclasses of the schema (the same field names,
annotations and defaults, without verl's rules), since neither can take ConfigNode sections as
they are. Prints build times (best of 20) and what each says or does for the same wrong or
textual values; docs/architecture.md quotes the result and the decision.
"""

from __future__ import annotations

import copy
import dataclasses
import time
import typing

import pydantic
from omegaconf import OmegaConf

from verl.config import TrainerConfig
from verl.config.fields import field_specs
from verl.errors import ConfigError

OVERRIDES = ["actor_rollout_ref.actor.optim.lr=1e-6", "data.train_batch_size=64", "trainer.total_epochs=3",
             "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4", "trainer.logger=[console]"]


def mirror(cls: type, strict: bool, memo: dict | None = None) -> type:
    """A plain dataclass with ``cls``'s fields; with ``strict``, scalar leaves refuse text for numbers."""
    memo = {} if memo is None else memo
    if cls not in memo:
        fields = []
        for spec in field_specs(cls).values():
            if spec.node_type is not None:
                tp = mirror(spec.node_type, strict, memo)
                fields.append((spec.name, tp, dataclasses.field(default_factory=tp)))
                continue
            tp = spec.type
            if strict and tp in (int, float, bool, str):
                tp = typing.Annotated[tp, pydantic.Strict()]
            default = spec.default
            if isinstance(default, (list, dict)):
                fields.append((spec.name, tp, dataclasses.field(default_factory=lambda d=default: copy.deepcopy(d))))
            else:
                fields.append((spec.name, tp, dataclasses.field(default=default)))
        memo[cls] = dataclasses.make_dataclass(f"Mirror{cls.__name__}", fields)
    return memo[cls]


def best_ms(fn, n: int = 20) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def first_line(fn) -> str:
    try:
        fn()
    except pydantic.ValidationError as e:
        first = e.errors()[0]
        return f"{first['msg']} ({first['type']})"
    except ConfigError as e:
        return str(e).strip().splitlines()[0]
    return "accepted"


def main() -> dict:
    data = TrainerConfig().to_dict()
    out = {"ours_from_dict_ms": best_ms(lambda: TrainerConfig.from_dict(data)),
           "ours_from_overrides_ms": best_ms(lambda: TrainerConfig.from_overrides(OVERRIDES))}
    start = time.perf_counter()
    strict, lax = pydantic.TypeAdapter(mirror(TrainerConfig, True)), pydantic.TypeAdapter(mirror(TrainerConfig, False))
    out["pydantic_schema_build_ms"] = 1e3 * (time.perf_counter() - start) / 2
    out["pydantic_strict_ms"] = best_ms(lambda: strict.validate_python(data))
    out["pydantic_lax_ms"] = best_ms(lambda: lax.validate_python(data))

    def with_value(path: str, value):
        changed = copy.deepcopy(data)
        *parents, name = path.split(".")
        node = changed
        for part in parents:
            node = node[part]
        node[name] = value
        return changed

    lr = "actor_rollout_ref.actor.optim.lr"
    out["python '1e-4' for a float: ours"] = first_line(lambda: TrainerConfig.from_dict(with_value(lr, "1e-4")))
    out["python '1e-4' for a float: pydantic strict"] = first_line(lambda: strict.validate_python(with_value(lr, "1e-4")))
    out["text 2.5 for a str: ours"] = first_line(lambda: TrainerConfig.from_overrides(["trainer.project_name=2.5"]))
    out["text 2.5 for a str: pydantic lax"] = first_line(
        lambda: lax.validate_python(with_value("trainer.project_name", 2.5)))
    try:
        start = time.perf_counter()
        OmegaConf.structured(mirror(TrainerConfig, False))
        out["omegaconf_structured"] = f"built in {1e3 * (time.perf_counter() - start):.1f} ms"
    except Exception as e:  # noqa: BLE001 - what it says is the finding
        out["omegaconf_structured"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"
    start = time.perf_counter()
    OmegaConf.create(data)
    out["omegaconf_untyped_create_ms"] = 1e3 * (time.perf_counter() - start)
    return out


if __name__ == "__main__":
    for key, value in main().items():
        print(f"{key:45s} {value:.2f}" if isinstance(value, float) else f"{key:45s} {value}")
