"""Multi-turn tool use: tool calls in renderers, episodes in lockstep, masked training, GRPO over episodes."""

import json

import pytest
import torch

import strop
from strop import model_info
from strop.renderers import get_renderer
from strop.renderers.tools import hermes_messages, parse_tool_calls
from strop.rl import GRPOConfig, run_grpo
from strop.errors import StropError
from strop.rl.episodes import EnvironmentSource, ToolEpisode
from strop.rl.rollouts import check_errors, play, rollout_datums, turn_kl
from strop.rl.types import Rollout, Turn
from strop.tokenizer_utils import get_tokenizer
from test_control import home, workspace  # noqa: F401 - fixtures of the control-plane tests
from toy_env import TOOLS, ToyEnv


def test_tool_calls_are_parsed_or_explained():
    calls, problems = parse_tool_calls('I will add.<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>')
    assert [(c.name, c.arguments) for c in calls] == [("add", {"a": 1, "b": 2})] and problems == []
    cut, _ = parse_tool_calls('<tool_call>{"name": "submit_answer", "arguments": "{\\"answer\\": \\"3\\"}"}')
    assert cut[0].arguments == {"answer": "3"}  # cut at the stop string, arguments sent as JSON text
    none, problems = parse_tool_calls('<tool_call>{"name": add}</tool_call> and <tool_call>[1]</tool_call>')
    assert none == [] and "not valid JSON" in problems[0] and '"name"' in problems[1]
    assert parse_tool_calls("no call here") == ([], [])


def test_tools_are_described_and_results_wrapped():
    messages = hermes_messages([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"},
                                {"role": "assistant", "content": "<tool_call>...</tool_call>"},
                                {"role": "tool", "content": "3.0"}], TOOLS)
    assert messages[0]["content"].startswith("Be brief.") and '"name": "submit_answer"' in messages[0]["content"]
    assert messages[-1] == {"role": "user", "content": "<tool_response>\n3.0\n</tool_response>"}


def _setup(tiny_model_dir):
    model = str(tiny_model_dir)
    service = strop.ServiceClient()
    training = service.create_lora_training_client(base_model=model, rank=4, seed=0)
    renderer = get_renderer(model_info.get_recommended_renderer_name(model), get_tokenizer(model))
    return training, renderer


def _episodes(envs, tasks, group_size):
    return [[ToolEpisode(envs[t * group_size + g], task) for g in range(group_size)] for t, task in enumerate(tasks)]


def test_episodes_run_in_lockstep_until_done_or_out_of_turns(tiny_model_dir):
    training, renderer = _setup(tiny_model_dir)
    envs = [ToyEnv(max_turns=3) for _ in range(4)]
    groups = play(training.save_weights_and_get_sampling_client(), renderer,
                  _episodes(envs, envs[0].tasks("train", 2), 2), max_tokens=12, seed=0)
    assert [len(g) for g in groups] == [2, 2]
    for episode in (e for g in groups for e in g):
        assert 1 <= len(episode.turns) <= 3
        # a random model writes no valid call: every reply gets an observation that says how to call a tool
        assert episode.parse_errors == len(episode.turns) and episode.reward == 0.0
        assert "<tool_call>" in episode.messages[2]["content"] or "No tool call found" in episode.messages[-1]["content"]
        first = episode.turns[0].prompt.to_ints()
        assert all(t.prompt.to_ints()[:len(first)] == first for t in episode.turns)  # each turn reads all before


def test_only_model_tokens_are_trained():
    prompt = strop.types.ModelInput.from_ints([5, 6, 7])
    episode = Rollout(turns=(Turn(prompt=prompt, tokens=(8, 9), logprobs=(-0.5, -0.25), text="", stop_reason="stop"),))
    [datum] = rollout_datums([episode], torch.tensor([0.5]))
    assert datum.model_input.to_ints() == [5, 6, 7, 8]
    assert datum.loss_fn_inputs["target_tokens"].to_torch().tolist() == [0, 0, 8, 9]
    assert datum.loss_fn_inputs["advantages"].to_torch().tolist() == [0.0, 0.0, 0.5, 0.5]
    assert datum.loss_fn_inputs["logprobs"].to_torch().tolist() == [0.0, 0.0, -0.5, -0.25]


