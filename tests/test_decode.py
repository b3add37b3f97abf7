"""strop's own decode step for Llama-style models against HF's forward, and the sampler's token draws."""

import math

import pytest
import torch

from strop.engine import prefill as prefill_module
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


def record_prefixes(monkeypatch):
    """[(prefix lengths, own positions of each row's buffers)] of every decode state started from now on."""
    from strop.engine.decode import DecodeState
    seen = []
    original = DecodeState.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        seen.append(([p.length for p in self.prefixes], [p.keys[0].shape[2] for p in self.prefixes], self.length))
    monkeypatch.setattr(DecodeState, "__init__", init)
    return seen


@pytest.mark.parametrize("grow", [128, 3], ids=["one-buffer", "buffers-grow"])
def test_a_prefix_every_row_shares_is_kept_once_with_hf_forwards_numbers(engines, monkeypatch, grow):
    """The decode state keeps the batch's common prefix once and each row's own positions beside it (left-padded
    whatever the prompt cache's layout); tokens and logprobs are HF forward's, as rows leave and buffers grow."""
    from strop.engine.decode import DecodeState
    from strop.engine.prefix_groups import MIN_SHARED
    monkeypatch.setattr(DecodeState, "GROW", grow)
    fast, plain, tok = engines
    requests = shared_prefix_requests(tok)
    shared = sampler_module.common_prefix([r.prompt_tokens for r in requests])
    assert shared >= MIN_SHARED
    seen = record_prefixes(monkeypatch)
    for _ in range(2):  # the second time the prompt cache holds the prefix: another layout of the prompts' slots
        assert_same(run(fast, requests), run(plain, requests))
    longest_own = max(len(r.prompt_tokens) for r in requests) - shared
    assert seen == [([shared], [shared], longest_own)] * 2


def test_one_prompts_samples_keep_the_whole_prompt_once(engines):
    """Samples of one prompt share all of it: the rows' buffers start empty and hold only what they generate."""
    fast, plain, tok = engines
    prompt = tok.encode("You are a careful analyst. Use the tools to look at the tables before you answer. " * 2)
    requests = [SampleRequest(prompt_tokens=prompt, num_samples=4, params=SamplingParams(max_tokens=6, seed=3))]
    assert sampler_module.prefix_groups([prompt], [4]) == [(len(prompt), [0])]
    with torch.inference_mode():
        _, cache, mask = fast._prefill([tuple(prompt)])
    state = fast._decoder.start(cache, mask[[0, 0, 0, 0]], 6, rows_of=torch.tensor([0, 0, 0, 0]),
                                prefixes=[(len(prompt), [0])])
    assert state.length == 0 and state.prefixes[0].keys[0].shape[2] == len(prompt)
    assert_same(run(fast, requests), run(plain, requests))


def test_prefix_groups_keep_what_groups_of_prompts_share():
    """Hand-worked: every prompt starts with a 40-token system prompt; three turns of episodes branched at one
    80-token state share it; one prompt sampled 4 times shares all of itself; the rest share the system prompt."""
    from strop.engine.prefix_groups import prefix_groups
    system = list(range(1000, 1040))
    branch = system + list(range(2000, 2040))
    prompts = [branch + [7, 1, 2], system + [5, 5], branch + [8, 1], system + list(range(3000, 3060)),
               system + [6] * 5, branch + [9] * 30]
    rows = [1, 1, 1, 4, 1, 1]
    assert prefix_groups(prompts, rows) == [(80, [0, 2, 5]), (100, [3]), (40, [1, 4])]
    # one row each: the prompt sampled once shares nothing beyond the system prompt
    assert prefix_groups(prompts) == [(80, [0, 2, 5]), (40, [1, 3, 4])]
    # a prompt joins a group only where that saves no fewer positions than the two apart: 8 rows of a 1,000-token
    # prompt and one row sharing 100 of its tokens stay apart ((1 + 8 - 1) x 100 < 7 x 1,000; the 100 are what
    # every prompt shares), one sharing 900 joins (8 x 900 >= 7 x 1,000)
    long = list(range(1000))
    assert prefix_groups([long, long[:100] + [1] * 50], [8, 1]) == [(1000, [0]), (100, [1])]
    assert prefix_groups([long, long[:900] + [1] * 50, [5] * 40], [8, 1, 1]) == [(900, [0, 1])]
    # nothing long enough to share, and no prompts
    assert prefix_groups([[1] * 20, [1] * 19 + [2]], [3, 3]) == []
    assert prefix_groups([]) == []


