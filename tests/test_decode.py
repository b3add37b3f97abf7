"""strop's own decode step for Llama-style models against HF's forward, and the sampler's token draws."""

import math

import pytest
import torch

from strop.engine import sampler as sampler_module
from strop.engine.decode import LlamaDecoder
from strop.engine.sampler import AdapterWeights, SampleRequest, SamplerEngine, _Row
from strop.models import load_tokenizer
from strop.types import SamplingParams


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    fast = SamplerEngine(tiny_model_dir, tokenizer=tok)
    plain = SamplerEngine(tiny_model_dir, tokenizer=tok, fast_decode=False)
    assert fast._decoder is not None and plain._decoder is None
    return fast, plain, tok


def requests_of(tok):
    # prompts of different lengths (left padding), shared prompts, greedy and sampled rows, different max_tokens
    # so rows leave the batch at different steps
    texts = ["What is 2 + 3?", "Compute the sum of seven and eleven, please.", "Hi"]
    params = [SamplingParams(max_tokens=9, temperature=0, stop=[]), SamplingParams(max_tokens=14, seed=5, stop=[]),
              SamplingParams(max_tokens=4, seed=9, top_p=0.9, top_k=20, stop=[])]
    return [SampleRequest(prompt_tokens=tok.encode(t), num_samples=n, params=p)
            for t, n, p in zip(texts, (2, 3, 2), params)]


def run(engine, requests):
    return [[(s.tokens, s.logprobs, s.stop_reason) for s in r.sequences] for r in engine.generate(requests)]


def assert_same(a, b):
    assert [[s[0] for s in r] for r in a] == [[s[0] for s in r] for r in b]
    assert [[s[2] for s in r] for r in a] == [[s[2] for s in r] for r in b]
    for ra, rb in zip(a, b):
        for sa, sb in zip(ra, rb):
            assert max((abs(x - y) for x, y in zip(sa[1], sb[1])), default=0.0) < 1e-4


def test_fast_decode_gives_hf_forward_tokens_and_logprobs(engines):
    fast, plain, tok = engines
    got, want = run(fast, requests_of(tok)), run(plain, requests_of(tok))
    assert_same(got, want)
    assert [len(s[0]) for s in got[1]] == [14, 14, 14] and [len(s[0]) for s in got[2]] == [4, 4]


def test_buffers_grow_as_rows_lengthen(engines, monkeypatch):
    from strop.engine.decode import DecodeState
    monkeypatch.setattr(DecodeState, "GROW", 3)  # 14 new tokens: the buffers grow several times
    fast, plain, tok = engines
    assert_same(run(fast, requests_of(tok)), run(plain, requests_of(tok)))


def test_rows_take_their_prompts_cache_and_the_cache_is_spent_layer_by_layer(engines):
    """Several samples of one prompt start from its cache row (`rows_of`), copied a layer at a time into the decode
    buffers with each layer of the prompts' cache dropped once copied: a batch never holds its rows' keys and
    values twice (64 finance-sql rows of ~2,000 positions are 5.9 GB a copy in float32)."""
    fast, _, tok = engines
    prompts = [tuple(tok.encode("What is 2 + 3?")), tuple(tok.encode("Hi there"))]
    with torch.inference_mode():
        _, cache, mask = fast._prefill(prompts)
    copies = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    rows_of = torch.tensor([1, 0, 0, 1, 1])
    state = fast._decoder.start(cache, mask[rows_of], 4, rows_of=rows_of)
    assert all(layer.keys is None and layer.values is None for layer in cache.layers)
    width = mask.shape[1]
    for (keys, values), got_k, got_v in zip(copies, state.keys, state.values):
        assert torch.equal(got_k[:, :, :width], keys[rows_of]) and torch.equal(got_v[:, :, :width], values[rows_of])


def shared_prefix_requests(tok):
    """Prompts that all start with one long system text (as tool schemas do), of different lengths after it; one
    of them sampled three times, the others with greedy and top-p rows that stop at different steps."""
    system = "You are a careful analyst. Use the tools to look at the tables before you answer. " * 3
    texts = [system + "What is 2 + 3?", system + "Compute the sum of seven and eleven, please.", system + "Hi"]
    params = [SamplingParams(max_tokens=9, temperature=0, stop=[]), SamplingParams(max_tokens=14, seed=5, stop=[]),
              SamplingParams(max_tokens=4, seed=9, top_p=0.9, top_k=20, stop=[])]
    return [SampleRequest(prompt_tokens=tok.encode(t), num_samples=n, params=p)
            for t, n, p in zip(texts, (2, 3, 2), params)]


