"""Turn-level credit (strop.rl.branching): a group branched at a turn shares its prefix token for token and only
its continuations carry advantages; turns a whole group wrote alike are left out of the update, which changes no
gradient; the settings through GRPOConfig, the run descriptor and `strop train`; one tiny run.

The policy of the hand-worked tests is scripted (`Scripted`: reply j of a request is script(turn, j)), so which
call is made at which turn, and so every reward and advantage, is known in advance; the environment, the
renderer, the tokenizer, the rollout loop and the datums are the real ones."""

import itertools
from concurrent.futures import Future

import pytest
import torch

from strop import model_info, types
from strop.errors import StropError
from strop.renderers import get_renderer
from strop.rl.branching import identical_turns, play_branched, skips_identical, untrained_turns
from strop.rl.config import GRPOConfig
from strop.rl.episodes import ToolEpisode
from strop.rl.rollouts import rollout_datums
from strop.rl.types import Rollout, Turn
from strop.tokenizer_utils import get_tokenizer
from strop.tool_calls import ToolCall
from test_control import home, workspace  # noqa: F401 - fixtures of the control-plane tests
from toy_env import ToyEnv


def call(name: str, **arguments) -> str:
    import json
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


class Scripted:
    """A sampler whose j-th sample of a request at model turn `turn` (0-based: the replies in its prompt)
    is script(turn, j), encoded by the model's tokenizer; each token's logprob is -1. It keeps every request."""

    def __init__(self, renderer, script):
        self.renderer, self.script, self.requests = renderer, script, []

    def sample(self, prompt, num_samples, sampling_params):
        text = self.renderer.tokenizer.decode(prompt.to_ints())
        turn = text.count("<|im_start|>assistant") - 1  # the replies before this one
        self.requests.append((turn, num_samples, prompt.to_ints()))
        sequences = []
        for j in range(num_samples):
            tokens = self.renderer.tokenizer.encode(self.script(turn, j), add_special_tokens=False)
            tokens += self.renderer.tokenizer.encode("<|im_end|>", add_special_tokens=False)
            sequences.append(types.SampledSequence(stop_reason="stop", tokens=tokens, logprobs=[-1.0] * len(tokens)))
        done = Future()
        done.set_result(types.SampleResponse(sequences=sequences))
        return done


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    model = str(tiny_model_dir)
    return get_renderer(model_info.get_recommended_renderer_name(model), get_tokenizer(model))


def episodes_of(envs, tasks):
    def make(n):
        return [[ToolEpisode(envs[t * n + g], task) for g in range(n)] for t, task in enumerate(tasks)]
    return make


def add_then_answer(turn, j):
    """Turn 1: everyone adds (the scout's call); turn 2: samples 0 and 1 submit the sum (task 0: 0 + 2), 2 and 3
    a wrong one."""
    if turn == 0:
        return call("add", a=0, b=2)
    return call("submit_answer", answer="2" if j < 2 else "5")


def test_a_branched_group_shares_its_prefix_and_only_continuations_carry_advantages(renderer):
    envs = [ToyEnv(max_turns=3) for _ in range(4)]
    sampler = Scripted(renderer, add_then_answer)
    [group] = play_branched(sampler, renderer, episodes_of(envs, envs[0].tasks("train", 1)), group_size=4,
                            branch_at=2, max_tokens=64, seed=0)
    # the sampler: the prefix once (one sample), then the four continuations as one request from one prompt
    assert [(turn, n) for turn, n, _ in sampler.requests] == [(0, 1), (1, 4)]
    assert [r.reward for r in group] == [1.0, 1.0, 0.1, 0.1] and [r.shared_turns for r in group] == [1] * 4
    first = group[0].turns[0]
    assert all(r.turns[0] == first for r in group) and first.text == call("add", a=0, b=2)
    # every member's environment was put in the scout's state: the add replayed, then its own submit
    assert [env.state()["turns"] for env in envs] == [2, 2, 2, 2]
    assert all(r.messages[2] == {"role": "tool", "content": "2.0"} for r in group), group[0].messages

    advantages_G = torch.tensor([r.reward for r in group]) - 0.55          # [0.45, 0.45, -0.45, -0.45]
    datums = rollout_datums(group, advantages_G)
    assert len(datums) == 4
    cont = group[0].turns[1].prompt.length                     # where the continuation's tokens begin
    inputs = [d.model_input.to_ints() for d in datums]
    assert all(ids[:cont] == inputs[0][:cont] for ids in inputs)   # the prefix, token for token
    for d, a in zip(datums, [0.45, 0.45, -0.45, -0.45]):
        adv = d.loss_fn_inputs["advantages"].to_torch().tolist()
        targets = d.loss_fn_inputs["target_tokens"].to_torch().tolist()
        assert adv[:cont - 1] == [0.0] * (cont - 1) and targets[:cont - 1] == [0] * (cont - 1)  # prefix: as prompt
        assert adv[cont - 1:] == pytest.approx([a] * (len(adv) - cont + 1))                     # continuation
    # the trainer sees one untrained prefix for the group's four rows: it runs it once
    from strop.engine.trainer import shared_prefixes
    width = max(len(ids) for ids in inputs)
    ids_B_T = torch.tensor([ids + [0] * (width - len(ids)) for ids in inputs])
    mask_B_T = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in inputs]).bool()
    active_B_T = torch.zeros_like(mask_B_T)
    for b, d in enumerate(datums):
        adv = d.loss_fn_inputs["advantages"].to_torch()
        active_B_T[b, :len(adv)] = adv != 0
    lengths, prefix_of, owner_of = shared_prefixes(ids_B_T, mask_B_T, active_B_T)
    assert lengths == [cont - 1] * 4 and prefix_of == [0] * 4 and owner_of == [0]

    # without branching the first turn is trained in every rollout: 4 x its tokens more
    plain = [Rollout(turns=r.turns, reward=r.reward) for r in group]
    trained = sum(int((d.loss_fn_inputs["advantages"].to_torch() != 0).sum()) for d in rollout_datums(plain, advantages_G))
    branched = sum(int((d.loss_fn_inputs["advantages"].to_torch() != 0).sum()) for d in datums)
    assert trained - branched == 4 * len(first.tokens)


