"""The `strop` command as a person runs it: help, output formats, base models, train, and its errors."""

import json

import pytest

from strop.cli.main import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_help_teaches(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    assert "base-models" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    assert "--group-size" in text and "examples:" in text and "synthetic" in text


def test_base_models_list_as_table_json_and_jq(capsys):
    code, out, _ = run(capsys, "base-models", "list")
    assert code == 0 and "MODEL" in out and "HuggingFaceTB/SmolLM2-135M-Instruct" in out
    code, out, _ = run(capsys, "base-models", "list", "-o", "json")
    ids = [m["model_id"] for m in json.loads(out)]
    for model in ("HuggingFaceTB/SmolLM2-135M-Instruct", "Qwen/Qwen3-0.6B", "Qwen/Qwen3-4B", "Qwen/Qwen3.5-4B",
                  "strop/tiny-random"):
        assert model in ids
    code, out, _ = run(capsys, "base-models", "list", "--jq", ".[].model_id")
    assert out.splitlines() == ids  # strings print bare, one per line
    code, out, _ = run(capsys, "base-models", "list", "-o", "yaml")
    assert "model_id: strop/tiny-random" in out


def test_select_is_idempotent(capsys):
    code, first, _ = run(capsys, "base-models", "select", "strop/tiny-random", "--wait", "-o", "json")
    assert code == 0
    code, again, _ = run(capsys, "base-models", "select", "strop/tiny-random", "--jq", ".path")
    assert code == 0 and again.strip() == json.loads(first)["path"]
    code, out, _ = run(capsys, "base-models", "list", "-o", "json")
    [tiny] = [m for m in json.loads(out) if m["model_id"] == "strop/tiny-random"]
    assert tiny["cached"] is True


def test_unknown_model_lists_every_source(capsys, tmp_path):
    code, out, err = run(capsys, "base-models", "select", str(tmp_path / "no-such-model"))
    assert code == 1 and out == ""
    assert "strop: error:" in err and "no-such-model" in err and "no such directory" in err
    code, out, err = run(capsys, "base-models", "select", "strop-test/not-a-model")
    assert code == 1
    reason = err[err.index("strop: error:"):]
    # every source is named, with why it failed, and what to do
    assert "strop cache" in reason and "Hugging Face" in reason and "What to do" in reason


def test_bad_jq_is_a_clear_error(capsys):
    code, _, err = run(capsys, "base-models", "list", "--jq", ".[")
    assert code == 1 and "--jq" in err


def test_train_end_to_end_prints_the_run_folder(capsys, tiny_model_dir, tmp_path):
    code, out, err = run(capsys, "train", "--base-model", str(tiny_model_dir), "--steps", "2", "--group-size", "2",
                         "--batch-size", "2", "--max-tokens", "4", "--rank", "4", "--run-dir", str(tmp_path / "r"),
                         "--quiet", "-o", "json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["steps"] == 2 and (tmp_path / "r" / "final" / "adapter_model.safetensors").exists()
    assert f"run folder: {tmp_path / 'r'}" in err


@pytest.mark.parametrize("argv, expected", [
    (["--group-size", "1"], "group_size"),
    (["--max-tokens", "0"], "max_completion_length"),
    (["--dataset", "/nonexistent/rows.jsonl"], "does not exist"),
    (["--reward", "builtin:nope"], "builtin"),
    (["--reward", "builtin:gsm8k=heavy"], "weight"),
    (["--base-model", "/nonexistent/model"], "/nonexistent/model"),
])
def test_train_bad_input_one_clear_error_nothing_written(capsys, tmp_path, argv, expected):
    code, out, err = run(capsys, "train", "--steps", "1", "--run-dir", str(tmp_path / "r"), "--quiet", *argv)
    assert code == 1
    assert "strop: error:" in err and expected in err
    assert "run folder" not in err and not (tmp_path / "r").exists()


def test_train_names_a_bad_grader_before_loading_any_model(capsys, tmp_path):
    """Reward terms are resolved before the base model: a model that is not there is not reached (nor is a first
    use of SmolLM2 converted, most of a minute, only to be told the grader is unknown)."""
    code, _, err = run(capsys, "train", "--base-model", str(tmp_path / "no-such-model"), "--steps", "1",
                       "--reward", "builtin:nope", "--run-dir", str(tmp_path / "r"), "--quiet")
    assert code == 1 and "unknown built-in grader 'builtin:nope'" in err and "no-such-model" not in err
    assert not (tmp_path / "r").exists()


def test_train_refuses_a_folder_of_a_different_run(capsys, tiny_model_dir, tmp_path):
    common = ["train", "--base-model", str(tiny_model_dir), "--steps", "1", "--group-size", "2", "--batch-size", "1",
              "--max-tokens", "4", "--rank", "4", "--run-dir", str(tmp_path / "r"), "--quiet"]
    assert run(capsys, *common)[0] == 0
    code, _, err = run(capsys, *common[:-3], "--lr", "0.5", "--run-dir", str(tmp_path / "r"), "--quiet")
    assert code == 1 and "different config" in err and "learning_rate" in err
    # a folder saved before a setting existed still resumes: the missing setting reads as its default
    saved = json.loads((tmp_path / "r" / "config.json").read_text())
    (tmp_path / "r" / "config.json").write_text(json.dumps({k: v for k, v in saved.items() if k != "warmup_steps"}))
    code, _, err = run(capsys, *common)
    assert code == 0, err


def test_every_command_has_help_with_an_example():
    import argparse

    from strop.cli.main import build_parser

    def leaves(parser, path):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            yield path, parser
            return
        for name, child in subs[0].choices.items():
            yield from leaves(child, path + [name])

    missing = [" ".join(path) for path, parser in leaves(build_parser(), [])
               if "example" not in parser.format_help() and path != ["train"]]
    assert not missing, f"commands whose --help shows no example: {missing}"
    assert "examples:" in build_parser()._subparsers._group_actions[0].choices["train"].format_help()


def test_descriptions_show_percent_signs_once(capsys):
    for command in ("compare", "quickstart"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "95% interval" in text and "%%" not in text
