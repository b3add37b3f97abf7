"""Peak memory and time of scoring sequences (`prompt_logprobs`: what a GRPO step's KL to its start model and
`compute_logprobs` run), projected onto the vocabulary a span of positions at a time (strop's way since issue 37's
OOM) against all positions at once (the way before), each in a fresh process, one after the other.

    python benchmarks/scoring_memory.py                          # SmolLM2-135M-Instruct, 4 x 2,000 tokens
    python benchmarks/scoring_memory.py --model /tmp/tiny-random --rows 2 --tokens 64   # a quick check

"all at once" is the same code with LOGIT_SPAN_TOKENS past the batch, so it holds the batch's B x T x V float32
logits and their logsumexp as the old code did. Per side: the process's peak resident memory (VmHWM) after the
model loaded and before scoring, the peak after scoring, and the seconds scoring took (best of --repeats). The
last line: `scoring span X.XX GB all-at-once Y.YY GB ratio Z.ZZ (time ratio T.TT)`, the peaks' growth during
scoring and span / all-at-once.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from strop.engine.precision import kernels


def _hwm_kb() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _worker(args) -> None:
    import torch

    from strop.engine import sampler as sampler_module
    from strop.engine.sampler import SamplerEngine
    from strop.models.loading import resolve_model
    from strop.tokenizer_utils import get_tokenizer
    if args.side == "all-at-once":
        sampler_module.LOGIT_SPAN_TOKENS = 1 << 40
    path = str(resolve_model(args.model))
    engine = SamplerEngine(path, tokenizer=get_tokenizer(path), dtype=torch.float32, prefix_cache_bytes=0)
    vocab = engine.model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    sequences = [torch.randint(0, vocab, (args.tokens,), generator=g).tolist() for _ in range(args.rows)]
    open("/proc/self/clear_refs", "w").write("5")  # VmHWM from here on
    loaded = _hwm_kb()
    best, first = float("inf"), None
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        scored = engine.prompt_logprobs(sequences)
        best = min(best, time.perf_counter() - t0)
        first = first or scored[-1][-1]
    print(json.dumps({"loaded_kb": loaded, "peak_kb": _hwm_kb(), "seconds": best, "last": first}))


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    cli.add_argument("--rows", type=int, default=4, help="sequences scored in one batch (default: %(default)s)")
    cli.add_argument("--tokens", type=int, default=2000, help="tokens a sequence (default: %(default)s)")
    cli.add_argument("--repeats", type=int, default=2)
    cli.add_argument("--side", choices=("span", "all-at-once"), help=argparse.SUPPRESS)
    args = cli.parse_args()
    if args.side:
        _worker(args)
        return 0
    print(f"{args.model}: {args.rows} x {args.tokens} tokens scored in float32; CPU kernels {kernels()}", flush=True)
    found = {}
    for side in ("span", "all-at-once"):
        out = subprocess.run([sys.executable, __file__, "--side", side, "--model", args.model, "--rows",
                              str(args.rows), "--tokens", str(args.tokens), "--repeats", str(args.repeats)],
                             capture_output=True, text=True, check=True)
        found[side] = json.loads(out.stdout.strip().splitlines()[-1])
        r = found[side]
        print(f"{side:12s} model loaded {r['loaded_kb'] / 1e6:.2f} GB, peak while scoring {r['peak_kb'] / 1e6:.2f} GB "
              f"(+{(r['peak_kb'] - r['loaded_kb']) / 1e6:.2f}), {r['seconds']:.2f} s", flush=True)
    span, whole = found["span"], found["all-at-once"]
    assert abs(span["last"] - whole["last"]) < 1e-3, "the two ways disagree on a logprob"
    grow = [(r["peak_kb"] - r["loaded_kb"]) / 1e6 for r in (span, whole)]
    print(f"scoring span {grow[0]:.2f} GB all-at-once {grow[1]:.2f} GB ratio {grow[0] / max(grow[1], 1e-9):.2f} "
          f"(time ratio {span['seconds'] / whole['seconds']:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