def test_an_episode_that_ends_before_the_branch_turn_branches_at_its_last_turn(renderer):
    # the scout answers at turn 1 (sample 0 submits): the group is an ordinary one, sampled from the start
    envs = [ToyEnv(max_turns=3) for _ in range(3)]
    sampler = Scripted(renderer, lambda turn, j: call("submit_answer", answer="2" if j % 2 == 0 else "3"))
    [group] = play_branched(sampler, renderer, episodes_of(envs, envs[0].tasks("train", 1)), group_size=3,
                            branch_at=3, max_tokens=64, seed=0)
    assert [(turn, n) for turn, n, _ in sampler.requests] == [(0, 1), (0, 3)]
    assert [r.shared_turns for r in group] == [0, 0, 0] and [r.reward for r in group] == [1.0, 0.1, 1.0]

    # the environment's turn limit (2) is below the branch turn (5): the scout is cut at turn 2, so the group
    # branches there, sharing turn 1
    envs = [ToyEnv(max_turns=2) for _ in range(2)]
    sampler = Scripted(renderer, lambda turn, j: call("add", a=turn, b=j))
    [group] = play_branched(sampler, renderer, episodes_of(envs, envs[0].tasks("train", 1)), group_size=2,
                            branch_at=5, max_tokens=64, seed=0)
    assert [(turn, n) for turn, n, _ in sampler.requests] == [(0, 1), (1, 1), (1, 2)]
    assert [r.shared_turns for r in group] == [1, 1] and [len(r.turns) for r in group] == [2, 2]
    assert [r.turns[1].text for r in group] == [call("add", a=1, b=0), call("add", a=1, b=1)]


class Drifting(ToyEnv):
    """An environment whose replies carry a counter: the same call is answered differently each time."""

    counter = itertools.count()

    def step(self, call):
        result = super().step(call)
        return type(result)(type(result.observation)(f"{result.observation.content} #{next(self.counter)}"),
                            result.reward, result.done, result.info)


class Greeting(ToyEnv):
    """An environment whose first observation carries a counter: no two resets alike."""

    counter = itertools.count()

    def reset(self, task):
        return type(super().reset(task))(f"{task.prompt} (episode {next(self.counter)})")


def test_an_environment_that_answers_a_replay_differently_stops_the_step(renderer):
    envs = [Drifting(max_turns=3) for _ in range(2)]
    with pytest.raises(StropError, match=r"replaying task 0 of the step, turn 1 gave '2.0 #1' where the episode "
                                         r"that was branched got '2.0 #0'.*same observations"):
        play_branched(Scripted(renderer, add_then_answer), renderer, episodes_of(envs, envs[0].tasks("train", 1)),
                      group_size=2, branch_at=2, max_tokens=64, seed=0)
    envs = [Greeting(max_turns=3) for _ in range(2)]
    with pytest.raises(StropError, match=r"replaying task 0 of the step, its reset gave '.*\(episode 1\)' where "
                                         r"the episode that was branched got '.*\(episode 0\)'"):
        play_branched(Scripted(renderer, add_then_answer), renderer, episodes_of(envs, envs[0].tasks("train", 1)),
                      group_size=2, branch_at=2, max_tokens=64, seed=0)


def turn(prompt, tokens):
    return Turn(prompt=types.ModelInput.from_ints(prompt), tokens=tuple(tokens), logprobs=(-1.0,) * len(tokens))