@pytest.mark.parametrize("grow", [128, 3], ids=["one-buffer", "buffers-grow"])
def test_a_prefix_every_row_shares_is_kept_once_with_hf_forwards_numbers(engines, monkeypatch, grow):
    """The decode state keeps the batch's common prefix once and each row's own positions beside it (left-padded
    whatever the prompt cache's layout); tokens and logprobs are HF forward's, as rows leave and buffers grow."""
    from strop.engine.decode import MIN_SHARED, DecodeState
    monkeypatch.setattr(DecodeState, "GROW", grow)
    fast, plain, tok = engines
    requests = shared_prefix_requests(tok)
    shared = sampler_module.common_prefix([r.prompt_tokens for r in requests])
    assert shared >= MIN_SHARED
    states = []
    original = DecodeState.__init__
    monkeypatch.setattr(DecodeState, "__init__",
                        lambda self, *a, **k: (states.append(self), original(self, *a, **k))[1])
    for _ in range(2):  # the second time the prompt cache holds the prefix: another layout of the prompts' slots
        assert_same(run(fast, requests), run(plain, requests))
    longest_own = max(len(r.prompt_tokens) for r in requests) - shared
    for state in states:
        assert state.shared == shared and state.shared_keys[0].shape[1] == shared
        assert state.keys[0].shape[2] <= longest_own + max(r.params.max_tokens for r in requests)


def test_one_prompts_samples_keep_the_whole_prompt_once(engines):
    """Samples of one prompt share all of it: the rows' buffers start empty and hold only what they generate."""
    fast, plain, tok = engines
    prompt = tok.encode("You are a careful analyst. Use the tools to look at the tables before you answer. " * 2)
    requests = [SampleRequest(prompt_tokens=prompt, num_samples=4, params=SamplingParams(max_tokens=6, seed=3))]
    with torch.inference_mode():
        _, cache, mask = fast._prefill([tuple(prompt)])
    state = fast._decoder.start(cache, mask[[0, 0, 0, 0]], 6, rows_of=torch.tensor([0, 0, 0, 0]), shared=len(prompt))
    assert state.length == 0 and state.shared_keys[0].shape[1] == len(prompt)
    assert_same(run(fast, requests), run(plain, requests))


def test_a_shared_prefix_counts_once_in_a_batchs_memory(engines, monkeypatch):
    """Rows of prompts with a long common prefix: a memory budget that holds every row's own positions but not every
    row's whole prompt still runs them as one batch, since the decode state keeps the prefix once."""
    from strop.engine.sampler import KV_SHARE
    fast, _, tok = engines
    requests = shared_prefix_requests(tok)
    shared = sampler_module.common_prefix([r.prompt_tokens for r in requests])
    rows = sum(r.num_samples for r in requests)
    longest = max(len(r.prompt_tokens) + r.params.max_tokens for r in requests)
    budget = (shared + rows * (longest - shared) + 1) * fast.kv_bytes_per_token
    assert budget < rows * longest * fast.kv_bytes_per_token  # per row, the batch would be cut
    monkeypatch.setenv("STROP_MEMORY_LIMIT_MB", str(budget / KV_SHARE / 2**20))
    sizes = []
    original = fast._generate_batch
    monkeypatch.setattr(fast, "_generate_batch",
                        lambda rows, prompts: (sizes.append(len(rows)), original(rows, prompts)))
    fast.generate(requests)
    assert sizes == [rows]


def test_no_requests_sample_nothing(engines):
    assert engines[0].generate([]) == []


def test_bfloat16_buffers_keep_the_prefix_per_row():
    """In bfloat16 a matmul over the rows' own keys copies them (SDPA reads them in place): measured slower, so
    the prefix stays in each row there."""
    from strop.engine.decode import MIN_SHARED, kept_shared
    assert kept_shared(MIN_SHARED, torch.float32) == MIN_SHARED
    assert kept_shared(MIN_SHARED - 1, torch.float32) == 0
    assert kept_shared(500, torch.bfloat16) == 0


