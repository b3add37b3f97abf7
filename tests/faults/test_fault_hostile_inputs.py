"""Fault injection: hostile input. Text a model or a person wrote is parsed in bounded time; every size and
count a run can be described with has an upper limit, the same for descriptors, GRPOConfig and `strop train`;
a dry run runs no code from a module a descriptor names; names are checked wherever they are accepted; special
files are refused before anything opens them.

Each parser gets strings built to make it slow (long runs of whitespace, digits and commas, `####`, unclosed
and nested brackets, a megabyte and more) and must answer each within PARSE_BUDGET_S."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from test_control import descriptor, home, run, workspace  # noqa: F401 - shared fixtures and helpers

PARSE_BUDGET_S = 0.5
HARD_STOP_S = 5.0  # a parser still running by then is stopped, so a quadratic one fails instead of hanging
MB = 1 << 20

HOSTILE = {
    "whitespace": " " * MB,
    "tabs and newlines": "\t\n" * (MB // 2),
    "digit-comma runs": "1," * 400_000,
    "thousands groups": "1" + ",234" * 250_000,
    "a long digit run": "9" * MB,
    "#### runs": "####" * 250_000,
    "#### then spaces": "####" + " " * MB,
    "#### then stars": "#### *" * 150_000,
    "unclosed boxes": "\\boxed{" * 150_000,
    "nested boxes": "\\boxed{" * 75_000 + "}" * 75_000,
    "unclosed braces": "{" * MB,
    "unclosed brackets": "[" * MB,
    "nested fractions": "\\boxed{" + "\\frac{1}{" * 100_000,
    "a megabyte of prose": "the apples cost " * 70_000,
    "minus signs": "-" * MB,
}


class Overtime(BaseException):
    """Raised by the hard stop; a BaseException, so code under test that catches Exception cannot swallow it."""


@contextlib.contextmanager
def hard_stop(seconds: float = HARD_STOP_S):
    def stop(*_):
        raise Overtime()
    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.5)  # and again every 0.5 s, in case one is swallowed
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def slow_cases(cases: dict, parse) -> list[str]:
    """The cases `parse` takes longer than PARSE_BUDGET_S on, with their times ('stopped' past HARD_STOP_S)."""
    slow = []
    for name, text in cases.items():
        t0 = time.perf_counter()
        try:
            with hard_stop():
                parse(text)
        except Overtime:
            slow.append(f"{name}: stopped after {HARD_STOP_S} s")
            continue
        elapsed = time.perf_counter() - t0
        if elapsed > PARSE_BUDGET_S:
            slow.append(f"{name}: {elapsed:.2f} s")
    return slow


# ---- parsers of model and user text ----------------------------------------------------------------------

def test_gsm8k_answers_are_read_in_bounded_time():
    from strop.scoring.gsm8k import compute_score, extract_answer, format_score, gold_answer

    def grade(text):
        extract_answer(text)
        compute_score(solution_str=text, ground_truth="#### 7")
        format_score(solution_str=text)
        with contextlib.suppress(ValueError):  # a ground truth with no number is refused, never slow
            gold_answer(text)

    assert slow_cases(HOSTILE, grade) == []
    # answers still grade as before, a long completion's final answer included
    assert compute_score(solution_str="The total is \\boxed{1,234}.", ground_truth="... #### 1234") == 1.0
    assert compute_score(solution_str="so the answer is 18 dollars", ground_truth="#### 18") == 1.0
    assert compute_score(solution_str="the apples cost 3 " * 60_000 + "in all #### 42", ground_truth="#### 42") == 1.0
    assert gold_answer("1,2," * 100_000 + "#### 1,000") == "1000"


def test_judge_verdicts_are_parsed_in_bounded_time_and_refused_with_a_reason():
    from strop.evals.judge import metrics_from, parse_verdict
    metrics = metrics_from(None)
    verdict = '{"answer_correctness": 5, "reasoning_quality": 4, "reasoning": "Right."}'
    cases = {**HOSTILE, "deeply nested JSON": "[" * 30_000 + "]" * 30_000,
             "nested objects in prose": "verdict: " + '{"a": ' * 8_000 + "1" + "}" * 8_000,
             "a verdict in a megabyte of whitespace": " " * MB + verdict + " " * MB}

    def parse(text):
        with contextlib.suppress(ValueError):  # a bad verdict is a ValueError (asked again, then a counted failure)
            parse_verdict(text, metrics)

    assert slow_cases(cases, parse) == []
    with pytest.raises(ValueError, match="nested") as caught:  # not a RecursionError, which nothing catches
        parse_verdict("[" * 30_000 + "]" * 30_000, metrics)
    assert len(str(caught.value)) < 400
    with pytest.raises(ValueError, match="characters"):  # far longer than any verdict: refused, not parsed
        parse_verdict("{" + " " * MB + "}", metrics)
    assert parse_verdict(" " * MB + verdict + " " * MB, metrics) == (
        {"answer_correctness": 5, "reasoning_quality": 4}, "Right.")
    assert parse_verdict("Here it is:\n```json\n" + verdict + "\n```", metrics)[0]["answer_correctness"] == 5


class CharTokenizer:
    """One token per character, so a test controls exactly the text a renderer decodes."""

    unk_token_id = -1

    def convert_tokens_to_ids(self, token):
        return 0 if token == "<|im_end|>" else -1

    def decode(self, tokens):
        return "".join(map(chr, tokens))


def test_replies_and_tool_calls_are_parsed_in_bounded_time():
    from strop.renderers import get_renderer, get_text_content
    from strop.renderers.tools import parse_tool_calls
    renderer = get_renderer("qwen3", CharTokenizer())
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    cases = {**HOSTILE,
             "spaces inside a call": "<tool_call>x" + " " * MB + "y",
             "many opening tags": "<tool_call>" * 100_000,
             "a deeply nested call": "<tool_call>" + "[" * 100_000,
             "nested arguments": '<tool_call>{"name": "add", "arguments": ' + '{"a": ' * 50_000,
             "an unclosed think": "<think>" + " " * MB,
             "a call after a megabyte": " " * MB + call}
    tokens = {name: [ord(c) for c in text] + [0] for name, text in cases.items()}  # <|im_end|> is token 0

    def parse(token_ids):
        message, _ = renderer.parse_response(token_ids)
        parse_tool_calls(get_text_content(message))

    assert slow_cases(tokens, parse) == []
    # a call nested past any real one is a problem handed back to the model, not an exception
    calls, found = parse_tool_calls("<tool_call>" + "[" * 30_000 + "</tool_call>")
    assert calls == [] and len(found) == 1 and "nested" in found[0] and len(found[0]) < 400
    calls, found = parse_tool_calls("<tool_call>" + "x" * MB + "</tool_call>")
    assert calls == [] and "characters" in found[0] and len(found[0]) < 400
    calls, found = parse_tool_calls(" " * MB + call)
    assert [(c.name, c.arguments) for c in calls] == [("add", {"a": 1, "b": 2})] and found == []


def test_evaluation_answer_extraction_is_bounded():
    from strop.data import Row
    from strop.evals.runner import _evaluate
    from strop.scoring.gsm8k import compute_score

    class Sampler:
        def __init__(self, texts):
            self.texts = iter(texts)

        def sample(self, prompt, num_samples, sampling_params):
            seq = type("Seq", (), {"tokens": [ord(c) for c in next(self.texts)]})()
            result = type("Result", (), {"sequences": [seq]})()
            return type("Future", (), {"result": lambda self: result})()

    class Renderer:
        def build_generation_prompt(self, messages):
            return None

        def get_stop_sequences(self):
            return []

        def parse_response(self, tokens):
            return {"role": "assistant", "content": "".join(map(chr, tokens))}, True

    names = sorted(HOSTILE)
    texts = [HOSTILE[n] for n in names] + ["so it is #### 7"]
    rows = [Row(question="q", answer="#### 7")] * len(texts)
    t0 = time.perf_counter()
    with hard_stop(HARD_STOP_S * 4):
        result = _evaluate(Sampler(texts), Renderer(), rows, compute_score, max_tokens=8, samples=1, temperature=0.0,
                           system_prompt=None, correct_at=1.0, progress=False, batch=64, on_progress=None)
    assert time.perf_counter() - t0 < PARSE_BUDGET_S * len(texts)
    assert result.items[-1].correct and result.items[-1].extracted == "7"


def test_dataset_rows_load_in_bounded_time_and_nesting_is_a_dataset_error(tmp_path):
    from strop.data import load_rows
    from strop.errors import DatasetError
    items = tmp_path / "items.json"  # one item per line, 80,000 of them: the line of each is found once
    items.write_text("[\n" + ",\n".join(json.dumps({"question": f"q{i}", "answer": f"#### {i}"})
                                        for i in range(80_000)) + "\n]")
    t0 = time.perf_counter()
    with hard_stop(30):
        rows = load_rows(str(items))
    assert len(rows) == 80_000 and rows[-1].gold == "79999" and time.perf_counter() - t0 < 3.0

    good = json.dumps({"question": "q", "answer": "#### 1"})
    for suffix, text in ((".jsonl", good + "\n" + "[" * 100_000 + "\n"), (".json", "[" + good + ", " + "[" * 100_000)):
        nested = tmp_path / f"nested{suffix}"
        nested.write_text(text)
        with pytest.raises(DatasetError) as caught:
            load_rows(str(nested))
        assert "nested" in str(caught.value) and str(nested) in str(caught.value)


# ---- special files ---------------------------------------------------------------------------------------

def strop_command(*argv, timeout=60, **env):
    """`strop ARGV` as a user runs it: a new process, with this test's STROP_HOME."""
    return subprocess.run([sys.executable, "-m", "strop.cli.main", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **env})