def test_turns_the_whole_group_wrote_alike_get_no_advantage_and_no_datum_positions():
    # turn 1: [5, 6] after prompt [1, 2, 3] in all three; turn 2 differs. Rewards 1, 0, 0.5: advantages .5 -.5 0
    alike = [Rollout(turns=(turn([1, 2, 3], [5, 6]), turn([1, 2, 3, 5, 6, 9], [20 + g])), reward=r)
             for g, r in enumerate([1.0, 0.0, 0.5])]
    assert identical_turns(alike) == 1 and untrained_turns(alike, True) == [1, 1, 1]
    assert untrained_turns(alike, False) == [0, 0, 0]
    datums = rollout_datums(alike, torch.tensor([0.5, -0.5, 0.0]), untrained_G=[1, 1, 1])
    assert [d.model_input.to_ints() for d in datums] == [[1, 2, 3, 5, 6, 9, 20 + g][:-1] for g in range(3)]
    assert datums[0].loss_fn_inputs["target_tokens"].to_torch().tolist() == [0, 0, 0, 0, 0, 20]
    assert datums[0].loss_fn_inputs["advantages"].to_torch().tolist() == [0.0] * 5 + [0.5]
    # the same tokens after another prompt, or other tokens in one member, are not alike; nor is a group of one
    other_prompt = alike[:2] + [Rollout(turns=(turn([1, 2, 4], [5, 6]),))]
    other_tokens = alike[:2] + [Rollout(turns=(turn([1, 2, 3], [5, 7]),))]
    assert identical_turns(other_prompt) == identical_turns(other_tokens) == identical_turns(alike[:1]) == 0
    # a rollout whose every turn is alike sends nothing to the trainer
    assert rollout_datums(alike[:1], torch.tensor([0.0]), untrained_G=[2]) == []
    # a branched group's shared prefix stays untrained whether or not identical turns are skipped
    shared = [Rollout(turns=r.turns, shared_turns=1) for r in other_tokens[:2]]
    assert untrained_turns(shared, False) == [1, 1]


def test_identical_turns_are_skipped_by_default_only_where_the_gradient_is_the_same():
    env = {"name": "toy_env:ToyEnv"}
    assert skips_identical(GRPOConfig()) and skips_identical(GRPOConfig(loss_fn="cispo"))
    assert skips_identical(GRPOConfig(rollout_correction="tis"))
    assert not skips_identical(GRPOConfig(loss_fn="ppo")) and not skips_identical(GRPOConfig(loss_fn="dro"))
    assert not skips_identical(GRPOConfig(kl_beta=0.1)) and not skips_identical(GRPOConfig(identical_turns="train"))
    assert skips_identical(GRPOConfig(loss_fn="ppo", identical_turns="skip", environment=env))


def test_skipping_identical_turns_leaves_the_gradient_as_it_was(tiny_model_dir):
    """Advantages within a group sum to 0, and an importance-sampling token's gradient is its advantage times a
    factor its context and token decide: the alike turn's gradients cancel, so leaving it out changes nothing."""
    from strop.engine.trainer import LoraTrainer
    prompt = list(range(10, 22))
    group = [Rollout(turns=(turn(prompt, [40, 41, 42]), turn(prompt + [40, 41, 42, 30, 31], [50 + g, 60 - g])))
             for g in range(3)]
    advantages_G = torch.tensor([0.7, -0.2, -0.5])
    results = []
    for untrained in ([0, 0, 0], untrained_turns(group, True)):
        trainer = LoraTrainer(tiny_model_dir, rank=4, seed=0)
        with torch.no_grad():  # lora_B starts at zero; make it not, so lora_A gets gradients too
            gen = torch.Generator().manual_seed(1)
            for name, p in trainer.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
        out = trainer.forward_backward(rollout_datums(group, advantages_G, untrained_G=untrained), "importance_sampling")
        results.append((out.metrics, {n: p.grad.clone() for n, p in trainer.model.named_parameters()
                                      if p.grad is not None}))
    (full, g_full), (skipped, g_skipped) = results
    assert full["tokens:sum"] == 3 * 5 and skipped["tokens:sum"] == 3 * 2     # 9 tokens fewer trained
    assert skipped["loss:sum"] == pytest.approx(full["loss:sum"], abs=1e-5)
    assert g_full.keys() == g_skipped.keys() and len(g_full) > 0
    for name in g_full:
        assert torch.allclose(g_full[name], g_skipped[name], rtol=1e-4, atol=1e-6), name


class Tempered(Scripted):
    """The scripted sampler, keeping each request's temperature and top_p too."""

    def sample(self, prompt, num_samples, sampling_params):
        self.params = getattr(self, "params", []) + [(sampling_params.temperature, sampling_params.top_p)]
        return super().sample(prompt, num_samples, sampling_params)


@pytest.mark.parametrize("scout, expected", [(None, (0.7, 0.9)), (0.0, (0.0, 1.0)), (1.3, (1.3, 0.9))])
def test_the_scout_samples_at_scout_temperature_and_the_members_at_the_runs(renderer, scout, expected):
    envs = [ToyEnv(max_turns=3) for _ in range(4)]
    sampler = Tempered(renderer, add_then_answer)
    [group] = play_branched(sampler, renderer, episodes_of(envs, envs[0].tasks("train", 1)), group_size=4,
                            branch_at=2, max_tokens=64, temperature=0.7, top_p=0.9, seed=0,
                            scout_temperature=scout)
    # one request for the scout's turn, one of four samples for the members' continuations
    assert [(turn, n) for turn, n, _ in sampler.requests] == [(0, 1), (1, 4)]
    assert sampler.params == [expected, (0.7, 0.9)]   # greedy ignores top_p, so the scout asks for none
    assert [r.shared_turns for r in group] == [1] * 4


def test_scout_temperature_is_checked_with_branch_at_turn():
    env = {"name": "toy_env:ToyEnv"}
    assert GRPOConfig(environment=env, branch_at_turn=3, scout_temperature=0.0).scout_temperature == 0.0
    assert GRPOConfig().scout_temperature is None
    with pytest.raises(StropError, match=r"scout_temperature: must be a number from 0 to 10, or null \(got -1"):
        GRPOConfig(environment=env, branch_at_turn=3, scout_temperature=-1)
    with pytest.raises(StropError, match="scout_temperature: is the temperature of the episode a branched group is "
                                         "played from; set branch_at_turn too"):
        GRPOConfig(environment=env, scout_temperature=0.0)


