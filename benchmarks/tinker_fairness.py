"""Fair service on a shared `strop serve-tinker`: how long does one key's 1-token sampling request wait while
another key has its three largest allowed sampling requests queued (issue 36, item 2)?

Two servers side by side in one run, the same requests through the unmodified tinker SDK on loopback:
- `chunks`: the server as shipped (--sample-batch-tokens 8192): keys take turns, and a request is served a chunk
  at a time (at most 8192 sampled tokens a turn), so the newcomer waits for one chunk;
- `whole`: --sample-batch-tokens past every request (what the server did before: a batch takes every queued
  request and runs each whole).

    python benchmarks/tinker_fairness.py                      # the tiny model, 3 x (64 samples x 2048 tokens)
    python benchmarks/tinker_fairness.py --samples 16 --max-tokens 512   # quicker

Prints the newcomer's wait and the big requests' total time for each, and their ratios; the last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from strop.engine.precision import kernels  # noqa: E402

MODEL = "strop/tiny-random"


def serve(root: Path, sample_batch_tokens: int):
    from strop.tinker_wire.app import TinkerServer, make_tinker_app
    from strop.tinker_wire.service import TinkerService
    service = TinkerService(root, sample_batch_tokens=sample_batch_tokens, queued_tokens_per_key=1 << 22)
    app = make_tinker_app(service, api_keys={"tml-big", "tml-small"}, open_mode=False, long_poll_s=5.0)
    return TinkerServer(app, port=0).start()


def measure(url: str, samples: int, max_tokens: int) -> dict:
    import tinker
    from tinker import types
    os.environ["TINKER_BASE_URL"] = url

    def client(key: str):
        os.environ["TINKER_API_KEY"] = key
        service = tinker.ServiceClient()
        return service, service.create_sampling_client(base_model=MODEL).result()

    big_service, big = client("tml-big")
    small_service, small = client("tml-small")
    prompt = types.ModelInput.from_ints([1, 2, 3, 4])
    small.sample(prompt, 1, types.SamplingParams(max_tokens=1, seed=0)).result()     # the model loaded and warm
    started = time.perf_counter()
    futures = [big.sample(prompt, samples, types.SamplingParams(max_tokens=max_tokens, seed=i, temperature=1.0))
               for i in range(3)]
    time.sleep(1.0)                                    # the big requests are queued (and one is running)
    asked = time.perf_counter()
    small.sample(prompt, 1, types.SamplingParams(max_tokens=1, seed=1)).result()
    waited = time.perf_counter() - asked
    for future in futures:
        future.result()
    total = time.perf_counter() - started
    for service in (big_service, small_service):
        service.close("success").result()
    return {"newcomerSeconds": round(waited, 2), "bigRequestsSeconds": round(total, 2)}


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--samples", type=int, default=64, help="samples per big request (default: %(default)s)")
    cli.add_argument("--max-tokens", type=int, default=2048, help="tokens per sample (default: %(default)s)")
    args = cli.parse_args()
    import torch
    print(f"tiny model; CPU kernels {kernels()}; torch threads {torch.get_num_threads()}; 3 requests of "
          f"{args.samples} x {args.max_tokens} tokens, then a 1-token request from another key", flush=True)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, batch_tokens in (("chunks", 8192), ("whole", 1 << 40)):
            server = serve(Path(tmp) / name, batch_tokens)
            try:
                results[name] = measure(server.url, args.samples, args.max_tokens)
            finally:
                server.stop()
            print(f"{name:7s} newcomer waited {results[name]['newcomerSeconds']:7.2f} s; the three big requests "
                  f"took {results[name]['bigRequestsSeconds']:7.2f} s", flush=True)
    ratios = {"newcomerWholeOverChunks": round(results["whole"]["newcomerSeconds"]
                                               / max(results["chunks"]["newcomerSeconds"], 1e-3), 1),
              "bigChunksOverWhole": round(results["chunks"]["bigRequestsSeconds"]
                                          / results["whole"]["bigRequestsSeconds"], 2)}
    print(f"the newcomer waits {ratios['newcomerWholeOverChunks']}x longer when requests run whole; cutting costs "
          f"the big requests {ratios['bigChunksOverWhole']}x their time", flush=True)
    print(json.dumps({"kernels": kernels(), "settings": vars(args), **results, "ratios": ratios}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
