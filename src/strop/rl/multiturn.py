"""Multi-turn tool-use episodes for GRPO: a model talks to an environment until it answers or runs out of turns.

    episodes = run_episodes(sampler, renderer, envs, tasks, group_size=4, max_tokens=96, temperature=1.0, seed=0)
    datums = episode_datums(episodes_of_one_task, advantages)

Each turn the whole conversation so far is rendered (tools described Hermes-style, or in the chat template's
own format) and the model samples one reply. A `<tool_call>` in it goes to the environment and the tool's reply
becomes the next message; a call that cannot be parsed, or a reply with no call, gets an observation saying
so. The episode ends when the environment says done or after `max_turns` replies. Whatever an environment
returns (a remote one included), the model reads at most OBSERVATION_CHARS characters of it, with a line saying
what was cut (`cap_observation`).

Training: each turn is one datum, its prompt (everything the model read, observations included) masked and
only the tokens the model sampled trained, all with the episode's group-relative advantage. The prompt of a
turn is exactly what the sampler was given, so the logprobs are the behaviour policy's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from strop import types
from strop.envs.base import Task, ToolCall
from strop.errors import StropError
from strop.renderers import get_text_content
from strop.renderers.tools import STOP, parse_tool_calls

OBSERVATION_CHARS = 16_000  # ~4,000 tokens: a page of rows; one 37 MB observation would have gone in whole
NO_CALL = ("No tool call found. Call a tool as <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>; "
           "give your final answer with the submit_answer tool.")


@dataclass
class Turn:
    prompt: types.ModelInput
    tokens: list[int]
    logprobs: list[float]
    text: str
    stop_reason: str | None


@dataclass
class Episode:
    task: Task
    messages: list[dict]
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    state: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    parse_errors: int = 0
    environment_errors: list[str] = field(default_factory=list)  # a tool call the environment raised on

    @property
    def model_tokens(self) -> int:
        return sum(len(t.tokens) for t in self.turns)

    def transcript(self) -> list[dict]:
        return [dict(m) for m in self.messages]


def run_episodes(sampler, renderer, envs, tasks: list[Task], *, group_size: int, max_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0, seed: int = 0, max_turns: int | None = None,
                 system_prompt: str | None = None) -> list[list[Episode]]:
    """`group_size` episodes per task, run in lockstep so each turn's replies are sampled as one batch.
    `envs` holds one environment per episode (len(tasks) * group_size), each reset here."""
    if len(envs) < len(tasks) * group_size:
        raise ValueError(f"need {len(tasks) * group_size} environments for {len(tasks)} tasks x {group_size}, "
                         f"got {len(envs)}")
    tools = envs[0].tools()
    limit = max_turns or envs[0].max_turns
    episodes, owners = [], []
    for t, task in enumerate(tasks):
        for g in range(group_size):
            env = envs[t * group_size + g]
            first = env.reset(task)
            messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
            messages.append({"role": "user", "content": cap_observation(first.content)})
            episodes.append(Episode(task=task, messages=messages))
            owners.append(env)
    stops = [*renderer.get_stop_sequences(), STOP]
    for turn in range(limit):
        active = [i for i, e in enumerate(episodes) if not e.done]
        if not active:
            break
        futures = []
        for i in active:
            prompt = renderer.build_tool_prompt(episodes[i].messages, tools)
            params = types.SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=stops,
                                          seed=seed * 1_000_003 + i * 7_919 + turn)
            futures.append((i, prompt, sampler.sample(prompt=prompt, num_samples=1, sampling_params=params)))
        for i, prompt, future in futures:
            seq = future.result().sequences[0]
            message, _ = renderer.parse_response(seq.tokens)
            text = get_text_content(message)
            episode, env = episodes[i], owners[i]
            episode.turns.append(Turn(prompt=prompt, tokens=list(seq.tokens), logprobs=list(seq.logprobs), text=text,
                                      stop_reason=seq.stop_reason))
            episode.messages.append({"role": "assistant", "content": text})
            observation = _act(episode, env, text)
            if not episode.done:
                episode.messages.append({"role": "tool", "content": observation})
    for episode, env in zip(episodes, owners):
        episode.state = env.state()
    return [episodes[t * group_size:(t + 1) * group_size] for t in range(len(tasks))]


def _act(episode: Episode, env, text: str) -> str:
    calls, problems = parse_tool_calls(text)
    if not calls:
        episode.parse_errors += 1
        return problems[0] + " Write the call again as valid JSON." if problems else NO_CALL
    result = call_tool_safely(env, calls[0])
    observation = cap_observation(result.observation.content)
    if result.info.get("environmentError"):
        episode.environment_errors.append(str(result.info["environmentError"]))
    if len(calls) > 1:
        observation += f"\n(only the first of your {len(calls)} tool calls was run; make one call per turn)"
    if result.done:
        episode.done, episode.reward, episode.info = True, float(result.reward), dict(result.info)
    return observation


def cap_observation(text: str, limit: int = OBSERVATION_CHARS) -> str:
    """An environment's text as a model reads it: whole, or its first `limit` characters and a line saying how
    much was cut (so the model, and whoever reads the transcript, can tell)."""
    text = text if isinstance(text, str) else str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[observation truncated: {len(text):,} characters, only the first {limit:,} shown]"


def turn_kl(base_sampler, episodes: list[Episode]) -> list[list[list[float]]]:
    """Per episode, per turn, per sampled token: log p_sampler - log p_base (the model with the adapter off),
    scored over each turn's own prompt, which holds the observations so far."""
    turns = [t for e in episodes for t in e.turns if t.tokens]
    base_lps = base_sampler.compute_logprobs_many(
        [t.prompt.append(types.EncodedTextChunk(tokens=t.tokens)) for t in turns]).result() if turns else []
    by_turn = iter([[lp - b for lp, b in zip(t.logprobs, base[t.prompt.length:])] for t, base in zip(turns, base_lps)])
    return [[next(by_turn) if t.tokens else [] for t in e.turns] for e in episodes]


