"""Fault injection: scoring bundles that hang, crash, raise, leak memory, print, read secrets or return
non-numbers. Each costs one score (0, error recorded and counted), never the run; too many stop it clearly."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from strop.errors import StropError
from strop.rl import GRPOConfig, run_grpo
from strop.scoring import score_terms, terms_from_spec
from strop.scoring.sandbox import SandboxError, SandboxPool
from test_control import home, workspace  # noqa: F401 - fixtures

BUNDLE = '''
import os, signal, time

def good(data_source=None, solution_str=None, ground_truth=None, extra_info=None):
    return 1.0 if solution_str == ground_truth else 0.5

def hang(**kw):
    while True:
        time.sleep(1)

def segfault(**kw):
    os.kill(os.getpid(), signal.SIGSEGV)

def exits(**kw):
    os._exit(3)

def raises(**kw):
    raise ValueError("bad ground truth format")

def nan(**kw):
    return float("nan")

def inf(**kw):
    return float("-inf")

def text(**kw):
    return "five"

def memory_bomb(**kw):
    blocks = []
    while True:
        blocks.append(bytearray(256 * 1024 * 1024))

def chatty(**kw):
    print("debugging output on stdout", flush=True)
    return 0.25

def secret(**kw):
    return 1.0 if any("SECRET" in k or "API_KEY" in k for k in os.environ) else 0.0

def parent_secret(**kw):
    # the parent runs as the same user: its /proc environ would hold the secrets, were it readable
    try:
        with open(f"/proc/{os.getppid()}/environ", "rb") as handle:
            environ = handle.read()
    except OSError:
        return 0.0
    return 1.0 if b"hunter2" in environ or b"sk-test" in environ else 0.0

def flaky(data_source=None, solution_str=None, ground_truth=None, extra_info=None):
    if "7" in (solution_str or ""):
        raise RuntimeError("flaky grader")
    return 0.0

def mostly_fails(data_source=None, solution_str=None, ground_truth=None, extra_info=None):
    if len(solution_str or "") % 4:
        raise RuntimeError("mostly broken grader")
    return 1.0  # the calls that pass give the group a spread, so the step has something to update
'''


@pytest.fixture()
def bundle(tmp_path):
    folder = tmp_path / "bundle"
    folder.mkdir()
    (folder / "reward.py").write_text(textwrap.dedent(BUNDLE))
    return folder


@pytest.fixture()
def pool():
    with SandboxPool(timeout=3.0, memory_mb=512) as p:
        yield p


def call(pool, bundle, function, solution="42", truth="42"):
    return pool.grader(f"{bundle}#reward:{function}")(solution_str=solution, ground_truth=truth)


def test_a_good_grader_gives_its_scores(pool, bundle):
    assert call(pool, bundle, "good") == 1.0 and call(pool, bundle, "good", "41") == 0.5


@pytest.mark.parametrize("function, reason", [
    ("hang", "timed out after 3 s"),
    ("segfault", "signal SIGSEGV"),
    ("exits", "exit status 3"),
    ("raises", "ValueError: bad ground truth format"),
    ("memory_bomb", "MemoryError"),
    ("text", "returned str 'five'"),
])
def test_each_fault_fails_one_call_and_the_next_call_works(pool, bundle, function, reason):
    started = time.monotonic()
    with pytest.raises(SandboxError, match=reason):
        call(pool, bundle, function)
    assert time.monotonic() - started < 20  # a hang is cut at the timeout, not waited out
    assert call(pool, bundle, "good") == 1.0  # a fresh worker where the old one died


def test_a_relative_bundle_path_means_the_callers_folder(pool, bundle, monkeypatch):
    monkeypatch.chdir(bundle.parent)  # the workers run elsewhere, in the pool's temporary folder
    pool.check("./bundle#reward:good")
    assert pool.grader("bundle#reward:good")(solution_str="41", ground_truth="42") == 0.5


def test_a_crash_or_hang_costs_its_call_not_the_worker(pool, bundle):
    # each call runs in a process forked for it: the worker that imported the bundle lives on
    for function in ("segfault", "hang", "exits", "memory_bomb"):
        with pytest.raises(SandboxError):
            call(pool, bundle, function)
    assert pool.replaced == 0
    started = time.monotonic()
    assert call(pool, bundle, "good") == 1.0
    assert time.monotonic() - started < 1.0  # no new worker to start


def test_nan_and_infinity_score_zero_with_the_reason(pool, bundle):
    for function, shown in (("nan", "nan"), ("inf", "-inf")):
        terms = terms_from_spec([{"name": "t", "grader": f"{bundle}#reward:{function}"}], sandbox=pool)
        scored = score_terms(terms, "42", type("Row", (), {"answer": "42", "question": "q", "extra": {}})())
        assert scored.scores == {"t": 0.0} and f"returned {shown}" in scored.errors[0]


def test_prints_do_not_break_the_protocol(pool, bundle):
    assert [call(pool, bundle, "chatty") for _ in range(3)] == [0.25] * 3


def test_no_secrets_reach_the_grader(pool, bundle, monkeypatch):
    monkeypatch.setenv("MY_SECRET_TOKEN", "hunter2")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with SandboxPool(timeout=3.0) as fresh:  # workers start after the variables are set
        assert call(fresh, bundle, "secret") == 0.0
    assert os.environ["OPENAI_API_KEY"] == "sk-test"
    # /proc/PID/environ shows the environment a process started with, so the parent here is a fresh process
    # given the secrets at its start, as a user's shell gives them to `strop train`
    script = ("import sys\nfrom strop.scoring.sandbox import SandboxPool\nwith SandboxPool(timeout=5.0) as pool:\n"
              "    print(pool.grader(sys.argv[1])(solution_str='x', ground_truth='x'))\n")
    done = subprocess.run([sys.executable, "-c", script, f"{bundle}#reward:parent_secret"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "MY_SECRET_TOKEN": "hunter2"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0.0"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl and /proc are Linux's")
def test_a_pool_makes_its_process_non_dumpable_and_liveness_checks_still_work():
    from strop.control.processes import alive
    from strop.scoring.sandbox import _drop_capabilities
    # the process that holds a pool is a run worker in the control plane: same module and argument on its cmdline
    script = ("import ctypes, sys, time\nfrom strop.scoring.sandbox import SandboxPool\npool = SandboxPool()\n"
              "print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0), flush=True)\ntime.sleep(60)\n")
    worker = subprocess.Popen([sys.executable, "-c", script, "strop.control.worker", "run-undumpable"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline().strip() == "0"  # PR_GET_DUMPABLE: not dumpable
        assert alive(worker.pid, "strop.control.worker", "run-undumpable")
        # `strop runs get` from another process of the same user, without root's capabilities
        check = ("import sys\nfrom strop.control.processes import alive\n"
                 "print(alive(int(sys.argv[1]), 'strop.control.worker', 'run-undumpable'))\n")
        done = subprocess.run([sys.executable, "-c", check, str(worker.pid)], capture_output=True, text=True,
                              timeout=60, preexec_fn=_drop_capabilities)
        assert done.stdout.strip() == "True", done.stderr
    finally:
        worker.kill()
        worker.wait()


def test_a_bundle_that_does_not_load_is_refused_before_training(pool, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "reward.py").write_text("import not_a_module_anywhere\n")
    with pytest.raises(StropError, match="not_a_module_anywhere"):
        terms_from_spec([{"grader": f"{broken}#reward:compute_score"}], sandbox=pool)


def _config(tiny_model_dir, bundle, function, **changes):
    settings = dict(base_model=str(tiny_model_dir), dataset="synthetic:add", dataset_limit=8, batch_size=2,
                    group_size=4, max_steps=2, max_completion_length=8, save_every=1, grader_timeout=3.0,
                    reward_terms=[{"name": "correct", "grader": "builtin:gsm8k"},
                                  {"name": "user", "grader": f"{bundle}#reward:{function}", "weight": 0.5}])
    return GRPOConfig(**{**settings, **changes})


def test_a_run_goes_on_through_grader_faults(tiny_model_dir, bundle, tmp_path):
    # the flaky grader fails on completions that contain a 7: some calls, not most
    result = run_grpo(_config(tiny_model_dir, bundle, "flaky", max_reward_error_fraction=0.9), tmp_path / "run",
                      progress=False)
    assert len(result.metrics) == 2
    rollouts = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    failed = [r for r in rollouts if r["errors"]]
    assert sum(m["rewardErrors"] for m in result.metrics) == len(failed)
    assert all("flaky grader" in r["errors"][0] for r in failed)  # recorded with the completion it scored


def test_a_run_whose_grader_mostly_fails_stops_with_the_first_errors(tiny_model_dir, bundle, tmp_path):
    with pytest.raises(StropError) as err:
        run_grpo(_config(tiny_model_dir, bundle, "raises", max_reward_error_fraction=0.25), tmp_path / "run",
                 progress=False)
    message = str(err.value)
    assert "step 0: 8 of 16 grader calls failed" in message and "bad ground truth format" in message
    assert "maxErrorFraction" in message


def test_a_step_over_the_error_limit_is_not_applied(tiny_model_dir, bundle, tmp_path):
    import strop

    class Recording(strop.ServiceClient):  # the real service; it only keeps the training client it made
        def create_lora_training_client(self, *args, **kwargs):
            self.training = super().create_lora_training_client(*args, **kwargs)
            return self.training

    service = Recording()
    config = _config(tiny_model_dir, bundle, "mostly_fails", max_reward_error_fraction=0.25, group_size=8)
    with pytest.raises(StropError, match="mostly broken grader"):
        run_grpo(config, tmp_path / "run", progress=False, service=service)
    assert service.training.trainer.steps == 0  # the failing step's optimizer step never ran


def test_the_descriptor_error_limit_fails_a_run_with_the_first_errors(workspace, capsys):
    from test_control import descriptor, run
    folder = workspace / "mostly"
    folder.mkdir()
    (folder / "reward.py").write_text(textwrap.dedent(BUNDLE).replace("def mostly_fails(", "def compute_score("))
    assert run(capsys, "registry", "bundles", "register", "faults/mostly", "-f", folder)[0] == 0
    terms = [{"kind": "rule", "weight": 1.0, "bundle": "faults/mostly", "module": "reward"}]
    path = descriptor(workspace, **{"config.reward.terms": terms, "config.reward.maxErrorFraction": 0.3,
                                    "config.rlHyperparams.groupSize": 4})
    run_id = run(capsys, "runs", "start", "-f", path, "--jq", ".runId")[1].strip()
    code, out, _ = run(capsys, "runs", "wait", run_id, "--exit-status", "--timeout", "300", "-o", "json")
    assert code == 1
    info = json.loads(run(capsys, "runs", "get", run_id, "-o", "json")[1])
    assert info["status"] == "failed" and "step 0:" in info["error"]
    assert "more than the 30% allowed" in info["error"] and "mostly broken grader" in info["error"]
    assert run(capsys, "runs", "metrics", run_id, "-o", "json")[1].strip() == "[]"  # no row for the refused step


def test_evaluations_score_bundles_in_the_sandbox_too(tiny_model_dir, bundle):
    from strop.data import Row
    from strop.evals import evaluate_local
    rows = [Row(question="What is 1 + 1?", answer="#### 2")]
    for function, reason in (("segfault", "signal SIGSEGV"), ("raises", "bad ground truth format")):
        result = evaluate_local(str(tiny_model_dir), rows, f"{bundle}#reward:{function}", max_tokens=4)
        [item] = result.items
        assert item.score == 0.0 and reason in item.error  # the evaluation itself went on
