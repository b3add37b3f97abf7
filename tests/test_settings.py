"""A run's settings are declared once (strop.rl.settings): `strop train`'s flags, the run descriptor's defaults and
paths, and the quickstart's help are all derived from the declarations."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, dataclass, fields

import pytest

from strop.cli.setting_flags import add_setting_flags, given_settings
from strop.control.descriptor import RunDescriptor
from strop.rl.config import GRPOConfig
from strop.rl.settings import TrainingSettings, setting
from strop.sft.config import SFTConfig


def _train_parser() -> argparse.ArgumentParser:
    from strop.cli.train import register
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser


def _sample_value(cls, f):
    """A value other than the default that the field accepts, as flag text and as the parsed value."""
    choices = f.metadata.get("choices")
    default = cls.default_of(f.name)
    if choices:
        value = next(c for c in choices if c != default)
        return value, value
    hint = str(f.type)
    if f.name == "report_to":
        return "none", []
    if f.name == "init_adapter":
        return None, None
    if hint.startswith("bool"):
        return "", True
    if hint.startswith("int"):
        return "3", 3
    if hint.startswith("float"):
        return "0.5", 0.5
    return "some-text", "some-text"


def test_every_flag_sets_its_field_and_shows_its_default():
    parser = _train_parser()
    checked = 0
    for cls in (GRPOConfig, SFTConfig):
        for f in fields(cls):
            flag = f.metadata.get("flag")
            if not flag:
                continue
            text, expected = _sample_value(cls, f)
            if text is None:
                continue
            argv = ["train", flag] + ([text] if text != "" else [])
            args = parser.parse_args(argv)
            assert given_settings(args, cls) == {f.name: expected}, flag
            checked += 1
    assert checked >= 45
    helps = {a.option_strings[0]: a.help for a in parser._subparsers._group_actions[0].choices["train"]._actions
             if a.option_strings}
    assert helps["--group-size"].startswith("grpo: completions sampled per prompt") and "(default: 8)" in \
        helps["--group-size"]
    assert helps["--eval-fraction"].startswith("sft: share of the examples held out") and "(default: 0.1)" in \
        helps["--eval-fraction"]
    # a field named in another's help is named by its flag there
    assert "--max-tokens" in helps["--overlong-buffer"] and "max_completion_length" not in helps["--overlong-buffer"]
    assert helps["--lr"].startswith("AdamW learning rate") and "(default: 0.0001)" in helps["--lr"]


def test_the_descriptor_takes_its_defaults_from_the_declarations():
    """Every setting the descriptor has a path for and does not require has the config's default there."""
    minimal = {"kind": "run", "project": "p", "configName": "c", "baseModel": "m",
               "config": {"method": "grpo", "dataset": "d/train", "maxSeqLength": 1024,
                          "rlHyperparams": {"groupSize": 4, "klBeta": 0.0, "temperature": 1.0,
                                            "maxCompletionLength": 64, "lora": {"rank": 8},
                                            "optimizer": {"learningRate": 1e-4}},
                          "reward": {"terms": [{"kind": "rule", "weight": 1.0, "bundle": "builtin:gsm8k"}]}},
               "execution": {"gpus": 0, "saveEvery": 5, "keepAdapters": 2}}
    data = RunDescriptor.model_validate(minimal).to_dict()
    given = {"group_size", "kl_beta", "temperature", "max_completion_length", "lora_rank", "learning_rate",
             "max_seq_length", "gpus", "save_every", "keep_adapters", "base_model", "ray"}
    compared = 0
    for name, path in GRPOConfig.descriptor_paths().items():
        if name in given:
            continue
        value = data
        for key in path.removeprefix("$.").split("."):
            value = value[key]
        assert value == GRPOConfig.default_of(name), (name, path, value)
        compared += 1
    assert compared >= 25


def test_a_new_setting_is_one_line_and_reaches_flags_and_descriptor_paths():
    @dataclass
    class WithOneMore(GRPOConfig):
        entropy_bonus: float = setting(0.0, "weight of an entropy bonus", flag="--entropy-bonus",
                                       descriptor="{hp}.entropyBonus")

    parser = argparse.ArgumentParser()
    add_setting_flags(parser, WithOneMore)
    assert given_settings(parser.parse_args(["--entropy-bonus", "0.25"]), WithOneMore) == {"entropy_bonus": 0.25}
    assert WithOneMore.descriptor_paths()["entropy_bonus"] == "$.config.rlHyperparams.entropyBonus"
    assert "(default: 0.0)" in parser.format_help()


def test_shared_settings_are_declared_once_for_both_methods():
    shared = {f.name for f in fields(TrainingSettings)}
    for cls in (GRPOConfig, SFTConfig):
        for name in shared:
            own = next(f for f in fields(cls) if f.name == name)
            base = next(f for f in fields(TrainingSettings) if f.name == name)
            assert own.metadata is base.metadata or name in ("dataset",), (cls.__name__, name)
    assert SFTConfig.descriptor_paths()["learning_rate"] == "$.config.sftHyperparams.optimizer.learningRate"
    assert GRPOConfig.descriptor_paths()["learning_rate"] == "$.config.rlHyperparams.optimizer.learningRate"
    for cls in (GRPOConfig, SFTConfig):
        for f in fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"
            assert f.default is not MISSING or f.default_factory is not MISSING, f.name


def test_each_method_refuses_the_others_flags_by_name(capsys):
    from strop.cli.main import main
    assert main(["train", "--eval-fraction", "0.2"]) == 1
    assert "--eval-fraction: a setting of --method sft, which GRPO does not take" in capsys.readouterr().err
    assert main(["train", "--method", "sft", "--dataset", "x.jsonl", "--group-size", "4", "--dynamic-sampling"]) == 1
    assert "--group-size, --dynamic-sampling: GRPO settings, which --method sft does not take" in \
        capsys.readouterr().err


@pytest.mark.parametrize("option,field", [("group_size", "group_size"), ("learning_rate", "learning_rate")])
def test_quickstart_help_is_the_settings_help(option, field):
    from strop.cli.quickstart import register
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    quickstart = parser._subparsers._group_actions[0].choices["quickstart"]
    action = next(a for a in quickstart._actions if a.dest == option)
    assert action.help.startswith(GRPOConfig.help()[field])