def test_grpo_over_episodes_writes_rubrics_and_transcripts(tiny_model_dir, tmp_path):
    config = GRPOConfig(base_model=str(tiny_model_dir), environment={"name": "toy_env:ToyEnv", "options": {"max_turns": 2}},
                        batch_size=2, group_size=2, max_steps=2, max_completion_length=10, save_every=1, seed=0)
    result = run_grpo(config, tmp_path / "run", progress=False)
    assert [m["step"] for m in result.metrics] == [0, 1]
    row = result.metrics[0]
    assert row["modelTurns"] >= 1 and "rubric/submitted" in row and "reward/toy_env:ToyEnv" in row
    assert row["toolCallParseErrors"] > 0
    rollout = json.loads((tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()[0])
    assert [m["role"] for m in rollout["transcript"][:3]] == ["user", "assistant", "tool"] and rollout["state"]["task_id"].startswith("train-")
    assert (tmp_path / "run" / "final" / "adapter_config.json").exists()


def test_a_descriptor_run_in_an_environment(workspace, capsys, monkeypatch):  # noqa: F811
    from pathlib import Path

    from test_control import descriptor, run
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # the run worker imports toy_env too
    env_run = descriptor(workspace, **{"config.dataset": None, "config.reward": None,
                                       "config.environment": {"name": "toy_env:ToyEnv", "options": {"max_turns": 2}},
                                       "config.rlHyperparams.maxSteps": 2, "config.rlHyperparams.groupSize": 2})
    code, out, err = run(capsys, "runs", "start", "-f", env_run, "--dry-run")
    assert code == 0 and "environment toy_env:ToyEnv" in out, err
    run_id = run(capsys, "runs", "start", "-f", env_run, "--jq", ".runId")[1].strip()
    code, out, _ = run(capsys, "runs", "wait", run_id, "--exit-status", "--timeout", "300", "-o", "json")
    assert code == 0, out
    metrics = json.loads(run(capsys, "runs", "metrics", run_id, "-o", "json")[1])
    assert [m["step"] for m in metrics] == [0, 1] and "rubric/submitted" in metrics[0]
    both = descriptor(workspace, **{"config.environment": {"name": "no-such-env"}})
    code, _, err = run(capsys, "runs", "start", "-f", both, "--dry-run")
    assert code == 1 and "exactly one of dataset" in err
    unknown = descriptor(workspace, **{"config.dataset": None, "config.environment": {"name": "no-such-env"}})
    code, _, err = run(capsys, "runs", "start", "-f", unknown, "--dry-run")
    assert code == 1 and "no environment 'no-such-env'" in err


def test_kl_to_the_base_model_is_charged_per_turn_token(tiny_model_dir):
    base = strop.ServiceClient().create_sampling_client(base_model=str(tiny_model_dir))
    first = strop.types.ModelInput.from_ints([5, 6, 7])
    second = first.append(strop.types.EncodedTextChunk(tokens=[8, 9, 30, 31]))  # the observation joins the prompt
    turns = (Turn(prompt=first, tokens=(8, 9), logprobs=(-0.5, -0.25), text="", stop_reason="stop"),
             Turn(prompt=first, tokens=(), logprobs=(), text="", stop_reason="length"),
             Turn(prompt=second, tokens=(40,), logprobs=(-1.0,), text="", stop_reason="stop"))
    episode = Rollout(turns=turns)
    [kl] = turn_kl(base, [episode])
    full = base.compute_logprobs_many([first.append(strop.types.EncodedTextChunk(tokens=[8, 9])),
                                       second.append(strop.types.EncodedTextChunk(tokens=[40]))]).result()
    assert kl[1] == [] and len(kl[0]) == 2 and len(kl[2]) == 1
    assert kl[0] == pytest.approx([-0.5 - full[0][3], -0.25 - full[0][4]]) and kl[2] == pytest.approx([-1.0 - full[1][7]])
    [datum] = rollout_datums([episode], torch.tensor([0.5]), [kl], kl_beta=0.1)  # the empty turn trains nothing
    # the second turn's prompt extends the first's prompt and reply: one sequence, the observation masked
    assert datum.model_input.to_ints() == [5, 6, 7, 8, 9, 30, 31]
    assert datum.loss_fn_inputs["target_tokens"].to_torch().tolist() == [0, 0, 8, 9, 0, 0, 40]
    advantages = datum.loss_fn_inputs["advantages"].to_torch().tolist()
    assert advantages[2:4] == pytest.approx([0.5 - 0.1 * k for k in kl[0]]) and advantages[4:6] == [0.0, 0.0]
    assert advantages[-1] == pytest.approx(0.5 - 0.1 * kl[2][0])
    assert datum.loss_fn_inputs["logprobs"].to_torch().tolist() == [0.0, 0.0, -0.5, -0.25, 0.0, 0.0, -1.0]


def test_a_turn_whose_prompt_was_re_rendered_differently_is_a_datum_of_its_own():
    first = strop.types.ModelInput.from_ints([5, 6, 7])
    changed = strop.types.ModelInput.from_ints([5, 6, 7, 8, 10, 30])  # the reply re-tokenized as 8, 10, not 8, 9
    episode = Rollout(turns=(Turn(prompt=first, tokens=(8, 9), logprobs=(-0.5, -0.25), text="", stop_reason="stop"),
                             Turn(prompt=changed, tokens=(40, 41), logprobs=(-1.0, -2.0), text="", stop_reason="stop")))
    one, two = rollout_datums([episode], torch.tensor([1.0]))
    assert one.model_input.to_ints() == [5, 6, 7, 8] and two.model_input.to_ints() == [5, 6, 7, 8, 10, 30, 40]
    assert two.loss_fn_inputs["target_tokens"].to_torch().tolist() == [0] * 5 + [40, 41]


def test_kl_scores_an_episode_as_one_sequence_where_its_turns_chain(tiny_model_dir):
    """Turns whose prompts extend the tokens before them are scored in one sequence, with the values each turn
    scored alone gives; a turn whose prompt was re-rendered differently starts a sequence of its own."""
    base = strop.ServiceClient().create_sampling_client(base_model=str(tiny_model_dir))
    scored = []

    class Counting:  # the real client; records what it was asked to score
        def compute_logprobs_many(self, inputs):
            scored.extend(i.to_ints() for i in inputs)
            return base.compute_logprobs_many(inputs)

    first = strop.types.ModelInput.from_ints([5, 6, 7])
    chained = strop.types.ModelInput.from_ints([5, 6, 7, 8, 9, 30, 31])
    changed = strop.types.ModelInput.from_ints([5, 6, 7, 8, 10, 30, 31, 40, 41, 32])
    turns = (Turn(prompt=first, tokens=(8, 9), logprobs=(-0.5, -0.25), text="", stop_reason="stop"),
             Turn(prompt=chained, tokens=(40, 41), logprobs=(-1.0, -2.0), text="", stop_reason="stop"),
             Turn(prompt=changed, tokens=(50,), logprobs=(-3.0,), text="", stop_reason="stop"))
    [kl] = turn_kl(Counting(), [Rollout(turns=turns)])
    assert scored == [[5, 6, 7, 8, 9, 30, 31, 40, 41], [5, 6, 7, 8, 10, 30, 31, 40, 41, 32, 50]]
    alone = [turn_kl(base, [Rollout(turns=(t,))])[0][0] for t in turns]
    assert [len(k) for k in kl] == [2, 2, 1]
    for together, apart in zip(kl, alone):
        assert together == pytest.approx(apart, abs=1e-5)
    # two untrained first turns (a branched group's shared prefix): the scored sequence starts at the third
    scored.clear()
    [kl] = turn_kl(Counting(), [Rollout(turns=turns)], [2])
    assert kl[:2] == [[], []] and scored == [[5, 6, 7, 8, 10, 30, 31, 40, 41, 32, 50]]

def test_a_merged_episode_trains_as_its_turns_would_one_by_one(tiny_model_dir):
    """The losses are sums over positions, so one datum for an episode gives the gradient its per-turn datums
    would (the causal model reads the same prefix for every sampled token)."""
    model = str(tiny_model_dir)
    first = strop.types.ModelInput.from_ints([5, 6, 7])
    second = strop.types.ModelInput.from_ints([5, 6, 7, 8, 9, 30, 31])
    turns = (Turn(prompt=first, tokens=(8, 9), logprobs=(-0.5, -0.25), text="", stop_reason="stop"),
             Turn(prompt=second, tokens=(40, 41), logprobs=(-1.0, -2.0), text="", stop_reason="stop"))
    [merged] = rollout_datums([Rollout(turns=turns)], torch.tensor([0.7]))
    apart = [d for turn in turns for d in rollout_datums([Rollout(turns=(turn,))], torch.tensor([0.7]))]
    losses = []
    for datums in ([merged], apart):
        training = strop.ServiceClient().create_lora_training_client(base_model=model, rank=4, seed=0)
        losses.append(training.forward_backward(datums, loss_fn="importance_sampling").result().metrics["loss:sum"])
    assert losses[0] == pytest.approx(losses[1], rel=1e-4) and losses[0] != 0.0


def test_an_environment_run_accepts_a_kl_penalty(tiny_model_dir, tmp_path):
    config = GRPOConfig(base_model=str(tiny_model_dir), environment={"name": "toy_env:ToyEnv", "options": {"max_turns": 2}},
                        batch_size=2, group_size=2, max_steps=1, max_completion_length=8, kl_beta=0.05, seed=0)
    assert config.validate() == []
    assert [m["step"] for m in run_grpo(config, tmp_path / "run", progress=False).metrics] == [0]


def test_environment_errors_are_kept_and_too_many_fail_the_step_before_its_update():
    class Broken(ToyEnv):
        def step(self, call):
            raise RuntimeError("database is gone")
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    env = Broken()
    task = env.tasks("train", 1)[0]
    episodes = [ToolEpisode(env, task) for _ in range(4)]
    observation = episodes[0].act(call)
    assert "database is gone" in observation and not episodes[0].done  # the model sees it and may go on
    assert episodes[0].environment_errors == ["RuntimeError: database is gone"]
    finished = lambda: [e.finish([], []) for e in episodes]  # noqa: E731
    check_errors(finished(), 0.5, step=3, failure=EnvironmentSource.failure)  # 1 of 4: under the limit
    episodes[1].act(call)
    episodes[2].act(call)
    with pytest.raises(StropError, match=r"(?s)step 3: 3 of 4 episodes met an environment error.*database is gone"):
        check_errors(finished(), 0.5, step=3, failure=EnvironmentSource.failure)