def finance_tasks(split="train", kinds=("ratio", "average")):
    """One finance-sql task of each kind, and the environments a group of 4 and its scout play in."""
    from strop.envs.finance_sql import FinanceSQLEnv
    probe = FinanceSQLEnv(seed=0, companies=1)
    tasks = probe.tasks(split)
    probe.close()
    return [next(t for t in tasks if t.meta["kind"] == k) for k in kinds]


def test_a_reference_scout_plays_the_environments_calls_and_the_sampler_only_the_continuations(renderer):
    from strop.envs.finance_sql import FinanceSQLEnv
    tasks = finance_tasks()
    envs = [FinanceSQLEnv(seed=0, companies=1) for _ in range(2 * 4)]
    try:
        # the continuation, at turn 3: samples 0 and 1 submit the gold answer, 2 and 3 a wrong one
        answers = {task.prompt: task.answer for task in tasks}

        def submit(turn, j):
            question = next(q for q in answers if q in sampler.renderer.tokenizer.decode(sampler.requests[-1][2]))
            return call("submit_answer", answer=answers[question] if j < 2 else "-1")
        sampler = Scripted(renderer, submit)
        groups = play_branched(sampler, renderer, episodes_of(envs, tasks), group_size=4, branch_at=3,
                               max_tokens=64, temperature=0.7, seed=0, scout="reference")
    finally:
        for env in envs:
            env.close()
    # nothing sampled before the branch: one request a task, of 4 samples, at turn 3 (two replies in its prompt)
    assert [(turn, n) for turn, n, _ in sampler.requests] == [(2, 4), (2, 4)]
    for task, group in zip(tasks, groups):
        table = task.meta["terms"][0]["table"]
        assert [r.shared_turns for r in group] == [2] * 4
        assert [t.text for t in group[0].turns[:2]] == [call("list_tables"), call("describe_table", table=table)]
        assert all(r.turns[:2] == group[0].turns[:2] for r in group)      # the same Turns, token for token
        assert all(r.messages[:5] == group[0].messages[:5] for r in group)
        assert group[0].messages[4]["content"].startswith(f"Table {table}:")   # the environment's own answer
        assert [r.reward for r in group] == [1.1, 1.1, 0.1, 0.1]            # correct + format, a wrong number
    # the scout's turns are masked as the prompt is: only the submit carries the advantage
    advantages_G = torch.tensor([0.5, 0.5, -0.5, -0.5])
    datums = rollout_datums(groups[0], advantages_G)
    cont = groups[0][0].turns[2].prompt.length
    for d in datums:
        adv = d.loss_fn_inputs["advantages"].to_torch().tolist()
        assert adv[:cont - 1] == [0.0] * (cont - 1) and all(a != 0 for a in adv[cont - 1:])


def test_the_reference_calls_of_finance_sql_answer_every_task_correctly():
    from strop.envs.finance_sql import FinanceSQLEnv
    env = FinanceSQLEnv(seed=3, companies=1)
    try:
        for split in ("train", "eval-single", "eval-multi"):
            for task in env.tasks(split):
                env.reset(task)
                calls = env.reference_calls(task)
                assert len(calls) <= env.max_turns, task.id
                for c in calls:
                    result = env.step(c)
                assert result.done and env.state()["correct"], (task.id, [c.to_dict() for c in calls])
    finally:
        env.close()


def test_a_reference_scout_needs_an_environment_with_reference_calls(renderer):
    envs = [ToyEnv(max_turns=3) for _ in range(3)]
    with pytest.raises(StropError, match=r'scout \(rlHyperparams.scout\) "reference" plays the environment\'s '
                                         r"reference calls, and ToyEnv has no reference_calls\(task\)"):
        play_branched(Scripted(renderer, add_then_answer), renderer, episodes_of(envs, envs[0].tasks("train", 1)),
                      group_size=2, branch_at=2, max_tokens=64, seed=0, scout="reference")


class Pricing(Scripted):
    """A Scripted sampler that also prices given tokens: each token's logprob is -0.5 (the first, None)."""

    def compute_logprobs_many(self, prompts):
        self.priced = [p.to_ints() for p in prompts]
        done = Future()
        done.set_result([[None] + [-0.5] * (p.length - 1) for p in prompts])
        return done