def test_lora_merging_reaches_the_fused_weights(engines):
    fast, plain, tok = engines
    gen = torch.Generator().manual_seed(0)
    deltas = {}
    for name in ("model.layers.0.self_attn.k_proj", "model.layers.1.self_attn.v_proj", "model.layers.1.mlp.up_proj"):
        out_f, in_f = fast._modules[name].weight.shape
        deltas[name] = (torch.randn(2, in_f, generator=gen), torch.randn(out_f, 2, generator=gen))
    adapter = AdapterWeights(deltas=deltas, scaling=0.5)
    base = run(fast, requests_of(tok))
    fast.activate(adapter)
    plain.activate(adapter)
    try:
        tuned = run(fast, requests_of(tok))
        assert_same(tuned, run(plain, requests_of(tok)))
        assert [s[0] for r in tuned for s in r] != [s[0] for r in base for s in r]  # the adapter changed the samples
    finally:
        fast.activate(None)
        plain.activate(None)
    assert_same(run(fast, requests_of(tok)), base)


def test_models_it_does_not_know_fall_back_to_hf(engines):
    fast, _, _ = engines
    config = fast.model.config
    for key, value in (("attention_bias", True), ("model_type", "gpt2"), ("sliding_window", 128)):
        old = getattr(config, key, None)
        setattr(config, key, value)
        try:
            assert LlamaDecoder.for_model(fast.model) is None
        finally:
            setattr(config, key, old)
    assert LlamaDecoder.for_model(fast.model) is not None


def rows(n, seed=0, **params):
    return [_Row(prompt_index=0, generator=torch.Generator().manual_seed(seed + i), params=SamplingParams(**params),
                 max_tokens=1, stop_ids=frozenset(), stop_strings=()) for i in range(n)]


def test_draws_follow_the_distribution_and_never_pick_excluded_tokens(engines):
    fast, _, _ = engines
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0, 0.0])
    logits = torch.log(probs).expand(4000, -1).clone()
    tokens, logprobs = fast._pick(logits, rows(4000, temperature=1.0))
    counts = torch.bincount(tokens, minlength=6).double()
    assert counts[4] == counts[5] == 0
    for k in range(4):  # within 4 standard deviations of the expected count
        expected = 4000 * probs[k].item()
        assert abs(counts[k] - expected) < 4 * math.sqrt(expected * (1 - probs[k].item())), (k, counts.tolist())
    assert torch.allclose(logprobs, torch.log(probs)[tokens])  # the model's own logprobs of what was drawn
    top2, _ = fast._pick(logits.clone(), rows(2000, temperature=1.0, top_k=2))
    assert set(top2.tolist()) == {0, 1}
    nucleus, _ = fast._pick(logits.clone(), rows(2000, temperature=1.0, top_p=0.7))
    assert set(nucleus.tolist()) == {0, 1}  # 0.5 alone is short of 0.7; 0.5 + 0.3 reaches it
    greedy, _ = fast._pick(logits[:3].clone(), rows(3, temperature=0.0))
    assert greedy.tolist() == [0, 0, 0]
    # a row's draw depends on its own generator only, not on the rows beside it
    alone, _ = fast._pick(logits[:1].clone(), rows(1, seed=7, temperature=1.0))
    mixed, _ = fast._pick(logits[:3].clone(), rows(1, seed=7, temperature=1.0) + rows(2, seed=100, temperature=0.5))
    assert alone[0] == mixed[0]


def test_the_two_level_draw_picks_what_one_cumulative_sum_picks():
    from strop.engine.sampler import CDF_BLOCK, inverse_cdf
    gen = torch.Generator().manual_seed(3)
    for V in (CDF_BLOCK * 4, CDF_BLOCK * 4 + 37, 5):  # whole blocks, a padded last block, less than one block
        logits = torch.randn(500, V, generator=gen) * 3
        logits[:, ::7] = float("-inf")  # excluded entries, some at block edges
        probs = torch.softmax(logits, -1)
        u = torch.rand(500, generator=gen, dtype=torch.float64)
        u[:3] = torch.tensor([0.0, 1 - 1e-16, 0.5])  # both ends of [0, 1)
        cdf = probs.double().cumsum(-1)
        expected = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0].clamp(max=V - 1)
        got = inverse_cdf(probs, u)
        assert torch.equal(got, expected), V
        assert bool((probs.gather(1, got[:, None]) > 0).all())