def test_fifos_are_refused_before_anything_opens_them(home, tmp_path):  # noqa: F811
    from strop.store import artifacts
    pipe = tmp_path / "rows.jsonl"
    os.mkfifo(pipe)
    try:
        done = strop_command("registry", "datasets", "register", "x/rows", "-f", pipe, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("registering a FIFO as a dataset hung")
    assert done.returncode == 1 and "is a FIFO (named pipe)" in done.stderr and str(pipe) in done.stderr
    assert "Traceback" not in done.stderr

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "reward.py").write_text("def compute_score(data_source=None, solution_str=None, ground_truth=None, "
                                      "extra_info=None):\n    return 1.0\n")
    os.mkfifo(bundle / "pipe")
    done = strop_command("registry", "bundles", "register", "x/scoring", "-f", bundle, timeout=60)
    assert done.returncode == 1 and "is a FIFO (named pipe)" in done.stderr, done.stderr
    assert json.loads(strop_command("registry", "datasets", "list", "-o", "json").stdout) == []

    with hard_stop():
        with pytest.raises(artifacts.ArtifactError, match="is a FIFO"):
            artifacts.put_file(pipe)
        with pytest.raises(artifacts.ArtifactError, match="is a FIFO"):
            artifacts.dir_sha256(bundle)