def test_reference_members_play_the_reference_to_the_end_from_the_branch_and_are_priced_by_the_sampler(renderer):
    from strop.envs.finance_sql import FinanceSQLEnv
    tasks = finance_tasks()
    envs = [FinanceSQLEnv(seed=0, companies=1) for _ in range(2 * 4)]
    try:
        sampler = Pricing(renderer, lambda turn, j: call("submit_answer", answer="-1"))   # every sample is wrong
        groups = play_branched(sampler, renderer, episodes_of(envs, tasks), group_size=4, branch_at=3,
                               max_tokens=64, temperature=0.7, seed=0, scout="reference", reference_members=1)
        gold = [[c.to_dict() for c in envs[0].reference_calls(task)] for task in tasks]
    finally:
        for env in envs:
            env.close()
    # the sampler is asked for 3 continuations a task (the 4th member is the reference), and prices 2 turns a task
    assert [(turn, n) for turn, n, _ in sampler.requests] == [(2, 3), (2, 3)]
    assert len(sampler.priced) == 4
    for task, group, calls in zip(tasks, groups, gold):
        assert [r.reference for r in group] == [False, False, False, True]
        assert [r.reward for r in group] == [0.1, 0.1, 0.1, 1.1]      # the reference answers; the samples do not
        guide = group[3]
        assert guide.turns[:2] == group[0].turns[:2] and guide.shared_turns == 2   # from the scout's state
        assert len(guide.turns) == len(calls) == 4
        import json
        assert [json.loads(t.text.removeprefix("<tool_call>").removesuffix("</tool_call>"))["name"]
                for t in guide.turns[2:]] == ["run_sql", "submit_answer"]
        for t in guide.turns[2:]:   # priced: the logprobs of the reply's own tokens, given the prompt and each other
            assert t.logprobs == (-0.5,) * len(t.tokens)
            assert list(t.prompt.to_ints()) + list(t.tokens) in sampler.priced
        assert guide.turns[0].logprobs == (0.0,) * len(guide.turns[0].tokens)   # the scout's: never trained
    # the reference's answer query carries the group's advantage, the shared turns none
    datums = rollout_datums(groups[0], torch.tensor([-0.25, -0.25, -0.25, 0.75]))
    cont = groups[0][3].turns[2].prompt.length
    adv = datums[3].loss_fn_inputs["advantages"].to_torch().tolist()
    assert adv[:cont - 1] == [0.0] * (cont - 1) and all(a == 0.75 for a in adv[cont - 1:cont - 1 + 5])


def test_reference_members_of_an_unbranched_group_play_whole_reference_episodes(renderer):
    from strop.envs.finance_sql import FinanceSQLEnv
    [task] = finance_tasks(kinds=("value",))
    envs = [FinanceSQLEnv(seed=0, companies=1) for _ in range(3)]
    try:
        sampler = Pricing(renderer, lambda turn, j: call("submit_answer", answer="-1"))
        [group] = play_branched(sampler, renderer, episodes_of(envs, [task]), group_size=3, branch_at=1,
                                max_tokens=64, seed=0, reference_members=2)
        n_calls = len(envs[0].reference_calls(task))
    finally:
        for env in envs:
            env.close()
    assert [(turn, n) for turn, n, _ in sampler.requests] == [(0, 1)]
    assert [r.reference for r in group] == [False, True, True] and [r.reward for r in group] == [0.1, 1.1, 1.1]
    assert all(len(r.turns) == n_calls and r.shared_turns == 0 for r in group[1:])
    assert all(t.logprobs == (-0.5,) * len(t.tokens) for r in group[1:] for t in r.turns)


class ByTask(Pricing):
    """A Pricing sampler whose replies depend on the task: script(question, turn, j), the question being the
    first of `questions` the prompt holds. It keeps each request's seed."""

    def __init__(self, renderer, questions, script):
        super().__init__(renderer, lambda turn, j: script(self.question, turn, j))
        self.questions, self.seeds = questions, []

    def sample(self, prompt, num_samples, sampling_params):
        text = self.renderer.tokenizer.decode(prompt.to_ints())
        self.question = next(q for q in self.questions if q in text)
        self.seeds.append(sampling_params.seed)
        return super().sample(prompt, num_samples, sampling_params)


def test_uninformative_reference_members_guide_only_the_groups_the_model_fails_whole(renderer):
    """referenceWhen "uninformative": the ratio task's 3 samples are all wrong, so its 4th member plays the
    reference; the average task's first sample is right, so its 4th member is sampled as well, from the same
    state, under a seed of its own, and nothing of that group is priced."""
    from strop.envs.finance_sql import FinanceSQLEnv
    from strop.rl.dynamic_sampling import informative
    tasks = finance_tasks()
    ratio, average = (t.prompt for t in tasks)
    right = {t.prompt: t.answer + ("%" if t.meta["unit"] == "percent" else "") for t in tasks}
    envs = [FinanceSQLEnv(seed=0, companies=1) for _ in range(2 * 4)]
    seen = []

    def guide_where(groups):
        seen.append([len(g) for g in groups])
        return [not ok for ok in informative(groups, "correctness")]
    try:
        sampler = ByTask(renderer, [ratio, average], lambda question, turn, j: call(
            "submit_answer", answer=right[question] if question == average and j == 0 else "-1"))
        groups = play_branched(sampler, renderer, episodes_of(envs, tasks), group_size=4, branch_at=3,
                               max_tokens=64, temperature=0.7, seed=0, scout="reference", reference_members=1,
                               guide_where=guide_where)
    finally:
        for env in envs:
            env.close()
    assert seen == [[3, 3]]          # judged on the sampled members alone
    # 3 samples a task, then one more for the average task's reserved member; the ratio task's is priced instead
    assert [(turn, n) for turn, n, _ in sampler.requests] == [(2, 3), (2, 3), (2, 1)]
    assert len(set(sampler.seeds)) == 3
    assert len(sampler.priced) == 2   # the ratio guide's run_sql and submit_answer
    ratio_group, average_group = groups
    assert [r.reference for r in ratio_group] == [False, False, False, True]
    assert [r.reward for r in ratio_group] == [0.1, 0.1, 0.1, 1.1]
    assert [r.reference for r in average_group] == [False] * 4
    assert [r.reward for r in average_group] == [1.1, 0.1, 0.1, 1.1]   # the 4th sampled: its j = 0 is right
    assert average_group[3].turns[:2] == average_group[0].turns[:2] and average_group[3].shared_turns == 2
    assert all(len(group) == 4 for group in groups)