def episode_datums(episodes: list[Episode], advantages_G: torch.Tensor, kl_G: list[list[list[float]]] | None = None,
                   kl_beta: float = 0.0) -> list[types.Datum]:
    """One datum per turn: the prompt masked, the sampled tokens trained with the episode's advantage (less
    beta x each token's KL to the base model, when `kl_G` is given)."""
    datums = []
    for g, (episode, advantage) in enumerate(zip(episodes, advantages_G.tolist())):
        for i, turn in enumerate(episode.turns):
            if not turn.tokens:
                continue
            ob_len = turn.prompt.length - 1
            toks = turn.tokens
            adv_T = [advantage] * len(toks)
            if kl_G is not None:
                adv_T = [a - kl_beta * k for a, k in zip(adv_T, kl_G[g][i])]
            datums.append(types.Datum(
                model_input=turn.prompt.append(types.EncodedTextChunk(tokens=toks[:-1])),
                loss_fn_inputs={
                    "target_tokens": types.TensorData.from_torch(torch.tensor([0] * ob_len + toks)),
                    "logprobs": types.TensorData.from_torch(torch.tensor([0.0] * ob_len + turn.logprobs)),
                    "advantages": types.TensorData.from_torch(torch.tensor([0.0] * ob_len + adv_T)),
                }))
    return datums


def call_tool_safely(env, call: ToolCall):
    """`env.step(call)`; an environment that raises is turned into an observation (a broken environment must
    not kill a run, but it is counted)."""
    try:
        return env.step(call)
    except Exception as exc:  # noqa: BLE001
        from strop.envs.base import Observation, StepResult
        reason = f"{type(exc).__name__}: {exc}"
        return StepResult(observation=Observation(f"the environment failed: {reason}"),
                          info={"environmentError": reason})


class EnvPool:
    """One environment per episode of a step (batch x group), made once and reset for every episode. Only the
    first is made at once (its tools and tasks size the run); `fill()` makes the rest once the run is admitted."""

    def __init__(self, spec: dict, size: int):
        from strop.envs import get_env
        self.name, self.options, self.size = spec["name"], dict(spec.get("options") or {}), size
        self._make = lambda: get_env(self.name, **self.options)
        self.envs = [self._make()]

    def fill(self) -> "EnvPool":
        while len(self.envs) < self.size:
            self.envs.append(self._make())
        return self

    def tasks(self, split: str, limit: int | None = None) -> list[Task]:
        return self.envs[0].tasks(split, limit)

    def close(self) -> None:
        for env in self.envs:
            env.close()