# ---- descriptors: every size and count bounded -----------------------------------------------------------

HUGE = {
    "config.rlHyperparams.groupSize": 10**9,
    "config.rlHyperparams.batchSize": 10**6,
    "config.rlHyperparams.maxSteps": 10**12,
    "config.rlHyperparams.epochs": 10**12,
    "config.rlHyperparams.maxCompletionLength": 10**9,
    "config.rlHyperparams.klBeta": 1e300,
    "config.rlHyperparams.temperature": 1e300,
    "config.rlHyperparams.lora.rank": 10**9,
    "config.rlHyperparams.lora.alpha": 1e300,
    "config.rlHyperparams.optimizer.weightDecay": 1e300,
    "config.rlHyperparams.optimizer.gradClipNorm": 1e300,
    "config.reward.terms.0.weight": 1e308,
    "config.reward.timeoutSeconds": 1e300,
    "config.reward.memoryMb": 10**15,
    "config.maxSeqLength": 10**12,
    "config.evalEvery": 10**12,
    "execution.gpus": 10**6,
    "execution.saveEvery": 10**12,
    "execution.keepAdapters": 10**9,
}


def with_change(data: dict, path: str, value) -> dict:
    data = json.loads(json.dumps(data))
    node, *_ = [data]
    *parents, last = path.split(".")
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    node[last] = value
    return data


def test_every_size_and_count_in_a_descriptor_has_an_upper_limit(tmp_path):
    from strop.control.descriptor import DescriptorError, validate_descriptor
    base = json.loads(descriptor(tmp_path).read_text())
    base["config"]["evalEvery"] = 1
    admitted = []
    for path, value in HUGE.items():
        try:
            validate_descriptor(with_change(base, path, value))
            admitted.append(path)
            continue
        except DescriptorError as exc:
            [line] = exc.problems
        json_path = "$." + path.replace(".terms.0.", ".terms[0].")
        if not (line.startswith(json_path + ": must be") and " to " in line and ";" in line):
            admitted.append(f"{path}: {line}")  # refused, but not naming the range and the reason
    assert admitted == []