class Referenced(ToyEnv):
    def reference_calls(self, task):
        a = int(task.prompt.split()[2])
        return [ToolCall("add", {"a": a, "b": 2}), ToolCall("submit_answer", {"answer": task.answer})]


def test_uninformative_reference_members_of_unbranched_groups_sample_where_the_group_has_signal(renderer):
    """Unbranched: the guided group's reserved member plays the whole reference episode; the other's is sampled
    from the task's start, its two turns a request of one sample each, seeded apart from its group's first."""
    envs = [Referenced(max_turns=3) for _ in range(2 * 3)]
    sampler = ByTask(renderer, ["0 + 2", "1 + 2"], lambda question, turn, j: add_then_answer(turn, j))
    groups = play_branched(sampler, renderer, episodes_of(envs, envs[0].tasks("train", 2)), group_size=3,
                           branch_at=1, max_tokens=64, seed=0, reference_members=1,
                           guide_where=lambda groups: [True, False])       # guide the first group only
    assert [[r.reference for r in g] for g in groups] == [[False, False, True], [False, False, False]]
    assert groups[0][2].reward == 1.0 and len(groups[0][2].turns) == 2
    assert [(turn, n) for turn, n, _ in sampler.requests][-2:] == [(0, 1), (1, 1)]   # the 2nd group's 3rd member
    assert len(set(sampler.seeds)) == len(sampler.seeds)


def test_reference_members_need_an_environment_with_reference_calls(renderer):
    envs = [ToyEnv(max_turns=3) for _ in range(2)]
    with pytest.raises(StropError, match=r"referenceMembers \(rlHyperparams.referenceMembers\) plays the "
                                         r"environment's reference calls, and ToyEnv has no reference_calls\(task\).* "
                                         r"or leave referenceMembers at 0"):
        play_branched(Pricing(renderer, add_then_answer), renderer, episodes_of(envs, envs[0].tasks("train", 1)),
                      group_size=2, branch_at=1, max_tokens=64, seed=0, reference_members=1)


class Misreferenced(ToyEnv):
    def reference_calls(self, task):
        return [{"name": "add", "arguments": {"a": 1, "b": 2}}]   # a dict, not a ToolCall


def test_reference_calls_that_are_not_tool_calls_are_refused_by_name(renderer):
    envs = [Misreferenced(max_turns=3) for _ in range(2)]
    with pytest.raises(StropError, match=r"Misreferenced.reference_calls\('.*'\) must return ToolCalls .* one was "
                                         r"\{'name': 'add'"):
        play_branched(Pricing(renderer, add_then_answer), renderer, episodes_of(envs, envs[0].tasks("train", 1)),
                      group_size=2, branch_at=1, max_tokens=64, seed=0, reference_members=1)


def test_reference_members_are_checked_against_the_group_the_scout_and_the_source():
    env = {"name": "toy_env:ToyEnv"}
    assert GRPOConfig(environment=env, group_size=4, reference_members=3).reference_members == 3
    assert GRPOConfig(environment=env, branch_at_turn=3, scout="reference", reference_members=1).reference_members == 1
    assert GRPOConfig().reference_members == 0
    with pytest.raises(StropError, match=r"reference_members: must be fewer than group_size \(4\): at least one "):
        GRPOConfig(environment=env, group_size=4, reference_members=4)
    with pytest.raises(StropError, match='reference_members: go on from the scout\'s state .* set scout "reference"'):
        GRPOConfig(environment=env, branch_at_turn=3, reference_members=1)
    with pytest.raises(StropError, match="reference_members: play an environment's reference calls; a dataset has"):
        GRPOConfig(reference_members=1)
    with pytest.raises(StropError, match="reference_members: must be an integer from 0 to 1,023"):
        GRPOConfig(environment=env, reference_members=-1)
    assert GRPOConfig().reference_when == "always"
    assert GRPOConfig(environment=env, reference_members=1, reference_when="uninformative").reference_when == \
        "uninformative"
    with pytest.raises(StropError, match="reference_when: 'uninformative' chooses the groups the reference members "
                                         "play in; set reference_members too"):
        GRPOConfig(environment=env, reference_when="uninformative")
    with pytest.raises(StropError, match="reference_when: must be one of always, uninformative, got 'never'"):
        GRPOConfig(environment=env, reference_members=1, reference_when="never")