def branched_requests(tok):
    """Two GRPO-style groups, each branched at its own long state (the later turns of its episodes: different
    prompts after the state), one group's branch turn sampled four times, and two prompts sharing only the system
    text; greedy and sampled rows that stop at different steps."""
    system = "You are a careful analyst. Use the tools to look at the tables before you answer. " * 2
    state_a = system + "Question: what was the revenue of Acme in 2023? Tables: income, balance, cash flows. " * 2
    state_b = system + "Question: how did the margin of Brill change from 2021 to 2022? Tables: income, notes. " * 2
    texts = [(state_a + "SELECT revenue FROM income", 1), (state_a + "SELECT * FROM balance WHERE year = 2023", 1),
             (state_b, 4), (state_a + "Hi", 1), (system + "What is 2 + 3?", 1), (system + "Hello there", 2)]
    params = [SamplingParams(max_tokens=9, temperature=0, stop=[]), SamplingParams(max_tokens=14, seed=5, stop=[]),
              SamplingParams(max_tokens=5, seed=9, top_p=0.9, top_k=20, stop=[])]
    return [SampleRequest(prompt_tokens=tok.encode(t), num_samples=n, params=params[i % 3])
            for i, (t, n) in enumerate(texts)]


@pytest.mark.parametrize("fused", [True, False], ids=["cpu-kernel", "matmul"])
def test_groups_sharing_their_own_prefixes_decode_with_hf_forwards_numbers(engines, monkeypatch, fused):
    """Several groups in one batch, each prefix kept once (both ways of attending to it: torch's CPU kernel,
    and the matmuls other devices run); tokens and logprobs are HF forward's as rows leave and buffers grow."""
    from strop.engine import decode, prefix_groups
    monkeypatch.setattr(decode.DecodeState, "GROW", 4)
    if not fused:
        monkeypatch.setattr(decode, "_CPU_ATTENTION", None)
    fast, plain, tok = engines
    requests = branched_requests(tok)
    seen = record_prefixes(monkeypatch)
    assert_same(run(fast, requests), run(plain, requests))
    [(lengths, kept, own)] = seen
    assert len(lengths) == 3 and lengths == kept  # two branched groups and the rest on the system prompt
    shared = sampler_module.common_prefix([r.prompt_tokens for r in requests])
    assert min(lengths) == shared and max(lengths) > shared + prefix_groups.MIN_SHARED
    assert own < max(len(r.prompt_tokens) for r in requests) - shared


