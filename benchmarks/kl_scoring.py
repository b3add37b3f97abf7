"""Time of a GRPO step's KL to its start model over multi-turn rollouts: each rollout's chained turns scored as one
sequence (strop's way since fd5c008) against every trained turn scored over its own whole prompt (the way
before), on the same model and the same rollouts, alternating, best of --repeats.

    python benchmarks/kl_scoring.py                     # SmolLM2-135M-Instruct, finance-sql-shaped rollouts
    python benchmarks/kl_scoring.py --model /tmp/tiny-random --prompt 64 --rollouts 2   # a quick check

The rollouts are shaped like finance-sql's after its branch at turn 3: a --prompt-token conversation (the system
prompt, tool schemas, the question and the discovery turns), then --turns trained turns of --reply tokens, each
followed by an --observation-token tool result that the next turn's prompt holds. Token ids are random, so only
the time means anything; both sides score the same tokens and their KL values agree (printed). The last line:
`kl scoring chained X.X s per-turn Y.Y s ratio Z.ZZ (tokens scored A vs B)`.
"""

from __future__ import annotations

import argparse
import random
import time

import torch

import strop
from strop.engine.precision import kernels
from strop.rl.rollouts import turn_kl
from strop.rl.types import Rollout, Turn


def _rollouts(args, vocab: int) -> list[Rollout]:
    rng = random.Random(0)
    out = []
    for _ in range(args.rollouts):
        prompt = [rng.randrange(3, vocab) for _ in range(args.prompt)]
        turns = []
        for _ in range(args.turns):
            tokens = tuple(rng.randrange(3, vocab) for _ in range(args.reply))
            turns.append(Turn(prompt=strop.types.ModelInput.from_ints(prompt), tokens=tokens,
                              logprobs=tuple(-1.0 for _ in tokens), text="", stop_reason="stop"))
            prompt = prompt + list(tokens) + [rng.randrange(3, vocab) for _ in range(args.observation)]
        out.append(Rollout(turns=tuple(turns)))
    return out


def _per_turn(base, rollouts: list[Rollout]) -> list[float]:
    """The way before: one sequence per trained turn, its whole prompt and its tokens."""
    turns = [t for r in rollouts for t in r.turns]
    lps = base.compute_logprobs_many([t.prompt.append(strop.types.EncodedTextChunk(tokens=list(t.tokens)))
                                      for t in turns]).result()
    return [lp - b for t, base_lp in zip(turns, lps) for lp, b in zip(t.logprobs, base_lp[t.prompt.length:])]


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be 1 or more")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    parser.add_argument("--rollouts", type=_positive, default=16)
    parser.add_argument("--prompt", type=_positive, default=1300)
    parser.add_argument("--turns", type=_positive, default=3)
    parser.add_argument("--reply", type=_positive, default=50)
    parser.add_argument("--observation", type=_positive, default=80)
    parser.add_argument("--repeats", type=_positive, default=2)
    parser.add_argument("--threads", type=_positive, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"CPU kernels: {kernels()}", flush=True)
    base = strop.ServiceClient().create_sampling_client(base_model=args.model)
    vocab = base.get_tokenizer().vocab_size
    rollouts = _rollouts(args, vocab)
    base.compute_logprobs_many([strop.types.ModelInput.from_ints([5, 6, 7])]).result()  # the model loaded first
    best = {"chained": float("inf"), "per-turn": float("inf")}
    values = {}
    for _ in range(args.repeats):
        for side in best:
            t0 = time.perf_counter()
            if side == "chained":
                values[side] = [v for kl in turn_kl(base, rollouts) for turn in kl for v in turn]
            else:
                values[side] = _per_turn(base, rollouts)
            best[side] = min(best[side], time.perf_counter() - t0)
            print(f"{side}: {time.perf_counter() - t0:.2f} s", flush=True)
    worst = max(abs(a - b) for a, b in zip(values["chained"], values["per-turn"]))
    print(f"the two sides' KL values differ by at most {worst:.2g} ({len(values['chained'])} tokens)")
    chained_tokens = args.rollouts * (args.prompt + args.turns * args.reply + (args.turns - 1) * args.observation)
    per_turn_tokens = args.rollouts * sum(args.prompt + i * (args.reply + args.observation) + args.reply
                                          for i in range(args.turns))
    print(f"kl scoring chained {best['chained']:.1f} s per-turn {best['per-turn']:.1f} s "
          f"ratio {best['chained'] / best['per-turn']:.2f} (tokens scored {chained_tokens} vs {per_turn_tokens})")


if __name__ == "__main__":
    main()
