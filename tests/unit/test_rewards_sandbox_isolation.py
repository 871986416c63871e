"""Sandbox escapes (issue 9): every isolation attack is contained, with the audit hook on and off,
as root and as an unprivileged user, and the weak modes keep what must hold (see ``sandbox_attacks.py``)."""

import pytest

from sandbox_attacks import (ATTACKS, BLOCKED_BY_HOOK, LINUX_ONLY, SECRET, WEAK_MODE_ATTACKS, WEAK_MODE_HOOK_ONLY,
                             _layers_or_skip, driver_report)

pytestmark = LINUX_ONLY


@pytest.mark.parametrize("hook", [True, False], ids=["hook", "no-hook"])
@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("mode", ["root", "user"])
def test_isolation_attack_is_contained(mode, attack, hook):
    entry = driver_report(mode)["attacks"][attack + ("" if hook else "/no-hook")]
    assert "raised" not in entry, entry  # run_python returned normally, whatever the program did
    _layers_or_skip(entry["layers"], mode)
    assert entry["escaped"] == [], entry
    assert "LEAK" not in entry["stdout"] and SECRET not in entry["stdout"] + entry["stderr"], entry
    if hook and attack in BLOCKED_BY_HOOK:
        assert entry["status"] == "blocked", entry


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_as_root_without_a_user_namespace_the_os_layers_still_hold(attack):
    """Root's fallback where user namespaces are refused: the other namespaces, own uid, new root."""
    entry = driver_report("root-plain")["attacks"][attack + "/no-hook"]
    assert "raised" not in entry, entry
    _layers_or_skip(entry["layers"], "root")
    assert not entry["layers"]["user_namespace"]
    assert entry["escaped"] == [] and "LEAK" not in entry["stdout"], entry


@pytest.mark.parametrize("attack", WEAK_MODE_ATTACKS + WEAK_MODE_HOOK_ONLY)
@pytest.mark.parametrize("mode", ["root-weak", "user-weak"])
def test_without_namespaces_the_trainer_stays_unreadable_and_the_hook_still_blocks(mode, attack):
    report = driver_report(mode)
    entries = {name: entry for name, entry in report["attacks"].items() if name.split("/")[0] == attack}
    assert len(entries) == (1 if attack in WEAK_MODE_HOOK_ONLY else 2)
    for name, entry in entries.items():
        assert "raised" not in entry, entry
        assert not entry["layers"]["pid_namespace"] and not entry["layers"]["private_mounts"]
        assert entry["escaped"] == [], (name, entry)
        assert "LEAK" not in entry["stdout"] and SECRET not in entry["stdout"] + entry["stderr"], entry
        if attack in WEAK_MODE_HOOK_ONLY:
            assert entry["status"] == "blocked", entry
    assert report["dumpable"] == 0  # PR_SET_DUMPABLE was cleared in the trainer


@pytest.mark.parametrize("mode", ["root", "user", "root-weak", "user-weak"])
def test_weak_isolation_is_announced_once_and_only_when_weak(mode):
    report = driver_report(mode)
    weak = [w for w in report["warnings"] if "WEAK ISOLATION" in w]
    if mode.endswith("weak"):
        assert len(weak) == 1 and "network_namespace" in weak[0], report["warnings"]
    else:
        assert weak == [], report["warnings"]
