"""strop.control.descriptor: seed 003's run.json validates and maps to the loop's config; mistakes are all
reported at once, each with its JSON path, what is accepted and what was given."""

import copy
import json

import pytest

from strop.control import DescriptorError, RunDescriptor, load_descriptor, validate_descriptor
from strop.errors import StropError
from strop.rl.config import GRPOConfig

# Seed 003's descriptor, character for character.
SEED_003 = """{
  "kind": "run",
  "project": "gsm8k",
  "configName": "grpo-100-steps",
  "baseModel": "Qwen/Qwen3-0.6B",
  "config": {
    "dataset": "gsm8k/train",
    "method": "grpo",
    "rlHyperparams": {
      "epochs": 1,
      "maxSteps": 100,
      "groupSize": 8,
      "klBeta": 0.001,
      "temperature": 1.0,
      "maxCompletionLength": 512,
      "lora": {
        "rank": 32
      },
      "optimizer": {
        "learningRate": 1e-5
      }
    },
    "reward": {
      "terms": [
        {"kind": "rule", "weight": 1.0, "bundle": "gsm8k/scoring", "module": "reward"}
      ]
    },
    "maxSeqLength": 1536
  },
  "execution": {"gpus": 1, "saveEvery": 10, "keepAdapters": 4}
}"""


def seed() -> dict:
    return json.loads(SEED_003)


def problems(data) -> list[str]:
    with pytest.raises(DescriptorError) as caught:
        validate_descriptor(data)
    assert isinstance(caught.value, StropError)
    # The message carries the same lines as .problems, one per line after the header.
    assert str(caught.value).splitlines()[1:] == ["  " + p for p in caught.value.problems]
    return caught.value.problems


