"""learning_arithmetic's held-out evaluation, in float32, of the adapters its runs left: a run that sampled in
bf16 was evaluated by its bf16 sampler, and a bf16 forward rounds away part of what an adapter changed.

    python benchmarks/reevaluate_arithmetic.py OUT [OUT ...]     # each OUT a learning_arithmetic --out folder

Prints the base model's score, then each adapter's (OUT/final) with the discordant pairs and exact McNemar p."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import strop  # noqa: E402
from learning_arithmetic import greedy_correct, held_out  # noqa: E402
from strop import model_info, renderers  # noqa: E402
from strop.evals.stats import mcnemar_exact  # noqa: E402

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def main(outs: list[str]) -> int:
    if not outs:
        sys.exit(__doc__)
    rows = held_out("add", 200)
    service = strop.ServiceClient(dtype="bfloat16", sampler_dtype="float32")
    service.start_sampler(MODEL)
    renderer = renderers.get_renderer(model_info.get_recommended_renderer_name(MODEL),
                                      strop.tokenizer_utils.get_tokenizer(MODEL))
    before = greedy_correct(service.create_sampling_client(base_model=MODEL), renderer, rows, 48)
    print(f"base, float32: {sum(before)}/{len(rows)}")
    for out in outs:
        adapter = Path(out) / "final"
        after = greedy_correct(service.create_sampling_client(base_model=MODEL, model_path=str(adapter)), renderer,
                               rows, 48)
        lost = sum(x and not y for x, y in zip(before, after))
        gained = sum(y and not x for x, y in zip(before, after))
        print(f"{out}, float32: {sum(after)}/{len(rows)}; lost {lost}, gained {gained}, exact McNemar p "
              f"{mcnemar_exact(lost, gained):.2g}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
