"""The sampler's prefix cache: a prompt that extends one prefilled before, or shares a long prefix with its
batch, runs only its new tokens, and gets the tokens and logprobs a full prefill gives."""

import pytest
import torch

from strop.engine.prefix_cache import MIN_REUSE, PrefixCache, default_budget
from strop.errors import StropError
from strop.engine.sampler import AdapterWeights, SampleRequest, SamplerEngine
from strop.models import load_tokenizer
from strop.types import SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0, stop=[])


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


def engine(tiny_model_dir, tok, cached: bool, fast: bool = True) -> SamplerEngine:
    return SamplerEngine(tiny_model_dir, tokenizer=tok, dtype=torch.float32, fast_decode=fast,
                         prefix_cache_bytes=(64 << 20) if cached else 0)


def generate(eng, prompts, params=GREEDY):
    return [r.sequences[0] for r in eng.generate([SampleRequest(list(p), 1, params) for p in prompts])]


@pytest.mark.parametrize("fast", [True, False], ids=["strop-decode", "hf-forward"])
def test_a_next_turn_reuses_its_conversation_and_samples_what_a_full_prefill_samples(tiny_model_dir, tok, fast):
    with_cache, without = engine(tiny_model_dir, tok, True, fast), engine(tiny_model_dir, tok, False, fast)
    assert without.prefix_cache is None
    firsts = [tok.encode("system: you answer with tools. " * 4 + f"question {i}: what is {i} + {2 * i}?")
              for i in range(3)]
    turn1 = generate(with_cache, firsts)
    assert [s.tokens for s in turn1] == [s.tokens for s in generate(without, firsts)]
    # turn 2: the conversation so far (prompt, reply, a tool's answer of a different length per episode)
    seconds = [p + s.tokens + tok.encode(" tool says:" + " ok" * (i + 1)) for i, (p, s) in enumerate(zip(firsts, turn1))]
    reused_before = with_cache.prefix_cache.reused_tokens
    turn2, plain = generate(with_cache, seconds), generate(without, seconds)
    assert with_cache.prefix_cache.reused_tokens - reused_before >= sum(len(p) for p in firsts)
    assert [s.tokens for s in turn2] == [s.tokens for s in plain]
    for got, want in zip(turn2, plain):
        assert max(abs(a - b) for a, b in zip(got.logprobs, want.logprobs)) < 1e-4
    # each turn-1 entry was replaced by the turn-2 prompt that extends it: one entry per episode
    assert len(with_cache.prefix_cache) == 3


def test_a_batch_sharing_a_long_prefix_prefills_it_once(tiny_model_dir, tok):
    with_cache, without = engine(tiny_model_dir, tok, True), engine(tiny_model_dir, tok, False)
    shared = tok.encode("You can call these tools: list_tables, describe_table, run_sql, submit_answer. " * 3)
    prompts = [shared + tok.encode(f" Task {i}: revenue of company {i * 7}?") for i in range(4)]
    sampled = SamplingParams(max_tokens=10, temperature=1.0, seed=3, stop=[])
    got, want = generate(with_cache, prompts, sampled), generate(without, prompts, sampled)
    assert [s.tokens for s in got] == [s.tokens for s in want]
    assert with_cache.prefix_cache.hits >= len(prompts)
    assert with_cache.prefix_cache.reused_tokens >= len(prompts) * (len(shared) - 2)


def test_switching_the_adapter_empties_the_cache(tiny_model_dir, tok):
    eng = engine(tiny_model_dir, tok, True)
    prompt = tok.encode("a prompt long enough to be kept in the prefix cache, " * 3)
    generate(eng, [prompt])
    assert len(eng.prefix_cache) == 1
    name = "model.layers.0.self_attn.q_proj"
    weight = eng._modules[name].weight
    a, b = torch.randn(2, weight.shape[1]), torch.randn(weight.shape[0], 2)
    eng.activate(AdapterWeights({name: (a, b)}, scaling=1.0))
    assert len(eng.prefix_cache) == 0
    adapted = generate(eng, [prompt])
    fresh = SamplerEngine(tiny_model_dir, tokenizer=tok, prefix_cache_bytes=0, dtype=torch.float32)
    fresh.activate(AdapterWeights({name: (a, b)}, scaling=1.0))
    assert adapted[0].tokens == generate(fresh, [prompt])[0].tokens


def layers_of(n_tokens: int, n_layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.zeros(1, n_tokens, 4), torch.zeros(1, n_tokens, 4)) for _ in range(n_layers)]


def test_the_cache_keeps_to_its_budget_and_finds_the_longest_prefix():
    per_token = 2 * 2 * 4 * 4  # layers x (keys, values) x head_dim x 4 bytes
    cache = PrefixCache(max_bytes=100 * per_token)
    a, b = tuple(range(40)), tuple(range(30)) + (99,) * 10
    cache.add(a, layers_of(40))
    cache.add(b, layers_of(40))
    assert cache.bytes == 80 * per_token
    assert cache.longest(list(range(35)) + [7]) == (a, 35)
    assert cache.longest(list(range(30)) + [99, 99, 5]) == (b, 32)
    assert cache.longest(list(range(MIN_REUSE - 2)) + [5, 5]) == (None, 0)  # too short a match to use
    assert cache.longest(list(range(40))) == (a, 39)  # the last position always runs
    cache.add(tuple(range(100, 140)), layers_of(40))  # past the budget: the least recently used goes
    assert len(cache) == 2 and cache.bytes <= cache.max_bytes
    assert b not in cache._entries and a in cache._entries  # a was looked up last, b least recently
    cache.add(tuple(range(500)), layers_of(500))  # bigger than the whole budget: not kept
    assert len(cache) == 2
    longer = tuple(range(100, 150))
    cache.add(longer, layers_of(50), replaces=tuple(range(100, 140)))
    assert tuple(range(100, 140)) not in cache._entries and longer in cache._entries
    cache.clear()
    assert len(cache) == 0 and cache.bytes == 0


def test_the_budget_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("STROP_PREFIX_CACHE_MB", "0")
    assert default_budget() == 0
    monkeypatch.setenv("STROP_PREFIX_CACHE_MB", "12")
    assert default_budget() == 12 << 20
    monkeypatch.setenv("STROP_PREFIX_CACHE_MB", "lots")
    with pytest.raises(StropError, match="STROP_PREFIX_CACHE_MB must be a whole number"):
        default_budget()
    monkeypatch.delenv("STROP_PREFIX_CACHE_MB")
    assert 0 < default_budget() <= 4 << 30


def test_memory_freed_and_kept_by_the_process_counts_as_available(monkeypatch):
    # strop keeps freed memory in the heap (strop.engine.malloc), so the kernel no longer counts it as available;
    # admission must, or a warm start followed by GRPO in one process is refused memory it holds
    import ctypes

    from strop.engine import resources
    from strop.engine.malloc import keep_freed_memory, kept_free_bytes

    if not keep_freed_memory() or not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("not glibc >= 2.33: freed memory cannot be read")
    block = torch.ones(256 << 20, dtype=torch.uint8)
    block += 1  # touch every page
    del block
    assert kept_free_bytes() >= 200 << 20  # freed into the heap (or served from free memory already there)
    monkeypatch.delenv("STROP_MEMORY_LIMIT_MB", raising=False)
    monkeypatch.setattr(resources, "kept_free_bytes", lambda: 0)
    kernel_only = resources.available_bytes()
    monkeypatch.setattr(resources, "kept_free_bytes", lambda: 5 << 30)
    assert abs(resources.available_bytes() - kernel_only - (5 << 30)) < 256 << 20  # MemAvailable moves a little