def test_the_two_level_draw_never_takes_a_zero_entry_when_rounding_overshoots_a_block():
    from strop.engine.sampler import CDF_BLOCK, inverse_cdf
    gen = torch.Generator().manual_seed(0)
    # entries spread over 2^40 in size: the block's float64 sum and its cumulative sum round differently
    first = torch.rand(CDF_BLOCK, generator=gen) * torch.exp2(-torch.randint(0, 40, (CDF_BLOCK,), generator=gen).float())
    first[-5:] = 0.0  # the block ends in excluded entries
    probs = torch.cat([first, torch.full((CDF_BLOCK,), 1e-3)])[None]
    by_sum, by_cumsum = first.sum(dtype=torch.float64).item(), first.double().cumsum(0)[-1].item()
    assert by_sum > by_cumsum  # the case this test is about (true for this seed)
    total = by_sum + probs[0, CDF_BLOCK:].double().sum().item()
    u = torch.tensor([(by_cumsum + by_sum) / 2 / total], dtype=torch.float64)  # past the entries, inside the block
    token = int(inverse_cdf(probs, u)[0])
    assert token < CDF_BLOCK - 5 and probs[0, token] > 0, token


def test_qwen3_decodes_through_the_fast_step_with_hf_forwards_numbers(tiny_model_dir, tmp_path):
    """Qwen3 (seed 003's Qwen3-0.6B) normalises each head's queries and keys before the rotation: a small random
    Qwen3 gives the same tokens and logprobs through the fast step as through HF's forward, adapter or not."""
    from transformers import AutoModelForCausalLM, Qwen3Config
    config = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                         eos_token_id=0, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # norms away from 1, so a decoder that skipped q_norm/k_norm would differ
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.uniform_(0.5, 2.0)
            layer.self_attn.k_norm.weight.uniform_(0.5, 2.0)
    model.save_pretrained(tmp_path / "qwen3")
    fast = SamplerEngine(tmp_path / "qwen3")
    plain = SamplerEngine(tmp_path / "qwen3", fast_decode=False)
    assert fast._decoder is not None and plain._decoder is None
    prompts = [[5, 17, 99, 3], [40, 41, 42, 43, 44, 45, 46], [7]]
    params = [SamplingParams(max_tokens=12, temperature=0, stop=[]), SamplingParams(max_tokens=10, seed=3, stop=[]),
              SamplingParams(max_tokens=6, seed=4, top_k=30, stop=[])]
    requests = [SampleRequest(prompt_tokens=p, num_samples=2, params=q) for p, q in zip(prompts, params)]
    assert_same(run(fast, requests), run(plain, requests))
    gen = torch.Generator().manual_seed(1)
    name = "model.layers.1.self_attn.q_proj"
    out_f, in_f = fast._modules[name].weight.shape
    adapter = AdapterWeights(deltas={name: (torch.randn(2, in_f, generator=gen), torch.randn(out_f, 2, generator=gen))},
                             scaling=0.5)
    fast.activate(adapter)
    plain.activate(adapter)
    assert_same(run(fast, requests), run(plain, requests))
    config.layer_types = ["full_attention", "sliding_attention"]
    assert LlamaDecoder.for_model(AutoModelForCausalLM.from_config(config)) is None


def test_decode_batches_are_cut_to_what_memory_holds(engines, monkeypatch):
    """A batch's keys and values at their final length get KV_SHARE of the available memory: with little of it
    the rows run in several batches, and every row's tokens are the ones the one batch gave."""
    from strop.engine.sampler import KV_SHARE
    fast, _, tok = engines
    requests = requests_of(tok)
    whole = run(fast, requests)
    longest = max(len(r.prompt_tokens) + r.params.max_tokens for r in requests)
    monkeypatch.setenv("STROP_MEMORY_LIMIT_MB", str(2.5 * longest * fast.kv_bytes_per_token / KV_SHARE / 2**20))
    sizes = []
    original = fast._generate_batch
    monkeypatch.setattr(fast, "_generate_batch",
                        lambda rows, prompts: (sizes.append(len(rows)), original(rows, prompts)))
    cut = run(fast, requests)
    assert len(sizes) >= 3 and sum(sizes) == 7, sizes  # measured [4, 2, 1]: the short rows share a batch
    assert_same(cut, whole)
