"""What branching a group at a turn (`branchAtTurn`, strop.rl.branching) saves: tokens sampled, tokens trained and
positions the trainer runs, for one step of real episodes in an environment, plain groups against branched ones.

    python benchmarks/branching.py                                # tiny-random, finance-sql, 2 tasks x 8, turn 3
    python benchmarks/branching.py --model HuggingFaceTB/SmolLM2-135M-Instruct --tasks 1 --group 4

Both sides play the same tasks with the same model and seeds (the plain side as `strop train` would, the
branched side through `play_branched`). Every group is then given advantages +1, -1, +1, ... so that it counts
as informative (an untuned model's groups mostly have no reward variance and would train nothing at all): the
figures are what a step whose groups all carry a signal costs. "trained" is the number of tokens with a
non-zero advantage, "trainer positions" those the transformer runs once prefixes shared by a group's rows are
run once (`strop.engine.trainer.shared_prefixes`: the untrained prefix, prompt and shared turns, before each
row's first trained token). "train s" is one forward_backward of the step's datums on the real trainer.
"""

from __future__ import annotations

import argparse
import time

from _common import TINY_MODEL


def positions(datums) -> tuple[int, int]:
    """(positions of the step's datums, positions the trainer runs when each distinct untrained prefix runs once)."""
    import torch

    from strop.engine.trainer import shared_prefixes
    inputs = [d.model_input.to_ints() for d in datums]
    width = max(len(ids) for ids in inputs)
    ids = torch.tensor([row + [0] * (width - len(row)) for row in inputs])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in inputs]).bool()
    active = torch.zeros_like(mask)
    for b, d in enumerate(datums):
        adv = d.loss_fn_inputs["advantages"].to_torch()
        active[b, :len(adv)] = adv != 0
    total = int(mask.sum())
    plan = shared_prefixes(ids, mask, active)
    if plan is None:
        return total, total
    lengths, prefix_of, owner_of = plan
    return total, total - sum(lengths) + sum(lengths[b] for b in owner_of)


def measure(name, groups, training, loss="importance_sampling") -> dict:
    import torch

    from strop.rl.branching import untrained_turns
    from strop.rl.rollouts import rollout_datums
    datums, sampled = [], 0
    for group in groups:
        signs_G = torch.tensor([1.0 if k % 2 == 0 else -1.0 for k in range(len(group))])
        datums += rollout_datums(group, signs_G, untrained_G=untrained_turns(group, skip_identical=True))
        # a branched group's shared turns were sampled once (by its scout), not once per member
        sampled += sum(len(t.tokens) for r in group for t in r.turns[r.shared_turns:])
        sampled += sum(len(t.tokens) for t in group[0].turns[:group[0].shared_turns])
    trained = sum(int((d.loss_fn_inputs["advantages"].to_torch() != 0).sum()) for d in datums)
    total, run = positions(datums)
    t0 = time.perf_counter()
    training.forward_backward(datums, loss_fn=loss).result()
    seconds = time.perf_counter() - t0
    return {"side": name, "sampled": sampled, "trained": trained, "datum positions": total,
            "trainer positions": run, "train s": round(seconds, 2),
            "turns": sum(len(r.turns) for g in groups for r in g) / sum(len(g) for g in groups)}


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--model", default=TINY_MODEL)
    cli.add_argument("--env", default="finance-sql")
    cli.add_argument("--tasks", type=int, default=2)
    cli.add_argument("--group", type=int, default=8)
    cli.add_argument("--branch-at", type=int, default=3)
    cli.add_argument("--max-turns", type=int, default=4, help="the environment's turn limit (option max_turns)")
    cli.add_argument("--tokens", type=int, default=48, help="most tokens per reply")
    args = cli.parse_args()

    import strop
    from strop import model_info
    from strop.renderers import get_renderer
    from strop.rl.branching import play_branched
    from strop.rl.episodes import EnvironmentSource, EnvPool
    from strop.rl.rollouts import play

    service = strop.ServiceClient()
    training = service.create_lora_training_client(base_model=args.model, rank=8, seed=0)
    renderer = get_renderer(model_info.get_recommended_renderer_name(args.model), training.get_tokenizer())
    pool = EnvPool({"name": args.env, "options": {"max_turns": args.max_turns}}, args.tasks * args.group)
    source = EnvironmentSource(pool)
    tasks = pool.tasks("train", args.tasks)
    sampler = training.save_weights_and_get_sampling_client()
    rows = []
    t0 = time.perf_counter()
    plain = play(sampler, renderer, source.episodes(tasks, args.group), max_tokens=args.tokens, seed=0)
    plain_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    branched = play_branched(sampler, renderer, lambda n: source.episodes(tasks, n), group_size=args.group,
                             branch_at=args.branch_at, max_tokens=args.tokens, seed=0)
    branched_s = time.perf_counter() - t0
    rows.append({**measure("plain", plain, training), "sample s": round(plain_s, 1)})
    rows.append({**measure(f"branched at turn {args.branch_at}", branched, training), "sample s": round(branched_s, 1)})
    pool.close()
    keys = list(rows[0])
    print(" | ".join(keys))
    for row in rows:
        print(" | ".join(str(row[k]) for k in keys))
    print(f"branching trained tokens {rows[1]['trained'] / max(1, rows[0]['trained']):.2f}x, trainer positions "
          f"{rows[1]['trainer positions'] / max(1, rows[0]['trainer positions']):.2f}x of plain")


if __name__ == "__main__":
    main()
