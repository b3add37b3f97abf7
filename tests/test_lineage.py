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