def test_seed_003_validates_and_maps_to_the_same_numbers(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(SEED_003)
    run = load_descriptor(path)
    assert (run.kind, run.project, run.config_name, run.base_model) == ("run", "gsm8k", "grpo-100-steps",
                                                                        "Qwen/Qwen3-0.6B")
    term = run.config.reward.terms[0]
    assert (term.kind, term.weight, term.bundle, term.module, term.function) == (
        "rule", 1.0, "gsm8k/scoring", "reward", "compute_score")
    assert run.term_names() == ["scoring"]

    refs = [t.grader_ref("/pinned/bundle") for t in run.config.reward.terms]
    assert refs == ["/pinned/bundle#reward:compute_score"]
    config = run.to_grpo_config("/pinned/train.jsonl", run.reward_term_specs(refs))
    assert isinstance(config, GRPOConfig)
    assert (config.base_model, config.dataset) == ("Qwen/Qwen3-0.6B", "/pinned/train.jsonl")
    assert config.reward_terms == [{"name": "scoring", "weight": 1.0, "grader": "/pinned/bundle#reward:compute_score"}]
    assert (config.epochs, config.max_steps, config.group_size, config.batch_size) == (1, 100, 8, 8)
    assert (config.kl_beta, config.temperature, config.max_completion_length) == (0.001, 1.0, 512)
    assert (config.lora_rank, config.lora_alpha, config.learning_rate) == (32, None, 1e-5)
    assert (config.weight_decay, config.grad_clip_norm, config.max_seq_length) == (0.0, 1.0, 1536)
    assert (config.save_every, config.keep_adapters) == (10, 4)


def test_defaults_are_written_back_and_round_trip():
    run = validate_descriptor(seed())
    data = run.to_dict()
    assert data["config"]["rlHyperparams"]["batchSize"] == 8
    assert data["config"]["rlHyperparams"]["optimizer"] == {"learningRate": 1e-5, "weightDecay": 0.0,
                                                            "gradClipNorm": 1.0, "warmupSteps": 0}
    assert data["config"]["rlHyperparams"]["klReference"] == "start"
    assert data["config"]["evalEvery"] is None
    assert validate_descriptor(data) == run


def test_three_mistakes_are_reported_together_with_their_paths():
    data = seed()
    hp = data["config"]["rlHyperparams"]
    hp["maxSteps"] = "100"                                     # a wrong type: no silent "100" -> 100
    hp["groupSize"] = 1                                        # out of range
    hp["optimizer"]["learningrate"] = hp["optimizer"].pop("learningRate")   # a typo: unknown, and required missing
    found = problems(data)
    assert "$.config.rlHyperparams.maxSteps: must be an integer from 1 to 1,000,000, or null (got \"100\")" in found
    assert ("$.config.rlHyperparams.groupSize: must be an integer from 2 to 1,024 (got 1); GRPO needs at least two "
            "samples of a prompt to compare") in found
    unknown = [p for p in found if p.startswith("$.config.rlHyperparams.optimizer.learningrate: unknown field")]
    assert unknown and "known fields here: learningRate, weightDecay, gradClipNorm" in unknown[0]
    assert "did you mean 'learningRate'?" in unknown[0]
    assert ("$.config.rlHyperparams.optimizer.learningRate: must be a number between 0 and 1 (exclusive) "
            "(missing)") in found
    assert len(found) == 4


def test_strict_types_no_coercion():
    cases = [
        (("execution", "gpus"), True, "$.execution.gpus: must be an integer from 0 to 1,024 (got true)"),
        (("execution", "saveEvery"), 10.0, "$.execution.saveEvery: must be an integer from 1 to 1,000,000 (got 10.0)"),
        (("execution", "sampler"), "fast", '$.execution.sampler: must be "strop" (strop\'s own decoder), "vllm" (vLLM: '
                                           'pip install -e ".[vllm]") or "auto" (vLLM on a CUDA GPU where installed, '
                                           'else strop) (got "fast")'),
        (("config", "rlHyperparams", "temperature"), "1.0",
         '$.config.rlHyperparams.temperature: must be a number greater than 0, up to 10 (got "1.0")'),
        (("config", "rlHyperparams", "klBeta"), float("nan"),
         "$.config.rlHyperparams.klBeta: must be a number from 0 to 100 (got NaN)"),
        (("config", "method"), "ppo",
         '$.config.method: must be "grpo", or "sft" (supervised fine-tuning on transcripts) (got "ppo")'),
        (("kind",), "Run", '$.kind: must be "run" (got "Run")'),
        (("project",), "", '$.project: must be a project name such as "gsm8k" (got ""); it is empty'),
        (("config", "dataset"), 7, "$.config.dataset: must be a registry dataset NAME or NAME@VERSION such as "
                                   "\"gsm8k/train\" (or give config.environment instead) (got 7)"),
    ]
    for keys, value, expected in cases:
        data = seed()
        target = data
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
        assert problems(data) == [expected]


def test_integers_are_accepted_where_numbers_are():
    data = seed()
    data["config"]["rlHyperparams"]["temperature"] = 1
    data["config"]["reward"]["terms"][0]["weight"] = 2
    run = validate_descriptor(data)
    assert run.config.rl_hyperparams.temperature == 1.0 and run.config.reward.terms[0].weight == 2.0


def test_cross_field_and_nested_problems_come_with_the_others():
    data = seed()
    data["config"]["maxSeqLength"] = 512
    data["config"]["rlHyperparams"]["lora"] = 32
    data["config"]["reward"]["terms"].append({"kind": "rule", "weight": 0.5, "bundle": "builtin:gsm8k",
                                              "name": "scoring"})
    data["config"]["reward"]["terms"].append({"kind": "rule", "weight": 0.5, "bundle": "builtin:gsm8k",
                                              "name": "scoring"})
    data["config"]["reward"]["terms"][0]["name"] = "scoring"
    data["execution"]["gpu"] = 1
    found = problems(data)
    assert ("$.config.rlHyperparams.lora: must be an object with fields rank, alpha (optional), targetModules "
            "(optional) (got 32)") in found
    assert any(p.startswith("$.execution.gpu: unknown field; known fields here: gpus, saveEvery, keepAdapters")
               and "did you mean 'gpus'?" in p for p in found)
    assert ("$.config.maxSeqLength: must be greater than $.config.rlHyperparams.maxCompletionLength (512) to "
            "leave room for the prompt (got 512)") in found
    assert any(p.startswith("$.config.reward.terms[1].name: must be unique") for p in found)
    assert any(p.startswith("$.config.reward.terms[2].name: must be unique") for p in found)
    assert len(found) == 5


def test_a_cross_field_problem_alone_is_still_reported():
    data = seed()
    data["config"]["maxSeqLength"] = 100
    assert problems(data) == ["$.config.maxSeqLength: must be greater than $.config.rlHyperparams."
                              "maxCompletionLength (512) to leave room for the prompt (got 100)"]


def test_a_field_in_the_wrong_object_says_where_it_belongs():
    data = seed()
    data["config"]["rlHyperparams"]["learningRate"] = 1e-5
    [found] = problems(data)
    assert found.startswith("$.config.rlHyperparams.learningRate: unknown field")
    assert "belongs at $.config.rlHyperparams.optimizer.learningRate" in found


def test_missing_sections_and_bad_terms():
    data = seed()
    del data["execution"]
    data["config"]["reward"]["terms"] = []
    found = problems(data)
    assert "$.config.reward.terms: must be a non-empty list of reward terms (got [])" in found
    assert any(p.startswith("$.execution: must be an object with fields gpus, saveEvery, keepAdapters, dtype (optional), sampler (optional), ray (optional), maxOffPolicySteps (optional), reportTo (optional), reportRolloutsEvery (optional) (missing)")
               for p in found)

    data = seed()
    data["config"]["reward"]["terms"] = [5, {"kind": "rule", "weight": 1.0, "bundle": "builtin:nope"},
                                         {"kind": "rule", "weight": 1.0, "bundle": "gsm8k/scoring@3",
                                          "module": "re-ward"}]
    found = problems(data)
    assert found[0].startswith("$.config.reward.terms[0]: must be an object with fields kind, weight, bundle")
    assert found[1].startswith("$.config.reward.terms[1].bundle: must be a registry bundle NAME or NAME@VERSION")
    assert found[1].endswith('(got "builtin:nope"); it is not a built-in grader')
    assert found[2] == '$.config.reward.terms[2].module: must be a Python module name such as "reward" (got "re-ward")'


def test_optional_fields_and_builtin_bundles():
    data = seed()
    hp = data["config"]["rlHyperparams"]
    hp.update(batchSize=4)
    hp["lora"].update(alpha=64, targetModules=["q_proj", "v_proj"])
    hp["optimizer"].update(weightDecay=0.01, gradClipNorm=0)
    data["config"]["reward"]["terms"].append({"kind": "rule", "weight": 0.1, "bundle": "builtin:gsm8k-format"})
    data["config"]["reward"]["terms"].append({"kind": "rule", "weight": 0.1, "bundle": "other/scoring"})
    run = validate_descriptor(data)
    assert run.term_names() == ["scoring", "gsm8k-format", "scoring-2"]
    assert run.config.reward.terms[1].grader_ref() == "builtin:gsm8k-format"
    with pytest.raises(StropError, match="registry reference"):
        run.config.reward.terms[0].grader_ref()
    with pytest.raises(StropError, match="3 reward terms but 1"):
        run.reward_term_specs(["x"])

    bad = copy.deepcopy(data)
    bad["config"]["rlHyperparams"]["lora"]["targetModules"] = ["q_proj", 3]
    assert problems(bad) == ["$.config.rlHyperparams.lora.targetModules[1]: must be a module name (a non-empty "
                             "string) (got 3)"]


def test_settings_the_loop_cannot_take_are_refused_not_dropped():
    data = seed()
    data["config"]["evalEvery"] = 10
    run = validate_descriptor(data)
    specs = [{"name": "correct", "weight": 1.0, "grader": "builtin:gsm8k"}]
    if "eval_every" in GRPOConfig.help():
        assert run.to_grpo_config("x.jsonl", specs).eval_every == 10
    else:
        with pytest.raises(DescriptorError, match=r"\$\.config\.evalEvery: this version's training loop"):
            run.to_grpo_config("x.jsonl", specs)
    plain = validate_descriptor(seed())
    assert plain.to_grpo_config("x.jsonl", specs, seed=3, system_prompt="Answer with #### N.").seed == 3
    with pytest.raises(StropError, match="unknown training config overrides"):
        plain.to_grpo_config("x.jsonl", specs, sead=3)


def test_model_validate_also_runs_the_cross_field_checks():
    data = seed()
    data["config"]["maxSeqLength"] = 512
    with pytest.raises(Exception, match="maxSeqLength"):
        RunDescriptor.model_validate(data)


def test_top_level_must_be_an_object():
    [found] = problems([1, 2])
    assert found.startswith("$: must be an object with fields kind, project, configName")


def test_load_descriptor_file_problems(tmp_path):
    with pytest.raises(DescriptorError, match="does not exist"):
        load_descriptor(tmp_path / "missing.json")
    with pytest.raises(DescriptorError, match="is a directory"):
        load_descriptor(tmp_path)

    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{\n  "project": "caf\xe9"\n}')
    with pytest.raises(DescriptorError, match=r"not UTF-8 text \(byte 0xe9 at line 2, column 18\)"):
        load_descriptor(latin)

    broken = tmp_path / "broken.json"
    broken.write_text(SEED_003.replace('"maxSteps": 100,', '"maxSteps": 100'))
    with pytest.raises(DescriptorError, match=r"not valid JSON: Expecting ',' delimiter at line 12, column 7"):
        load_descriptor(broken)

    array = tmp_path / "array.json"
    array.write_text("[]")
    with pytest.raises(DescriptorError, match="holds a JSON array; it must be one object"):
        load_descriptor(array)

    twice = tmp_path / "twice.json"
    twice.write_text(SEED_003.replace('"groupSize": 8,', '"groupSize": 4, "groupSize": 8,'))
    with pytest.raises(DescriptorError) as caught:
        load_descriptor(twice)
    assert caught.value.problems == ["$.config.rlHyperparams.groupSize: given 2 times; give it once (got 4 and 8)"]
    assert str(twice) in str(caught.value).splitlines()[0]


# What of a descriptor is not a GRPO loop setting: who runs it, where its data and rewards come from (resolved by
# the control plane before the loop sees them), how many GPUs (read by admission), the supervised method's own
# settings (null in a GRPO descriptor, which may not give them).
NOT_LOOP_SETTINGS = {"$.kind", "$.project", "$.configName", "$.config.dataset", "$.config.method",
                     "$.config.environment", "$.config.reward.terms", "$.execution.gpus", "$.config.sftHyperparams"}


def _leaves(data, path="$"):
    if isinstance(data, dict) and data and path not in NOT_LOOP_SETTINGS:
        for key, value in data.items():
            yield from _leaves(value, f"{path}.{key}")
    else:
        yield path


def test_every_descriptor_setting_reaches_the_one_run_config():
    """A descriptor setting the loop never reads would be silently dropped: each leaf is a GRPOConfig field's
    path, or named above as not the loop's; the value read is the value given."""
    data = seed()
    data["config"]["evalEvery"] = 5
    data["config"]["rlHyperparams"]["maxSteps"] = 7
    data["config"]["rlHyperparams"]["lora"]["targetModules"] = ["q_proj"]
    run = validate_descriptor(data)
    paths = GRPOConfig.descriptor_paths()
    leaves = set(_leaves(run.to_dict()))
    assert leaves - NOT_LOOP_SETTINGS <= set(paths.values()), sorted(leaves - NOT_LOOP_SETTINGS - set(paths.values()))
    config = run.to_grpo_config("x.jsonl", [{"name": "c", "weight": 1.0, "grader": "builtin:gsm8k"}])
    hp = data["config"]["rlHyperparams"]
    assert (config.group_size, config.max_steps, config.lora_target_modules, config.eval_every) == \
        (hp["groupSize"], 7, ["q_proj"], 5)
    assert config.learning_rate == hp["optimizer"]["learningRate"] and config.save_every == data["execution"]["saveEvery"]
    assert config.sampler == "auto"
    data["execution"]["sampler"] = "vllm"
    assert validate_descriptor(data).to_grpo_config("x.jsonl", []).sampler == "vllm"


def test_the_one_validator_names_problems_in_each_front_ends_words():
    problems = dict(GRPOConfig.problems_of({"group_size": 1, "lerning_rate": 0.1}))
    assert "did you mean 'learning_rate'?" in problems["lerning_rate"]
    run = validate_descriptor(seed())
    with pytest.raises(DescriptorError) as caught:   # a value only the loop refuses comes back as a JSON path
        run.to_grpo_config("x.jsonl", [{"name": "c", "weight": 1.0, "grader": "builtin:gsm8k"}], loss_fn="nope")
    assert "$.config.rlHyperparams.lossFn: must be one of" in str(caught.value)
    with pytest.raises(DescriptorError, match=r"\$\.config\.rlHyperparams\.groupSize: must be an integer from 2"):
        run.to_grpo_config("x.jsonl", [{"name": "c", "weight": 1.0, "grader": "builtin:gsm8k"}], group_size=1)


def test_data_parallel_trainers_follow_gpus_unless_given():
    data = seed()
    data["execution"]["ray"] = {"address": "10.0.0.5:6379", "samplers": 2}
    assert validate_descriptor(data).to_grpo_config("x.jsonl", []).ray["trainers"] == 1  # gpus 1: one trainer
    data["execution"]["gpus"] = 4
    run = validate_descriptor(data)
    assert run.to_grpo_config("x.jsonl", []).ray == {"address": "10.0.0.5:6379", "samplers": 2, "envWorkers": 0,
                                                     "trainers": 4}
    data["execution"]["ray"]["trainers"] = 2
    assert any(p.startswith("$.execution.ray.trainers: 2 data-parallel trainers, but $.execution.gpus asks for 4")
               for p in problems(data))
    data["execution"]["gpus"] = 0   # CPUs: the count given
    assert validate_descriptor(data).to_grpo_config("x.jsonl", []).ray["trainers"] == 2
    data["execution"]["ray"]["trainers"] = 0
    assert any(p.startswith("$.execution.ray.trainers: must be an integer from 1 to 256") for p in problems(data))


def test_judge_terms_validate_and_map_to_the_loop():
    data = seed()
    data["config"]["reward"]["terms"].append({"kind": "judge", "weight": 0.5, "rubric": "Is the work shown?"})
    data["config"]["reward"]["terms"].append({"kind": "judge", "weight": 0.2, "rubric": "Correct?", "name": "ext",
                                              "judge": "openai:j@http://127.0.0.1:8000/v1", "timeoutSeconds": 5})
    run = validate_descriptor(data)
    assert run.term_names() == ["scoring", "judge", "ext"]
    specs = run.reward_term_specs(["/b#reward:compute_score", None, None])
    assert specs[1] == {"name": "judge", "weight": 0.5, "judge": {"rubric": "Is the work shown?",
                                                                  "judge": "local:Qwen/Qwen3-0.6B", "timeout": 30.0,
                                                                  "mode": "pointwise"}}
    assert specs[2]["judge"] == {"rubric": "Correct?", "judge": "openai:j@http://127.0.0.1:8000/v1", "timeout": 5.0,
                                 "mode": "pointwise"}

    data = seed()
    data["config"]["reward"]["terms"] = [
        {"kind": "judge", "weight": 1.0},
        {"kind": "judge", "weight": 1.0, "rubric": "ok?", "judge": "gpt-4"},
        {"kind": "judge", "weight": "heavy", "rubric": "ok?"},
        {"kind": "judge", "weight": 1.0, "rubric": "ok?", "timeoutSeconds": 0},
        {"kind": "rule", "weight": 1.0},
        {"kind": "grader", "weight": 1.0, "bundle": "builtin:gsm8k"},
        {"kind": "judge", "weight": 1.0, "rubric": "ok?", "mode": "rank"},
        {"kind": "rule", "weight": 1.0, "bundle": "builtin:gsm8k", "mode": "group"}]
    found = "\n".join(problems(data))
    assert "terms[6].mode" in found and '"pointwise"' in found and '"group"' in found
    assert "terms[7]" in found and "mode is a \"judge\" term's" in found
    assert "terms[0]" in found and 'a "judge" term needs a rubric' in found
    assert "terms[1].judge" in found and "is not a judge form" in found
    assert "terms[2].weight" in found
    assert "terms[3].timeoutSeconds" in found
    assert "terms[4]" in found and 'a "rule" term needs a bundle' in found
    assert "terms[5].kind" in found and '"judge"' in found


def test_an_environment_descriptor_can_name_the_tasks_to_train_on():
    data = seed()
    del data["config"]["dataset"], data["config"]["reward"]
    data["config"]["environment"] = {"name": "finance-sql", "tasks": ["finance-sql/s0/train/c0/q001"]}
    run = validate_descriptor(data)
    config = run.to_grpo_config(None, [])
    assert config.environment == {"name": "finance-sql", "options": {}, "split": "train",
                                  "tasks": ["finance-sql/s0/train/c0/q001"]}
    data["config"]["environment"]["tasks"] = []
    assert problems(data) == ["$.config.environment.tasks: must be the tasks of the split to train on: a pool file "
                              "(`strop envs eval --pool-out`) or a list of task ids (got []); an empty list names no task"]