def test_an_oversized_run_is_refused_by_the_dry_run(home, tmp_path):  # noqa: F811
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(with_change(json.loads(descriptor(tmp_path).read_text()),
                                           "config.rlHyperparams.groupSize", 10**9)))
    done = strop_command("runs", "start", "-f", path, "--dry-run")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert ("$.config.rlHyperparams.groupSize: must be an integer from 2 to 1,024 (got 1000000000); a step holds "
            "every completion") in done.stderr


def test_train_flags_and_grpo_config_have_the_same_limits(home, tmp_path, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setenv("STROP_MEMORY_LIMIT_MB", "200")  # a safety net: nothing may start even if a flag slipped
    for flag, value, shown in (("--group-size", 10**9, "(group_size): must be an integer from 2 to 1,024"),
                               ("--batch-size", 10**6, "(batch_size): must be an integer from 1 to 4,096"),
                               ("--steps", 10**12, "(max_steps): must be an integer from 1 to 1,000,000"),
                               ("--rank", 10**9, "(lora_rank): must be an integer from 1 to 1,024"),
                               ("--max-tokens", 10**9, "(max_completion_length): must be an integer from 1 to 32,768"),
                               ("--temperature", 1e300, "(temperature): must be a number greater than 0, up to 10"),
                               ("--reward", "builtin:gsm8k=1e308", "the weight must be a number from -1,000 to 1,000")):
        code, _, err = run(capsys, "train", "--base-model", "strop/tiny-random", flag, value, "--run-dir",
                           tmp_path / "run")
        assert code == 1 and err.startswith("strop: error: invalid flags:") and f"{flag} " in err and shown in err, err
    assert not (tmp_path / "run").exists()

    from strop.errors import StropError
    from strop.rl import GRPOConfig
    from strop.rl.limits import LIMITS
    for name, limit in LIMITS.items():
        if name not in GRPOConfig.help():
            continue
        with pytest.raises(StropError) as caught:
            GRPOConfig(**{name: limit.most * 10 if limit.integer else limit.most * 1e3})
        assert f"{name}: must be" in str(caught.value) and f"{limit.most:,}" in str(caught.value)


def test_the_memory_estimate_counts_every_completion(tiny_model_dir):
    from strop.engine.resources import estimate_grpo_memory
    sizes = dict(batch_size=8, prompt_tokens=20, completion_tokens=8)
    half = estimate_grpo_memory(tiny_model_dir, group_size=512, **sizes)
    full = estimate_grpo_memory(tiny_model_dir, group_size=1024, **sizes)
    # 4,096 more completions of 28 tokens each are held until the update: at least 100 bytes a token
    assert full["total"] - half["total"] >= 4096 * 28 * 100
    assert full["rollouts"] == 2 * half["rollouts"]


def test_a_run_holding_too_many_completions_is_refused_at_admission(workspace, capsys, monkeypatch):  # noqa: F811
    # 12 prompts x 1,024 samples x 2,048 tokens: the tiny model's weights, caches and activations fit in 2 GB,
    # the 12,288 completions the step holds until its update (about 5 GB) do not
    monkeypatch.setenv("STROP_MEMORY_LIMIT_MB", "2000")
    big = descriptor(workspace, **{"config.rlHyperparams.groupSize": 1024, "config.rlHyperparams.batchSize": 12,
                                   "config.rlHyperparams.maxCompletionLength": 2048, "config.maxSeqLength": 4096})
    code, _, err = run(capsys, "runs", "start", "-f", big, "--dry-run")
    assert code == 1 and "$.config.rlHyperparams" in err and "would need about" in err
    assert "all 12,288 completions" in err


# ---- environments: names resolve only to environments ----------------------------------------------------

def test_a_dry_run_runs_no_code_from_a_module_it_names(workspace, capsys):  # noqa: F811
    marker = workspace / "MARKER"
    env_run = descriptor(workspace, **{"config.dataset": None, "config.reward": None,
                                       "config.environment": {"name": "os:system",
                                                              "options": {"command": f"touch {marker}"}}})
    done = strop_command("runs", "start", "-f", env_run, "--dry-run")
    assert not marker.exists(), "the dry run ran the command"
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "not imported by --dry-run" in done.stdout
    done = strop_command("runs", "start", "-f", env_run)
    assert not marker.exists(), "starting the run ran the command"
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "os.system is not an environment class" in done.stderr
    assert json.loads(strop_command("runs", "list", "-o", "json").stdout) == []


def test_environment_names_resolve_only_to_environment_classes(tmp_path):
    from strop.envs import get_env
    from strop.errors import StropError
    marker = tmp_path / "MARKER"
    for name, options, expected in (
            ("os:system", {"command": f"touch {marker}"}, "os.system is not an environment class"),
            ("subprocess:Popen", {"args": ["touch", str(marker)]}, "subprocess.Popen is not an environment class"),
            ("builtins:exec", {"source": f"open({str(marker)!r}, 'w')"}, "builtins.exec is not an environment class"),
            ("no_such_module_xyz:Env", {}, "no module named 'no_such_module_xyz'"),
            ("../evil:Env", {}, "is not an environment name"),
            ("toy_env:NoSuchClass", {}, "toy_env has no NoSuchClass")):
        with pytest.raises(StropError) as caught:
            get_env(name, **options)
        assert expected in str(caught.value) and "finance-sql" in str(caught.value), str(caught.value)
    assert not marker.exists()
    env = get_env("toy_env:ToyEnv", max_turns=2)  # a class with the Environment methods is one
    assert env.splits() == ["train", "eval"]


def test_a_users_environment_that_takes_no_seed_is_named_not_a_traceback(tmp_path, monkeypatch):
    from strop.envs import get_env
    from strop.errors import StropError
    (tmp_path / "seedless_env.py").write_text(
        "from toy_env import ToyEnv\n"
        "class Seedless(ToyEnv):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(StropError, match=r"constructor takes no 'seed' option.*def __init__\(self, seed"):
        get_env("seedless_env:Seedless", seed=0)
    assert get_env("seedless_env:Seedless").splits() == ["train", "eval"]


# ---- names -----------------------------------------------------------------------------------------------

def test_names_are_checked_wherever_they_are_accepted(home, tmp_path, capsys):  # noqa: F811
    from strop.control.descriptor import DescriptorError, validate_descriptor
    base = json.loads(descriptor(tmp_path).read_text())
    for path, value, expected in (
            ("configName", "x" * 100_000, "100,000 characters; at most 200"),
            ("configName", "report\u202etxt.exe", "U+202E (RIGHT-TO-LEFT OVERRIDE)"),
            ("configName", "two\nlines", "U+000A"),
            ("project", "arith\u2066", "U+2066 (LEFT-TO-RIGHT ISOLATE)"),
            ("baseModel", "strop/tiny-random\u200f", "U+200F (RIGHT-TO-LEFT MARK)"),
            ("config.dataset", "arith/../train", "'..'"),
            ("config.dataset", "arith/./train", "'.'"),
            ("config.reward.terms.0.name", "\x1b[31mred", "U+001B"),
            ("config.reward.terms.0.bundle", "arith/../scoring", "'..'")):
        with pytest.raises(DescriptorError) as caught:
            validate_descriptor(with_change(base, path, value))
        [line] = caught.value.problems
        assert expected in line and len(line) < 400, line
        assert value not in line or len(value) < 40  # a hostile value is never printed whole

    for argv, expected in ((("projects", "create", "a/../b"), "'..'"),
                           (("projects", "create", "x" * 100_000), "at most 200"),
                           (("projects", "create", "evil\u202eexe"), "U+202E"),
                           (("registry", "datasets", "register", "a/./b", "-f", tmp_path / "none.jsonl"), "'.'"),
                           (("registry", "datasets", "register", "..", "-f", tmp_path / "none.jsonl"), "'..'"),
                           (("registry", "bundles", "register", "gsm8k/..", "-f", tmp_path), "'..'"),
                           (("registry", "datasets", "get", "a/../b"), "'..'")):
        code, _, err = run(capsys, *argv)
        assert code == 1 and expected in err and len(err) < 600, err
    assert json.loads(run(capsys, "projects", "list", "-o", "json")[1]) == []
    assert json.loads(run(capsys, "registry", "bundles", "list", "-o", "json")[1]) == []


def test_model_ids_and_endpoints_with_hidden_characters_are_refused():
    from strop.errors import StropError
    from strop.evals.openai_client import parse_openai_ref
    from strop.models import resolve_model
    for model in ("HuggingFaceTB/SmolLM2\u202e-135M", "strop/tiny\x1b[31m-random", "a" * 5000):
        with pytest.raises(StropError, match="not allowed|characters"):
            resolve_model(model, download=False)
    with pytest.raises(StropError, match="U\\+202E") as err:
        parse_openai_ref("openai:gpt\u202e-4@http://127.0.0.1:9/v1")
    assert "\u202e" not in str(err.value)  # shown escaped