@pytest.mark.parametrize("when", ["always", "uninformative"])
def test_a_run_with_a_reference_member_learns_where_the_model_fails_and_reports_only_its_samples(
        tiny_model_dir, tmp_path, capsys, when):
    """`strop train` in finance-sql with the tiny random model, which never answers: the reference member makes
    every group informative, so the step trains, while the reward it reports is the model's own. Every group is
    one the model fails whole, so "uninformative" guides them all too."""
    import json
    from strop.cli.main import main
    run_dir = tmp_path / "run"
    code = main(["train", "--base-model", str(tiny_model_dir), "--environment", "finance-sql", "--env-option",
                 "companies=1", "--branch-at-turn", "3", "--scout", "reference", "--reference-members", "1",
                 "--reference-when", when, "--group-size", "3", "--batch-size", "2", "--steps", "1", "--max-tokens", "8", "--rank", "4",
                 "--run-dir", str(run_dir), "--quiet", "-o", "json"])
    assert code == 0, capsys.readouterr().err
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["reference_members"], config["reference_when"]) == (1, when)
    records = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    guides = [r for r in records if r.get("reference")]
    assert len(records) == 6 and len(guides) == 2
    assert all(r["reward"] == 1.1 and r["advantage"] > 0 for r in guides)
    [row] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    sampled = [r["reward"] for r in records if not r.get("reference")]
    assert row["reward"] == pytest.approx(sum(sampled) / len(sampled)) and row["reward"] < 1.1
    assert row["zeroVarianceGroups"] == 0 and row["trainedTokens"] > 0 and row["guidedGroups"] == 2
    assert row["residentMiB"] > 100 and row["heapFreeMiB"] >= 0      # a model and its trainer are resident


def test_scout_is_checked_with_branch_at_turn_and_scout_temperature():
    env = {"name": "toy_env:ToyEnv"}
    assert GRPOConfig(environment=env, branch_at_turn=3, scout="reference").scout == "reference"
    assert GRPOConfig().scout == "policy"
    with pytest.raises(StropError, match="scout: must be one of policy, reference, got 'oracle'"):
        GRPOConfig(environment=env, branch_at_turn=3, scout="oracle")
    with pytest.raises(StropError, match="scout: 'reference' plays the turns before a branch; set branch_at_turn"):
        GRPOConfig(environment=env, scout="reference")
    with pytest.raises(StropError, match='scout_temperature: is the temperature the model plays the turns before '
                                         'a branch at, and scout "reference" plays the environment\'s calls'):
        GRPOConfig(environment=env, branch_at_turn=3, scout="reference", scout_temperature=0)


def test_the_settings_are_checked_and_named_in_each_front_end():
    env = {"name": "toy_env:ToyEnv"}
    config = GRPOConfig(environment=env, branch_at_turn=3, identical_turns="train")
    assert (config.branch_at_turn, config.identical_turns) == (3, "train")
    assert (GRPOConfig().branch_at_turn, GRPOConfig().identical_turns) == (None, "auto")
    with pytest.raises(StropError) as err:
        GRPOConfig(environment=env, branch_at_turn=0, identical_turns="never")
    assert "branch_at_turn: must be an integer from 1 to 1,000, or null (got 0)" in str(err.value)
    assert "identical_turns: must be one of auto, skip, train, got 'never'" in str(err.value)
    with pytest.raises(StropError, match="branch_at_turn: branches the episodes of a tool-use environment"):
        GRPOConfig(branch_at_turn=2)   # a dataset


def test_the_descriptor_maps_branch_at_turn_and_identical_turns_with_their_paths():
    from strop.control import validate_descriptor
    from test_descriptor import problems, seed
    data = seed()
    data["config"]["rlHyperparams"].update(branchAtTurn=2, identicalTurns="skip", scoutTemperature=0)
    data["config"].pop("dataset"), data["config"].pop("reward")
    data["config"]["environment"] = {"name": "toy_env:ToyEnv", "options": {"max_turns": 3}}
    run = validate_descriptor(data)
    config = run.to_grpo_config(None, [])
    assert (config.branch_at_turn, config.identical_turns, config.environment["name"]) == (2, "skip", "toy_env:ToyEnv")
    assert config.scout_temperature == 0
    default = validate_descriptor(seed()).to_dict()["config"]["rlHyperparams"]
    assert default["branchAtTurn"] is None and default["identicalTurns"] == "auto"
    assert default["scoutTemperature"] is None and default["scout"] == "policy"
    data["config"]["rlHyperparams"].update(scoutTemperature=None, scout="reference", referenceMembers=1)
    assert validate_descriptor(data).to_grpo_config(None, []).scout == "reference"
    assert validate_descriptor(data).to_grpo_config(None, []).reference_members == 1
    assert default["referenceMembers"] == 0 and default["referenceWhen"] == "always"
    data["config"]["rlHyperparams"]["referenceWhen"] = "uninformative"
    assert validate_descriptor(data).to_grpo_config(None, []).reference_when == "uninformative"

    data["config"]["rlHyperparams"].update(branchAtTurn=0, identicalTurns="sometimes", scoutTemperature=11,
                                           scout="oracle", referenceMembers=-1, referenceWhen=True)
    found = problems(data)
    assert any(p.startswith('$.config.rlHyperparams.referenceWhen: must be "always" (every group) or "uninformative"')
               for p in found), found
    assert any(p.startswith("$.config.rlHyperparams.referenceMembers: must be an integer from 0 to 1,023")
               for p in found), found
    assert any(p.startswith('$.config.rlHyperparams.scout: must be "policy"') for p in found), found
    assert any(p.startswith("$.config.rlHyperparams.scoutTemperature: must be a number from 0 to 10") for p in found)
    assert any(p.startswith("$.config.rlHyperparams.branchAtTurn: must be an integer from 1 to 1,000") for p in found)
    assert any(p.startswith('$.config.rlHyperparams.identicalTurns: must be "auto"') for p in found), found
    dataset = seed()
    dataset["config"]["rlHyperparams"]["branchAtTurn"] = 2
    assert problems(dataset) == ["$.config.rlHyperparams.branchAtTurn: branches the episodes of a tool-use "
                                 "environment ($.config.environment); a dataset's episodes have one turn: remove "
                                 "branchAtTurn, or train in an environment"]


