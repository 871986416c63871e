"""Sandbox escapes (issues 9 and 22): every isolation attack is contained, with the audit hook on and
off (and, for the attacks below the hook, the system-call filter off too), as root and as an
unprivileged user, and the weak modes keep what must hold (see ``sandbox_attacks.py``)."""

import pytest

from sandbox_attacks import (ATTACKS, BLOCKED_BY_HOOK, BLOCKED_BY_SECCOMP, LANDLOCK_ATTACKS, LINUX_ONLY,
                             NAMESPACED_HOOK_ONLY, NATIVE, NO_SECCOMP_ATTACKS, SECRET, WEAK_MODE_ATTACKS,
                             WEAK_MODE_HOOK_ONLY, _layers_or_skip, driver_report)

pytestmark = LINUX_ONLY
VARIANTS = [(attack, variant) for attack in sorted(ATTACKS) for variant in ("hook", "no-hook", "no-seccomp")
            if not (variant == "hook" and attack.startswith("syscall_"))
            and (variant != "no-seccomp" or attack in NO_SECCOMP_ATTACKS)
            and not (variant == "no-hook" and attack in NAMESPACED_HOOK_ONLY)]


def entry_of(report, attack, variant):
    key = attack + {"hook": "", "no-hook": "/no-hook", "no-seccomp": "/no-seccomp"}[variant]
    if key not in report["attacks"] and attack in NATIVE:
        pytest.skip("no C compiler here to build the native-code attack")
    return report["attacks"][key]


@pytest.mark.parametrize("attack, variant", VARIANTS, ids=[f"{a}-{v}" for a, v in VARIANTS])
@pytest.mark.parametrize("mode", ["root", "user"])
def test_isolation_attack_is_contained(mode, attack, variant):
    entry = entry_of(driver_report(mode), attack, variant)
    assert "raised" not in entry, entry  # run_python returned normally, whatever the program did
    _layers_or_skip(entry["layers"], mode)
    assert entry["escaped"] == [], entry
    assert "LEAK" not in entry["stdout"] and SECRET not in entry["stdout"] + entry["stderr"], entry
    if variant == "hook" and attack in BLOCKED_BY_HOOK:
        assert entry["status"] == "blocked", entry
    if variant != "no-seccomp" and attack in BLOCKED_BY_SECCOMP:
        assert entry["status"] == "blocked" and entry["layers"]["seccomp"], entry  # SIGSYS, hook or not
    if variant == "no-seccomp":
        assert not entry["layers"]["seccomp"] and entry["layers"]["own_keyring"], entry


@pytest.mark.parametrize("mode", ["root", "user"])
def test_the_sandbox_sees_a_minimal_dev_an_empty_shm_and_no_native_code_from_its_directory(mode):
    report = driver_report(mode)
    listing = entry_of(report, "device_nodes", "no-seccomp")
    _layers_or_skip(listing["layers"], mode)
    assert listing["layers"]["private_dev"] and listing["layers"]["private_shm"]
    assert listing["stdout"].splitlines()[-1] == str(sorted(
        ["fd", "full", "null", "random", "shm", "stderr", "stdin", "stdout", "urandom", "zero"]))
    # what the program made in /dev/shm is in its own tmpfs, gone with the run; the trainer's file is not there
    assert entry_of(report, "host_shm", "no-seccomp")["stdout"].splitlines()[-1] == "/dev/shm holds ['verl-sandbox-made']"
    loaded = entry_of(report, "native_code_via_workdir", "no-seccomp")
    assert loaded["stdout"].startswith("not loaded"), loaded  # the working directory is noexec


@pytest.mark.parametrize("attack", sorted(set(ATTACKS) - set(NAMESPACED_HOOK_ONLY)))
def test_as_root_without_a_user_namespace_the_os_layers_still_hold(attack):
    """Root's fallback where user namespaces are refused: the other namespaces, own uid, new root."""
    entry = entry_of(driver_report("root-plain"), attack, "no-hook")
    assert "raised" not in entry, entry
    _layers_or_skip(entry["layers"], "root")
    assert not entry["layers"]["user_namespace"]
    assert entry["escaped"] == [] and "LEAK" not in entry["stdout"], entry


