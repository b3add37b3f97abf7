"""examples/gsm8k: the data script (local copy, a stand-in for the API, offline), the scoring bundle's three
score levels, the run descriptor, and the bundle loading through strop's grader references.

No test here touches the network: the API is either a closed loopback port or a server on loopback."""

import http.server
import json
import os
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import pytest

from strop.control import load_descriptor
from strop.scoring import check_bundle, load_grader

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "gsm8k"
SCRIPT = EXAMPLE / "prepare_dataset.py"
CLOSED_PORT = "http://127.0.0.1:9"  # the discard port: nothing listens, so connecting fails at once


def gsm8k_dir() -> Path:
    return Path(os.environ.get("STROP_GSM8K_DIR") or ROOT.parent / "shared" / "data" / "gsm8k")


needs_gsm8k = pytest.mark.skipif(not (gsm8k_dir() / "train.jsonl").exists(), reason="GSM8K copy for tests not present")


def prepare(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- prepare_dataset.py ------------------------------------------------------------------------------------


@needs_gsm8k
def test_from_folder_writes_the_requested_rows(tmp_path):
    done = prepare("--from", gsm8k_dir(), "--rows", 30, "--eval-rows", 7, "--out", tmp_path / "data", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    train, evals = read_jsonl(tmp_path / "data" / "train.jsonl"), read_jsonl(tmp_path / "data" / "eval.jsonl")
    assert (len(train), len(evals)) == (30, 7)
    assert all(set(row) == {"question", "answer"} and "####" in row["answer"] for row in train + evals)
    # Both from the start of their split, like the API path.
    assert train[0] == read_jsonl(gsm8k_dir() / "train.jsonl")[0]
    assert evals[0] == read_jsonl(gsm8k_dir() / "test.jsonl")[0]


@needs_gsm8k
def test_from_one_file_takes_eval_rows_from_its_end_and_refuses_overlap(tmp_path):
    source = tmp_path / "some.jsonl"
    source.write_text("".join(line + "\n" for line in (gsm8k_dir() / "test.jsonl").read_text().splitlines()[:40]))
    done = prepare("--from", source, "--rows", 25, "--eval-rows", 10, cwd=tmp_path)   # default --out data
    assert done.returncode == 0, done.stderr
    rows = read_jsonl(source)
    assert read_jsonl(tmp_path / "data" / "train.jsonl") == rows[:25]
    assert read_jsonl(tmp_path / "data" / "eval.jsonl") == rows[-10:]

    done = prepare("--from", source, "--rows", 35, "--eval-rows", 10, cwd=tmp_path)
    assert done.returncode == 1 and "would overlap" in done.stderr


def test_offline_without_a_local_copy_fails_with_a_message(tmp_path):
    done = prepare("--api-url", CLOSED_PORT, "--out", tmp_path / "data", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.startswith("error: cannot reach the datasets-server API at http://127.0.0.1:9")
    assert "--from" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "data" / "train.jsonl").exists()


def test_bad_local_rows_are_named_by_line(tmp_path):
    source = tmp_path / "rows.jsonl"
    source.write_text('{"question": "q", "answer": "a #### 1"}\n{"question": "q"}\n')
    done = prepare("--from", source, "--rows", 1, "--eval-rows", 1, cwd=tmp_path)
    assert done.returncode == 1 and f"{source} line 2: needs a string field 'answer'" in done.stderr


class FakeRowsAPI(http.server.BaseHTTPRequestHandler):
    """Answers like datasets-server's /rows, after one 429; counts the requests it serves."""

    requests: list = []
    refuse_next = True

    def do_GET(self):
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(self.path).query))
        if FakeRowsAPI.refuse_next:
            FakeRowsAPI.refuse_next = False
            self.send_response(429)
            self.send_header("Retry-After", "0")
            self.end_headers()
            return
        FakeRowsAPI.requests.append(query)
        offset, length = int(query["offset"]), int(query["length"])
        total = 300 if query["split"] == "train" else 120
        rows = [{"row_idx": i, "row": {"question": f"{query['split']} {i}?", "answer": f"so #### {i}"},
                 "truncated_cells": []} for i in range(offset, min(offset + length, total))]
        body = json.dumps({"rows": rows, "num_rows_total": total}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_api_pages_retry_on_429_and_are_cached(tmp_path):
    FakeRowsAPI.requests, FakeRowsAPI.refuse_next = [], True
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeRowsAPI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        done = prepare("--api-url", url, "--rows", 150, "--eval-rows", 20, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "HTTP 429" in done.stderr
        train = read_jsonl(tmp_path / "data" / "train.jsonl")
        assert len(train) == 150 and train[149] == {"question": "train 149?", "answer": "so #### 149"}
        assert len(read_jsonl(tmp_path / "data" / "eval.jsonl")) == 20
        assert [(q["split"], q["offset"], q["length"]) for q in FakeRowsAPI.requests] == [
            ("train", "0", "100"), ("train", "100", "50"), ("test", "0", "20")]

        # A rerun asks for nothing it already has, and still writes the files.
        FakeRowsAPI.requests.clear()
        done = prepare("--api-url", url, "--rows", 150, "--eval-rows", 20, cwd=tmp_path)
        assert done.returncode == 0 and FakeRowsAPI.requests == []

        done = prepare("--api-url", url, "--rows", 400, "--eval-rows", 20, cwd=tmp_path)
        assert done.returncode == 1 and "train split has 300 rows; asked for 400" in done.stderr
    finally:
        server.shutdown()
        server.server_close()

    # The cache also serves a rerun with the server gone.
    done = prepare("--api-url", CLOSED_PORT, "--rows", 150, "--eval-rows", 20, cwd=tmp_path)
    assert done.returncode == 0, done.stderr


# --- the scoring bundle ------------------------------------------------------------------------------------


GOLD = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nShe sold 48+24 = <<48+24=72>>72 clips.\n#### 72"


@pytest.fixture(scope="module")
def reward():
    return load_grader(f"{EXAMPLE / 'scoring'}#reward:compute_score")


@pytest.mark.parametrize("completion, expected", [
    ("She sold 72 clips in total.", 0.0),                              # no marker: nothing
    ("", 0.0),
    (None, 0.0),
    ("#### Step 1: add the clips\n48 + 24 = 72", 0.0),                 # a heading is not an answer
    ("48 + 24 = 70\n#### 70", 0.1),                                    # well formed, wrong
    ("#### 72\nWait, it is 71.\n#### 71", 0.1),                        # the last marker counts
    ("48 + 24 = 72\n#### 72", 1.1),                                    # well formed and right
    ("#### 71\nno: #### 72.0", 1.1),
    ("#### 72", 1.1),
])
def test_reward_levels(reward, completion, expected):
    assert reward(data_source="openai/gsm8k", solution_str=completion, ground_truth=GOLD, extra_info={}) == \
        pytest.approx(expected)


def test_reward_reads_numbers_as_written(reward):
    assert reward(solution_str="#### 1,234", ground_truth="... #### 1234") == pytest.approx(1.1)
    assert reward(solution_str="#### -3", ground_truth="#### -3") == pytest.approx(1.1)
    assert reward(solution_str="#### 3", ground_truth="#### -3") == pytest.approx(0.1)
    # A bare-number gold (verl-style datasets) works too; a gold without any number gives format credit only.
    assert reward(solution_str="#### 18", ground_truth="18") == pytest.approx(1.1)
    assert reward(solution_str="#### 18", ground_truth="eighteen") == pytest.approx(0.1)


def test_bundle_passes_strops_checks():
    assert check_bundle(EXAMPLE / "scoring", "reward", "compute_score") is None
    assert load_grader(str(EXAMPLE / "scoring"))(solution_str="#### 72", ground_truth=GOLD) == pytest.approx(1.1)


# --- the run descriptor ------------------------------------------------------------------------------------


def test_run_json_validates_as_seed_003():
    run = load_descriptor(EXAMPLE / "run.json")
    hp = run.config.rl_hyperparams
    assert (run.project, run.config_name, run.base_model) == ("gsm8k", "grpo-100-steps", "Qwen/Qwen3-0.6B")
    assert (hp.epochs, hp.max_steps, hp.group_size, hp.kl_beta, hp.temperature, hp.max_completion_length) == (
        1, 100, 8, 0.001, 1.0, 512)
    assert (hp.lora.rank, hp.optimizer.learning_rate, run.config.max_seq_length) == (32, 1e-5, 1536)
    [term] = run.config.reward.terms
    assert (term.bundle, term.module, term.function, term.weight) == ("gsm8k/scoring", "reward", "compute_score", 1.0)
    assert (run.execution.gpus, run.execution.save_every, run.execution.keep_adapters) == (1, 10, 4)
    # The bundle in this folder is what the term names once the registry has it.
    grader = load_grader(term.grader_ref(EXAMPLE / "scoring"))
    assert grader(solution_str="#### 72", ground_truth=GOLD) == pytest.approx(1.1)