def test_strop_train_takes_an_environment_and_branches_it(tiny_model_dir, tmp_path, capsys, monkeypatch):
    import json
    from pathlib import Path
    from strop.cli.main import main
    assert main(["train", "--branch-at-turn", "0", "--identical-turns", "train"]) == 1
    err = capsys.readouterr().err
    assert "--branch-at-turn (branch_at_turn): must be an integer from 1 to 1,000" in err
    assert main(["train", "--branch-at-turn", "2"]) == 1
    assert "--branch-at-turn (branch_at_turn): branches the episodes of a tool-use environment" in capsys.readouterr().err
    assert main(["train", "--method", "sft", "--dataset", "x.jsonl", "--branch-at-turn", "2"]) == 1
    assert "--branch-at-turn: a GRPO setting" in capsys.readouterr().err

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    run_dir = tmp_path / "run"
    code = main(["train", "--base-model", str(tiny_model_dir), "--environment", "toy_env:ToyEnv", "--env-option",
                 "max_turns=3", "--branch-at-turn", "2", "--scout-temperature", "0", "--identical-turns", "train",
                 "--group-size", "2",
                 "--batch-size", "2", "--steps", "1", "--max-tokens", "6", "--rank", "4", "--run-dir", str(run_dir),
                 "--quiet", "-o", "json"])
    assert code == 0, capsys.readouterr().err
    saved = json.loads((run_dir / "config.json").read_text())
    assert (saved["branch_at_turn"], saved["identical_turns"], saved["scout_temperature"]) == (2, "train", 0.0)
    assert saved["environment"] == {"name": "toy_env:ToyEnv", "options": {"max_turns": 3}, "split": "train"}
    [row] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert row["untrainedTurns"] == 0 and row["trainedTokens"] == 0.0   # a random model: no reward, no signal
    records = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert len(records) == 4 and all(r["untrainedTurns"] == 1 and r["turns"] == 3 for r in records)
    # each group's two episodes read the same first reply and observation
    for a, b in (records[0:2], records[2:4]):
        assert a["transcript"][:3] == b["transcript"][:3]


def test_a_branched_step_trains_only_the_continuations(tiny_model_dir, renderer):
    """learn_step on a branched group with the real trainer: 4 continuations of one submit each are trained,
    the shared add is not, and the metrics say so."""
    import strop
    from strop.rl.episodes import EnvironmentSource, EnvPool
    from strop.rl.step import Sampled, StepContext, adam_params, learn_step
    config = GRPOConfig(base_model=str(tiny_model_dir), environment={"name": "toy_env:ToyEnv"}, group_size=4,
                        batch_size=1, branch_at_turn=2, lora_rank=4)
    envs = [ToyEnv(max_turns=3) for _ in range(4)]
    [group] = play_branched(Scripted(renderer, add_then_answer), renderer, episodes_of(envs, envs[0].tasks("train", 1)),
                            group_size=4, branch_at=2, max_tokens=64, seed=0)
    training = strop.ServiceClient().create_lora_training_client(base_model=str(tiny_model_dir), rank=4, seed=0)
    pool = EnvPool({"name": "toy_env:ToyEnv"}, 4)
    ctx = StepContext(config=config, training=training, renderer=renderer, source=EnvironmentSource(pool),
                      adam=adam_params(config))
    row = learn_step(ctx, Sampled(step=0, groups=[group], seconds=1.0, policy_step=0)).as_row()
    submit = [len(r.turns[1].tokens) for r in group]
    assert row["untrainedTurns"] == 4 and row["datums"] == 4 and row["trainedTokens"] == sum(submit)


def test_a_run_in_an_environment_pins_its_branch_turn(workspace, capsys, monkeypatch):  # noqa: F811
    import json
    from pathlib import Path
    from test_control import descriptor, run
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    path = descriptor(workspace, **{"config.dataset": None, "config.reward": None,
                                    "config.environment": {"name": "toy_env:ToyEnv", "options": {"max_turns": 3}},
                                    "config.rlHyperparams.branchAtTurn": 2, "config.rlHyperparams.klBeta": 0.1,
                                    "config.rlHyperparams.scoutTemperature": 0})
    code, out, err = run(capsys, "runs", "start", "-f", path, "--dry-run", "-o", "json")
    assert code == 0, err
    pinned = json.loads(out)["pinned"]["rl"]
    # a KL penalty: identical turns are trained under auto (their KL terms do not cancel)
    assert (pinned["branchAtTurn"], pinned["identicalTurns"], pinned["scoutTemperature"]) == (2, "train", 0)
