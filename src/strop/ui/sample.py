"""The models page's sample box: one reply from a base or tuned model, through strop's own sampler.

    sample("model-2d69fb15", "What is 13 + 6?", max_tokens=64)   # {'text': ..., 'tokens': 12, 'seconds': 0.8}

One model is kept loaded (the last one asked for) and one request samples at a time: the UI runs on the machine
that trains, and a second model's weights or a second decode must not compete with a run for its memory.
"""

from __future__ import annotations

import threading
import time

from strop import model_info
from strop.control.evaluations import resolve_model
from strop.errors import StropError
from strop.tokenizer_utils import get_tokenizer

MAX_PROMPT_CHARS = 8000
MAX_TOKENS = 512
_LOCK = threading.Lock()
_LOADED: dict[str, tuple] = {}


def sample(model: str, prompt: str, *, max_tokens: int = 128, temperature: float = 0.0) -> dict:
    if not isinstance(prompt, str) or not prompt.strip():
        raise StropError("prompt: write something for the model to answer")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise StropError(f"prompt: at most {MAX_PROMPT_CHARS} characters here (got {len(prompt)})")
    if not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_TOKENS:
        raise StropError(f"maxTokens must be a whole number from 1 to {MAX_TOKENS} (got {max_tokens!r})")
    if not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
        raise StropError(f"temperature must be a number from 0 to 2 (got {temperature!r})")
    # lazy: strop.types and the renderers pull in torch, which the rest of the UI never needs
    from strop import types
    from strop.renderers import get_text_content
    with _LOCK:
        sampler, renderer = _load(model)
        t0 = time.perf_counter()
        params = types.SamplingParams(max_tokens=max_tokens, temperature=float(temperature), seed=0,
                                      stop=renderer.get_stop_sequences())
        prompt_input = renderer.build_generation_prompt([{"role": "user", "content": prompt}])
        sequence = sampler.sample(prompt=prompt_input, num_samples=1, sampling_params=params).result().sequences[0]
        message, _ = renderer.parse_response(list(sequence.tokens))
    return {"model": model, "text": get_text_content(message), "tokens": len(sequence.tokens),
            "stopReason": sequence.stop_reason, "seconds": round(time.perf_counter() - t0, 2)}


def _load(model: str) -> tuple:
    if model not in _LOADED:
        # lazy: the client loads torch and the weights; only a person using the sample box pays for it
        import strop
        from strop.renderers import get_renderer
        found = resolve_model(model)
        if found.get("openai"):
            raise StropError(f"{model!r} is an endpoint; the sample box samples a tuned model or a selected base model")
        _LOADED.clear()           # one model in memory at a time
        sampler = strop.ServiceClient().create_sampling_client(base_model=found["basePath"], model_path=found["adapter"])
        renderer = get_renderer(model_info.get_recommended_renderer_name(found["baseModel"]),
                                get_tokenizer(found["basePath"]))
        _LOADED[model] = (sampler, renderer)
    return _LOADED[model]
