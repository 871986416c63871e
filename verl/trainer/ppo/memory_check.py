"""The memory plan against the machine: the memory a rank may use, the refusal of a run that cannot fit
(``trainer.memory_check``), and the plans made before a launch (``main_ppo --plan``, ``verl doctor``).
What a rank holds is :mod:`verl.trainer.ppo.memory_plan`."""

from __future__ import annotations

import os

import torch

from verl.distributed.process_group import is_main_process, launched_distributed, launched_world_size
from verl.errors import VerlError
from verl.trainer.ppo.memory_plan import FIXES, GiB, MemoryPlan, logger, plan_memory


def available_memory(device: str, ranks_here: int) -> int | None:
    """Bytes one rank may use: its GPU's total memory, or on a CPU the memory available now shared
    by the ranks of this machine."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_properties(torch.device(device)).total_memory
    from verl.utils.memory import read_memory

    free, _ = read_memory()
    return free // max(ranks_here, 1) if free else None


HEADROOM = 0.9
"""A plan above this share of the memory available is warned about: measured peaks ran up to 15%
above the plan (the allocator's caches and fragmentation; on a CPU the heap grows between steps)."""


def check_fits(plan: MemoryPlan) -> None:
    """Refuses a plan whose peak exceeds the memory available: one message with the largest parts
    and what lowers each; warns when it leaves less than 10% of that memory free."""
    if not plan.available:
        return
    if plan.engine_problem:
        raise VerlError(f"vLLM on {plan.device}: {plan.engine_problem}. Fix it with: " + "; ".join(FIXES["vLLM engine"])
                        + ". trainer.memory_check=false skips this check")
    if plan.peak <= plan.available:
        if plan.peak > HEADROOM * plan.available:
            logger.warning("this run plans %.1f GiB per rank at its peak (%s), %.0f%% of the %.1f GiB available on "
                           "%s: the plan is an estimate (measured peaks ran up to 15%% above it), so the run may "
                           "still run out of memory; to leave room: %s", plan.peak / GiB, plan.peak_phase,
                           100 * plan.peak / plan.available, plan.available / GiB, plan.device,
                           "; ".join(plan.fixes()[:2]))
        return
    parts = ", ".join(f"{role} {part} {size / GiB:.1f} GiB" for (role, part), (size, _) in plan.largest(3))
    raise VerlError(f"this run needs about {plan.peak / GiB:.1f} GiB per rank at its peak ({plan.peak_phase}) "
                    f"but {plan.available / GiB:.1f} GiB is available on {plan.device}; the largest parts: {parts}. "
                    f"Lower it with: " + "; ".join(plan.fixes()) + ". `python -m verl.trainer.main_ppo ... --plan` "
                    "prints the whole plan; trainer.memory_check=false skips this check")


def plan_for_run(config, device: torch.device, hf_config=None, *, ahead: bool = False) -> MemoryPlan:
    """This rank's plan for the run ``config`` on ``device``, with the memory available to the rank:
    its ranks are torchrun's, or trainer.nnodes x trainer.n_gpus_per_node under Ray and ``ahead`` of a
    launch (``--plan``, ``verl doctor``: a plain process, not yet in the torchrun job it plans)."""
    trainer = config.trainer
    if trainer.backend == "ray" or (ahead and not launched_distributed()):
        ranks, here = trainer.nnodes * trainer.n_gpus_per_node, trainer.n_gpus_per_node
    else:
        ranks, here = launched_world_size(), int(os.environ.get("LOCAL_WORLD_SIZE", launched_world_size()))
    device = str(device) if device.type != "cuda" or device.index is not None else "cuda:0"
    # Ray across machines: the driver's machine says nothing of the others' memory (plan only, no refusal)
    known = trainer.backend != "ray" or trainer.nnodes == 1
    return plan_memory(config, hf_config, ranks=ranks, device=device,
                       available=available_memory(device, here) if known else None)


def plan_ahead(config) -> MemoryPlan:
    """The plan ``main_ppo --plan`` and ``verl doctor key=value`` give before a launch: of the ranks the config asks
    for, and for a GPU run from a machine without one (``trainer.device=cuda`` on a login node), planned on a GPU
    (offloads, vLLM's engine) whose memory is not known here (``available`` None: nothing is refused). The config
    checks the run makes (batch sizes over those ranks, ...) come first: no plan of a config the run refuses."""
    from verl.models.loading import resolve_device

    config.validate(dp_size=launched_world_size() if launched_distributed() else None)  # as build_rl_trainer does
    trainer = config.trainer
    if str(trainer.device).startswith("cuda") and not torch.cuda.is_available():
        ranks = launched_world_size() if launched_distributed() else trainer.nnodes * trainer.n_gpus_per_node
        return plan_memory(config, ranks=ranks, device="cuda")
    return plan_for_run(config, resolve_device(trainer.device), ahead=True)


def offloads_set(config) -> list[str]:
    """The offload switches that are on (each moves state from a GPU into CPU memory)."""
    sections = {"actor_rollout_ref.actor": config.actor_rollout_ref.actor.fsdp_config,
                "actor_rollout_ref.ref": config.actor_rollout_ref.ref.fsdp_config, "critic": config.critic.fsdp_config}
    return [f"{name}.fsdp_config.{switch}=true" for name, fsdp in sections.items()
            for switch in ("param_offload", "optimizer_offload") if getattr(fsdp, switch)]


def check_memory_plan(config, device: torch.device, hf_config=None) -> None:
    """Prints the plan (rank 0) and refuses a run that cannot fit (trainer.memory_check); on a CPU,
    says once that offload switches change nothing there (the state is in CPU memory already)."""
    offloads = offloads_set(config) if device.type == "cpu" else []
    if offloads and is_main_process():
        logger.warning("%s: on a CPU run the weights and optimizer state are in CPU memory already, so offloading "
                       "changes nothing (it frees GPU memory on a GPU); the memory plan counts them as resident",
                       ", ".join(offloads))
    plan = plan_for_run(config, device, hf_config)
    if is_main_process():
        print(plan.table(), flush=True)
    if config.trainer.memory_check:
        check_fits(plan)