@pytest.mark.parametrize("attack", WEAK_MODE_ATTACKS + WEAK_MODE_HOOK_ONLY)
@pytest.mark.parametrize("mode", ["root-weak", "user-weak"])
def test_without_namespaces_the_trainer_stays_unreadable_and_the_hook_and_filter_still_block(mode, attack):
    report = driver_report(mode)
    entries = {name: entry for name, entry in report["attacks"].items() if name.split("/")[0] == attack}
    if not entries and attack in NATIVE:
        pytest.skip("no C compiler here to build the native-code attack")
    assert len(entries) == (1 if attack in WEAK_MODE_HOOK_ONLY or attack.startswith("syscall_") else 2)
    for name, entry in entries.items():
        assert "raised" not in entry, entry
        assert not entry["layers"]["pid_namespace"] and not entry["layers"]["private_mounts"]
        if attack in LANDLOCK_ATTACKS and not entry["layers"]["landlock"]:
            pytest.skip("this kernel has no Landlock: without namespaces nothing race-free confines writes")
        assert entry["escaped"] == [], (name, entry)
        assert "LEAK" not in entry["stdout"] and SECRET not in entry["stdout"] + entry["stderr"], entry
        if attack in WEAK_MODE_HOOK_ONLY:
            assert entry["status"] == "blocked", entry
        if attack in BLOCKED_BY_SECCOMP or attack in NATIVE:  # native code loads here, and is then killed
            # (as root, a run's own uid cannot read a venv's stdlib under /root: it never gets ctypes or fcntl)
            unreadable = mode == "root-weak" and any(f"No module named '{name}'" in entry["stderr"]
                                                     for name in ("ctypes", "fcntl"))
            assert unreadable or entry["status"] == "blocked" and entry["layers"]["seccomp"], entry
    assert report["dumpable"] == 0  # PR_SET_DUMPABLE was cleared in the trainer


@pytest.mark.parametrize("mode", ["root", "user", "root-weak", "user-weak"])
def test_weak_isolation_is_announced_once_and_only_when_weak(mode):
    report = driver_report(mode)
    weak = [w for w in report["warnings"] if "WEAK ISOLATION" in w]
    if mode.endswith("weak"):
        assert len(weak) == 1 and "network_namespace" in weak[0], report["warnings"]
        # What it says a program can still do matches the layers it got: where Landlock holds, reads are
        # confined too (it said "may read (and chmod) what this uid may").
        landlock = any(e.get("layers", {}).get("landlock") for e in report["attacks"].values())
        assert ("reads to it and the system directories" in weak[0]) == landlock, weak[0]
        assert ("may read and write what this uid may" in weak[0]) != landlock, weak[0]
    else:
        assert weak == [], report["warnings"]


@pytest.mark.parametrize("mode", ["root", "user", "root-weak", "user-weak"])
def test_a_run_cannot_fill_its_working_directory_with_directories_for_the_trainer_to_remove(mode):
    """Removing a directory costs a host file system ~10 times what making one does: in weak mode the
    filter refuses mkdir in the host working directory; with namespaces the private tmpfs caps the count."""
    report = driver_report(mode)
    entries = {name: entry for name, entry in report["attacks"].items() if name.split("/")[0] == "many_directories"}
    assert len(entries) == 2  # hook on and off
    for name, entry in entries.items():
        assert "raised" not in entry and entry["escaped"] == [], (name, entry)
        assert "MADE " in entry["stdout"], entry  # (the old code: the run timed out making directories)
        made = int(entry["stdout"].split("MADE ")[1])
        if mode.endswith("weak"):
            assert made == 0 and "PermissionError" in entry["stdout"] and entry["layers"]["seccomp"], entry
        else:
            assert 0 < made <= sandbox_inodes(), entry  # the tmpfs's nr_inodes: full, not the 100,000 tried


def sandbox_inodes():
    """The nr_inodes of many_directories' working tmpfs."""
    from sandbox_attacks import ATTACK_LIMITS, LIMITS
    from verl.rewards.sandbox import SandboxLimits

    return max(64, SandboxLimits(**{**LIMITS, **ATTACK_LIMITS["many_directories"]}).max_disk_bytes // 4096)