def test_bfloat16_decode_with_shared_prefixes_matches_each_row_keeping_its_own(tiny_model_dir):
    """In bfloat16, teacher-forced through the same tokens, a state keeping the groups' prefixes once gives the
    logits of one keeping every row's whole prompt (up to bf16 rounding)."""
    tok = load_tokenizer(str(tiny_model_dir))
    engine = SamplerEngine(tiny_model_dir, tokenizer=tok, dtype=torch.bfloat16, prefix_cache_bytes=0)
    requests = branched_requests(tok)
    prompts = [tuple(r.prompt_tokens) for r in requests]
    groups = sampler_module.prefix_groups([list(p) for p in prompts])
    assert len(groups) >= 2
    positions = torch.tensor([len(p) for p in prompts])
    tokens = torch.randint(0, engine.model.config.vocab_size, (6, len(prompts)), generator=torch.Generator().manual_seed(1))
    logits = {}
    with torch.inference_mode():
        for name, prefixes in (("shared", groups), ("per-row", [])):
            _, cache, mask = engine._prefill(prompts)
            state = engine._decoder.start(cache, mask, 8, prefixes=prefixes)
            steps = [state.step(tokens[i], positions + i) for i in range(4)]
            state.select(torch.tensor([0, 2, 3, 5]))  # rows leave: a group keeps the rest of its rows
            steps += [state.step(tokens[i, [0, 2, 3, 5]], positions[[0, 2, 3, 5]] + i) for i in range(4, 6)]
            logits[name] = torch.cat([s.log_softmax(-1) for s in steps])
    gap = (logits["shared"] - logits["per-row"]).abs().max().item()
    assert gap < 0.1, gap


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
                        lambda rows, *rest: (sizes.append(len(rows)), original(rows, *rest)))
    cut = run(fast, requests)
    assert len(sizes) >= 3 and sum(sizes) == 7, sizes  # measured [4, 2, 1]: the short rows share a batch
    assert_same(cut, whole)


def test_prefill_parts_pad_each_part_to_its_own_longest_rest():
    """Hand-worked: by rest length, a part closes where padding it to the next rest would run more than 1.25
    times its tokens (10, 11, 12 | 95, 100 | 300)."""
    from strop.engine.prefill import prefill_parts
    assert prefill_parts([100, 10, 12, 300, 11, 95]) == [[1, 2, 4], [0, 5], [3]]  # a part's indices ascending
    assert prefill_parts([7, 7, 7]) == [[0, 1, 2]] and prefill_parts([5]) == [[0]] and prefill_parts([]) == []


def test_prompts_whose_rests_differ_prefill_in_parts_with_one_forwards_numbers(engines, monkeypatch):
    """Next turns after cached conversations, their new tokens 2 to ~60 long: prefilled in parts (each padded to
    its own longest), they sample the tokens and logprobs of one forward padded to the longest, in both engines.
    The conversations so far differ in length, so the batch's order (by whole prompt) is not the order of what each
    prompt runs: a single part must give each prompt its own row back (it once gave them in the parts' order)."""
    fast, plain, tok = engines
    notes = [12, 0, 8, 2]
    base = [tok.encode("You are a careful analyst. " * 4 + f"Question {i}: what was the revenue?" + " More notes." * n)
            for i, n in enumerate(notes)]
    tails = [" ok", " The table income has columns year, revenue, cost, margin and notes. " * 3, " no",
             " Error: no such column revenues in income"]
    requests = [SampleRequest(prompt_tokens=b + tok.encode(t), num_samples=2,
                              params=SamplingParams(max_tokens=6, seed=i, stop=[])) for i, (b, t) in enumerate(zip(base, tails))]
    parts, rests_seen = [], []
    original = sampler_module.prefill_parts
    monkeypatch.setattr(sampler_module, "prefill_parts",
                        lambda rests: (rests_seen.append(rests), parts.append(original(rests)), parts[-1])[2])

    def runs(slack):
        monkeypatch.setattr(prefill_module, "PREFILL_SLACK", slack)
        outs = []
        for engine in (fast, plain):
            engine.prefix_cache.clear()
            engine.generate([SampleRequest(prompt_tokens=b, num_samples=1, params=SamplingParams(max_tokens=1, stop=[]))
                             for b in base])  # the conversations so far, in the prefix cache
            outs.append(run(engine, requests))
        return outs
    split = runs(1.25)
    assert max(len(p) for p in parts) > 1
    parts.clear()
    whole = runs(float("inf"))
    assert max(len(p) for p in parts) == 1
    assert any(len(r) == 4 and r != sorted(r) for r in rests_seen), rests_seen  # the single part is out of rest order
    for got, want in zip(split, whole):
        assert_same(got, want)
    assert_same(split[0], split[1])
