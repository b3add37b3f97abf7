"""The types of strop's one rollout pipeline, frozen once made. A single-turn problem is a one-turn episode, so
GRPO on a dataset, GRPO in a tool-use environment and the evaluation of an environment share every one of them.

    Turn         one reply of the model: the prompt it read (everything before, observations included), the
                 tokens and logprobs it sampled, their text and why sampling stopped.
    Rollout      one episode of one prompt or task: its turns in order, the reward and the scores behind it,
                 the fallible calls it made (grader calls, or the environment) and what failed, the conversation
                 as the model saw it, and what the environment reported at the end (state, info); in a branched
                 group, how many leading turns it shares with the group (`strop.rl.branching`).
    RolloutGroup the `group_size` rollouts of one prompt, compared with each other for their advantages.
    types.Datum  what a rollout becomes for `forward_backward`: one per turn, prompt masked, sampled tokens
                 carrying the rollout's advantage (strop.types; made by `strop.rl.rollouts.rollout_datums`).
    StepMetrics  the row one training step writes to metrics.jsonl, TensorBoard and the store.

    rollout = Rollout(turns=(Turn(prompt, tokens=(8, 9), logprobs=(-0.5, -0.3), text="12", stop_reason="stop"),),
                      reward=1.0, scores={"correct": 1.0})
"""

from __future__ import annotations

from dataclasses import dataclass, field

from strop.types import ModelInput

RolloutGroup = tuple["Rollout", ...]


@dataclass(frozen=True)
class Turn:
    """One reply: `prompt` is exactly what the sampler was given, so `logprobs` are the behaviour policy's."""

    prompt: ModelInput
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str = ""
    stop_reason: str | None = None


@dataclass(frozen=True)
class Rollout:
    """One episode. `checks` counts the calls that could fail (one per reward term of a scored reply, one per
    environment episode) and `failed` those that did; `errors` says what went wrong, in order."""

    turns: tuple[Turn, ...] = ()
    reward: float = 0.0
    scores: dict = field(default_factory=dict, hash=False)   # reward term -> its unweighted score
    question: str = ""
    gold: str = ""
    task_id: str | None = None
    messages: tuple[dict, ...] = ()   # the conversation as the model read it (observations capped)
    checks: int = 0
    failed: int = 0
    errors: tuple[str, ...] = ()
    parse_errors: int = 0             # replies in which no tool call could be read
    state: dict = field(default_factory=dict, hash=False)
    info: dict = field(default_factory=dict, hash=False)
    shared_turns: int = 0             # leading turns played once for the whole group (branchAtTurn): not trained
    reference: bool = False           # played by the environment's reference calls, not sampled (referenceMembers)

    @property
    def model_tokens(self) -> int:
        return sum(len(t.tokens) for t in self.turns)

    @property
    def text(self) -> str:
        """The last reply's text (a single-turn rollout's completion)."""
        return self.turns[-1].text if self.turns else ""

    def transcript(self) -> list[dict]:
        return [dict(m) for m in self.messages]


@dataclass(frozen=True)
class StepMetrics:
    """One step's metrics. Rewards are the step's means over rollouts; `terms` holds each reward term's
    weighted mean (`reward/NAME`), `rubrics` the behaviour rubrics of environment episodes (`rubric/NAME`).
    Lengths are sampled tokens per rollout; `clippedFraction` is the share of turns cut at the token limit."""

    step: int
    epoch: int
    reward: float
    rewardStd: float
    zeroVarianceGroups: float
    rewardErrors: int
    completionLength: float
    clippedFraction: float
    tokensPerSecond: float
    stepSeconds: float
    sampleSeconds: float
    trainSeconds: float
    datums: int
    klSampleTrain: float
    entropy: float | None
    loss: float
    gradNorm: float | None   # None when the update was skipped
    learningRate: float
    terms: dict = field(default_factory=dict)
    ppoClippedFraction: float | None = None
    klBase: float | None = None
    sftMixLoss: float | None = None            # sft_mix: its transcripts' cross-entropy per trained token
    klSampleTrainMax: float | None = None      # the largest |log p_sampler - log p_train| of a trained token
    samplerRatioOutside: float | None = None   # share of trained tokens whose p_train / p_sampler is outside [0.5, 2]
    toolCallParseErrors: float | None = None   # environment episodes only
    modelTurns: float | None = None            # environment episodes only
    rubrics: dict = field(default_factory=dict)
    offPolicySteps: int | None = None          # off-policy runs: updates between the weights that sampled and trained
    overlapSeconds: float | None = None        # off-policy runs: sampling done while an earlier step trained (saved)
    updateSkipped: int = 0                     # 1 when the trainer skipped the update: its loss or gradient was NaN
    tasksDrawn: int | None = None              # dynamic sampling: tasks (groups) sampled this step, its batch included
    groupsKept: int | None = None              # dynamic sampling: informative groups trained on (at most batchSize)
    groupsDropped: int | None = None           # dynamic sampling: groups drawn but not trained (no variance, or surplus)
    guidedGroups: int | None = None            # referenceMembers: groups holding reference episodes (referenceWhen)
    trainedTokens: float = 0.0                 # tokens the update had a gradient for (advantage or KL not 0)
    untrainedTurns: int | None = None          # branchAtTurn / identicalTurns: turns of trained groups left untrained
    overlongMasked: int | None = None          # overlong mask: rollouts of trained groups cut at max tokens, not trained
    overlongPenalty: float | None = None       # overlong soft-penalty: the mean penalty added to the rollouts' rewards
    updateClippedFractions: list | None = None  # ppo, cispo: per optimizer step, the share of trained tokens clipped
    optimizerSteps: int | None = None          # updatesPerBatch x minibatches (when either is above 1)
    residentMiB: float | None = None           # the process's resident memory after the step (None: unknown)
    heapFreeMiB: float | None = None           # of it, memory freed but kept for reuse (strop.engine.malloc)
    judgeCalls: int | None = None              # judge reward terms: calls made since the last step (cache misses)
    judgeCacheHits: int | None = None          # judge reward terms: verdicts taken from the cache instead
    judgeFailures: int | None = None           # judge reward terms: calls that gave no verdict (scored 0.0)
    judgeSeconds: float | None = None          # judge reward terms: seconds spent waiting for verdicts

    def as_row(self) -> dict:
        """The JSON row: every field by its name, `reward/NAME` and `rubric/NAME` flattened, absent optionals
        left out."""
        row = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if name == "terms":
                row.update({f"reward/{k}": v for k, v in value.items()})
            elif name == "rubrics":
                row.update(value)
            elif value is not None or name == "entropy":
                row[name] = value
        return row