def check_environment_errors(episodes, limit: float, step: int) -> None:
    """Fail the run when more than `limit` of this step's episodes ended in an environment error (their reward
    is 0 and says nothing about the policy), showing the first errors."""
    errors = [e.environment_errors[0] for e in episodes if e.environment_errors]
    if episodes and len(errors) / len(episodes) > limit:
        first = "\n  ".join(list(dict.fromkeys(errors))[:3])
        raise StropError(f"step {step}: {len(errors)} of {len(episodes)} episodes met an environment error, "
                         f"more than the {limit:.0%} allowed (max_reward_error_fraction / "
                         f"config.reward.maxErrorFraction); first errors:\n  {first}")


def train_env_step(step: int, tasks: list[Task], config, training, renderer, pool: EnvPool, adam, log, epoch,
                   base_sampler=None) -> dict:
    """One GRPO step over tool-use episodes; the metrics row (with the behaviour rubrics as weight-0 metrics).
    With `base_sampler` (klBeta > 0), each trained token's advantage pays beta x its KL to the base model."""
    import statistics
    import time

    from strop.envs.rubrics import rubric_metrics
    from strop.rl.grpo import apply_update, update_metrics
    from strop.rl.advantages import group_advantages, is_zero_variance
    t0 = time.perf_counter()
    sampler = training.save_weights_and_get_sampling_client()
    groups = run_episodes(sampler, renderer, pool.fill().envs, tasks, group_size=config.group_size,
                          max_tokens=config.max_completion_length, temperature=config.temperature, top_p=config.top_p,
                          seed=config.seed * 1_009 + step, system_prompt=config.system_prompt)
    sample_seconds = time.perf_counter() - t0
    datums, zero_var, rollouts, kl_values = [], 0, [], []
    for g_index, episodes in enumerate(groups):
        rewards_G = torch.tensor([e.reward for e in episodes])
        advantages_G = group_advantages(rewards_G, scale_by_std=config.scale_by_std)
        for e, advantage in zip(episodes, advantages_G.tolist()):
            rollouts.append({"step": step, "group": g_index, "task": e.task.id, "question": e.task.prompt,
                             "gold": e.task.answer, "reward": e.reward, "advantage": advantage, "turns": len(e.turns),
                             "transcript": e.transcript(), "state": e.state, "info": e.info})
        if is_zero_variance(rewards_G):
            zero_var += 1
            continue
        kl_G = turn_kl(base_sampler, episodes) if base_sampler is not None else None
        if kl_G is not None:
            kl_values.extend(v for episode in kl_G for turn in episode for v in turn)
        datums.extend(episode_datums(episodes, advantages_G, kl_G, config.kl_beta))
    episodes = [e for group in groups for e in group]
    check_environment_errors(episodes, config.max_reward_error_fraction, step)  # before the update, not after
    fb_metrics, optim_metrics, train_seconds = apply_update(training, datums, config, adam)
    turns = [t for e in episodes for t in e.turns]
    n_tokens = sum(len(t.tokens) for t in turns)
    rewards = [e.reward for e in episodes]
    row = {
        "step": step, "epoch": epoch, "reward": statistics.fmean(rewards), "rewardStd": statistics.pstdev(rewards),
        f"reward/{pool.name}": statistics.fmean(rewards),
        "zeroVarianceGroups": zero_var / len(groups),
        "rewardErrors": sum(1 for e in episodes if e.environment_errors),
        "toolCallParseErrors": sum(e.parse_errors for e in episodes) / len(episodes),
        "modelTurns": len(turns) / len(episodes),
        "completionLength": n_tokens / len(episodes),
        "clippedFraction": sum(t.stop_reason == "length" for t in turns) / max(1, len(turns)),
        "tokensPerSecond": n_tokens / sample_seconds if sample_seconds > 0 else 0.0,
        "stepSeconds": time.perf_counter() - t0, "sampleSeconds": sample_seconds, "trainSeconds": train_seconds,
        "datums": len(datums), **update_metrics(fb_metrics, optim_metrics, config),
        **rubric_metrics([e.state for e in episodes]),
    }
    if kl_values:
        row["klBase"] = statistics.fmean(kl_values)
    log.write_rollouts(rollouts)
    return row
