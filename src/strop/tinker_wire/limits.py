"""The bounds `strop serve-tinker`'s routes hold requests to, and the checks of a request's content that the routes
share: each check raises WireError with the message the SDK's caller sees."""

from __future__ import annotations

import numpy as np

from strop.tinker_wire import codec
from strop.tinker_wire.codec import WireError

MAX_BODY_BYTES = 64 << 20       # a forward_backward chunk (the SDK splits at ~5 MB of payload; zstd or not)
MAX_JSON_BYTES = 8 << 20        # any other request
MAX_DATUMS = 1024               # datums in one forward_backward request (the SDK's chunk is at most this)
LONG_POLL_S = 20.0              # retrieve_future waits this long for a result before answering try_again
BODY_TIMEOUT_S = 60.0           # a request body must arrive within this
MAX_TTL_S = 10 * 365 * 86400    # a checkpoint's longest TTL (the SDK's: 1 hour to 10 years, or never)
MAX_TOPK_ENTRIES = 1 << 22      # top-k (token, logprob) pairs in one sampling reply: 32 MB
MAX_NEW_TOKENS = 8192           # one sampling request's completion budget per sample
MAX_SAMPLED_TOKENS = 131072     # and over all its samples (num_samples x max_tokens): a request's time is bounded
MAX_REQUEST_TOKENS = 300_000    # input tokens in one forward_backward request (the SDK's ~4 MB chunks stay under)
SUPPORTED_LOSSES = {"cross_entropy": (), "importance_sampling": (), "ppo": ("clip_low_threshold", "clip_high_threshold"),
                    "cispo": ("clip_low_threshold", "clip_high_threshold"), "dro": ("beta",)}
ATTN, MLP = ["q_proj", "k_proj", "v_proj", "o_proj"], ["gate_proj", "up_proj", "down_proj"]


def remember(seen: dict, seq_id: int, value) -> None:
    """Note the future a request's seq_id got (a re-sent request gets it again), keeping the newest 1024."""
    seen[seq_id] = value
    while len(seen) > 1024:
        del seen[next(iter(seen))]


def peek_model_id(raw: bytes) -> str:
    pb = codec.proto()
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(raw)
    except Exception as exc:
        raise WireError(f"the forward_backward body is not a ForwardBackwardRequest protobuf ({exc})") from None
    return msg.model_id


def check_loss(loss_fn: str, config: dict) -> None:
    if loss_fn not in SUPPORTED_LOSSES:
        raise WireError(f"loss_fn {loss_fn[:40]!r} is not supported by this server; it has "
                        f"{', '.join(SUPPORTED_LOSSES)} (forward_backward_custom works too)")
    unknown = [k for k in config if k not in SUPPORTED_LOSSES[loss_fn]]
    if unknown:
        allowed = ", ".join(SUPPORTED_LOSSES[loss_fn]) or "none"
        raise WireError(f"loss_fn_config for {loss_fn!r}: unsupported key {unknown[0][:40]!r} (it takes {allowed})")
    for key, value in config.items():
        if not isinstance(value, float) or not np.isfinite(value) or value < 0:
            raise WireError(f"loss_fn_config[{key!r}] must be a finite number >= 0")
    if "clip_low_threshold" in config and "clip_high_threshold" in config and \
            config["clip_low_threshold"] > config["clip_high_threshold"]:
        raise WireError("loss_fn_config: clip_low_threshold is above clip_high_threshold")


def adam_only(optimizer_config) -> None:
    kind = getattr(optimizer_config, "type", "adamw")
    if kind != "adamw":
        raise WireError(f"optimizer {str(kind)[:30]!r} is not supported by this server; it trains with AdamW")


def trained(model):
    if model.client is None:
        raise WireError(f"model {model.id} was not created (its create_model request failed)")
    return model.client


def project(value) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= 128:
        raise WireError(f"project_id must be a string of 1-128 characters, got {str(value)[:40]!r}")
    return value


def str_dict(value) -> dict | None:
    if not value:
        return None
    return {str(k)[:100]: str(v)[:1000] for k, v in list(value.items())[:64]}


def prompt_tokens(model_input, vocab_size: int) -> list[int]:
    tokens: list[int] = []
    for chunk in model_input.chunks:
        if getattr(chunk, "type", None) != "encoded_text":
            raise WireError("only text chunks (EncodedTextChunk) are supported; this server's models read no images")
        tokens.extend(int(t) for t in chunk.tokens)
    bad = [t for t in tokens if not 0 <= t < vocab_size]
    if bad:
        raise WireError(f"prompt token id {bad[0]} is outside the model's vocabulary (0..{vocab_size - 1})")
    return tokens


def stop_sequences(stop, vocab_size: int):
    if stop is None or isinstance(stop, str):
        return stop
    stop = list(stop)
    if len(stop) > 64:
        raise WireError("at most 64 stop sequences")
    if all(isinstance(s, int) for s in stop):
        if any(not 0 <= s < vocab_size for s in stop):
            raise WireError("a stop token id is outside the model's vocabulary")
        return stop
    if all(isinstance(s, str) for s in stop):
        if any(len(s) > 1000 for s in stop):
            raise WireError("a stop string is over 1000 characters")
        return stop
    raise WireError("stop must be strings or token ids, not a mix")
