"""A run can start from a tuned model: the descriptor's baseModel names a modelId, the run pins its base model
and adapter, trains on from that adapter, and `runs get` shows base -> tuned -> this run's model."""

import json

from safetensors.torch import load_file

from test_control import descriptor, home, run, workspace  # noqa: F401 - the control-plane fixtures


def _finished(capsys, path) -> dict:
    run_id = run(capsys, "runs", "start", "-f", path, "--jq", ".runId")[1].strip()
    code, out, _ = run(capsys, "runs", "wait", run_id, "--exit-status", "--timeout", "300", "-o", "json")
    assert code == 0, out
    return json.loads(run(capsys, "runs", "get", run_id, "-o", "json")[1])


def test_a_run_continues_from_a_tuned_model(workspace, capsys):  # noqa: F811
    first = _finished(capsys, descriptor(workspace, **{"config.rlHyperparams.maxSteps": 1}))
    assert first["lineage"] == [{"baseModel": "strop/tiny-random"}, {"modelId": first["modelId"]}]
    second_path = descriptor(workspace, **{"baseModel": first["modelId"], "config.rlHyperparams.maxSteps": 1})
    code, out, err = run(capsys, "runs", "start", "-f", second_path, "--dry-run", "-o", "json")
    assert code == 0, err
    pinned = json.loads(out)["pinned"]["baseModel"]
    assert pinned["id"] == "strop/tiny-random" and pinned["initModel"]["modelId"] == first["modelId"]
    # the KL reference is the tuned model the run starts from, pinned by name with the settings of what it learns from
    assert json.loads(out)["pinned"]["rl"] == {"klReference": "start", "klReferenceModel": first["modelId"],
                                               "varianceOn": None, "warmupSteps": 0,
                                               "dynamicSampling": {"enabled": False, "maxTasksPerStep": None},
                                               "branchAtTurn": None, "scoutTemperature": None, "scout": "policy",
                                               "referenceMembers": 0, "referenceWhen": "always",
                                               "identicalTurns": "skip", "sftMix": None,
                                               "lossFn": "importance_sampling", "advantageEstimator": "group-mean",
                                               "lossAggregation": "token-sum", "lossNormalizer": None,
                                               "overlong": "keep", "overlongBuffer": None, "importanceRatio": "token",
                                               "clipLow": None, "clipHigh": None, "updatesPerBatch": 1,
                                               "minibatches": 1}
    second = _finished(capsys, second_path)
    assert second["baseModel"] == "strop/tiny-random"
    assert second["lineage"] == [{"baseModel": "strop/tiny-random"},
                                 {"modelId": first["modelId"], "runId": first["runId"]},
                                 {"modelId": second["modelId"]}]
    config = json.loads(open(f"{second['runDir']}/config.json").read())
    start = load_file(f"{config['init_adapter']}/adapter_model.safetensors")
    before = load_file(f"{first['runDir']}/final/adapter_model.safetensors")
    assert start.keys() == before.keys() and all((start[k] == before[k]).all() for k in before)
    code, _, err = run(capsys, "runs", "start", "-f", descriptor(workspace, baseModel="model-nope"), "--dry-run")
    assert code == 1 and "$.baseModel: no tuned model 'model-nope'" in err


def test_supervised_then_grpo_through_the_control_plane(workspace, capsys):  # noqa: F811
    pairs = workspace / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"What is {i} + 1?", "completion": f"#### {i + 1}"}) + "\n"
                             for i in range(16)))
    code, out, err = run(capsys, "registry", "datasets", "register", "arith/sft", "-f", pairs, "-o", "json")
    assert code == 0, err
    sft = {"config.method": "sft", "config.dataset": "arith/sft", "config.reward": None,
           "config.rlHyperparams": None,
           "config.sftHyperparams": {"maxSteps": 2, "batchSize": 4, "lora": {"rank": 4},
                                     "optimizer": {"learningRate": 1e-3}}}
    # a question/answer dataset for sft, or transcripts for grpo, is refused at admission with the reason
    wrong = descriptor(workspace, **{**sft, "config.dataset": "arith/train"})
    code, _, err = run(capsys, "runs", "start", "-f", wrong, "--dry-run")
    assert code == 1 and "question/answer dataset, for method grpo; method sft needs" in err
    code, _, err = run(capsys, "runs", "start", "-f", descriptor(workspace, **{"config.dataset": "arith/sft"}),
                       "--dry-run")
    assert code == 1 and "for method sft; method grpo needs question/answer rows" in err
    # a GRPO descriptor turned to sft keeps its rlHyperparams: used for what they share, the rest listed as unused
    copied = descriptor(workspace, **{**{k: v for k, v in sft.items() if k != "config.rlHyperparams"},
                                      "config.sftHyperparams": None, "config.rlHyperparams.maxSteps": 2})
    code, out, err = run(capsys, "runs", "start", "-f", copied, "--dry-run", "-o", "json")
    assert code == 0, err
    assert "$.config.rlHyperparams.groupSize: supervised fine-tuning samples nothing" in json.loads(out)["pinned"]["notUsed"]
    both = descriptor(workspace, **{**sft, "config.rlHyperparams": json.loads(copied.read_text())["config"]["rlHyperparams"]})
    code, _, err = run(capsys, "runs", "start", "-f", both, "--dry-run")
    assert code == 1 and "give sftHyperparams or rlHyperparams with method sft, not both" in err

    warm = _finished(capsys, descriptor(workspace, **sft))
    assert warm["method"] == "sft" and warm["status"] == "succeeded"
    metrics = json.loads(run(capsys, "runs", "metrics", warm["runId"], "-o", "json")[1])
    assert [m["step"] for m in metrics if m["step"] >= 0] == [0, 1] and "evalLoss" in metrics[-1]
    rl = _finished(capsys, descriptor(workspace, **{"baseModel": warm["modelId"], "config.rlHyperparams.maxSteps": 1}))
    assert [step.get("modelId") or step.get("baseModel") for step in rl["lineage"]] == \
        ["strop/tiny-random", warm["modelId"], rl["modelId"]]
