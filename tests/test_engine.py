"""The Tinker-style primitives on the tiny random model: sampling, logprobs, training steps, saving."""

import json

import pytest
import torch

import strop
from strop import types
from strop.errors import StropError


@pytest.fixture(scope="module")
def service():
    return strop.ServiceClient()


@pytest.fixture()
def training(service, tiny_model_dir):
    return service.create_lora_training_client(base_model=str(tiny_model_dir), rank=4, seed=0)


def prompt_of(tokenizer, text="What is 2 + 3?"):
    return types.ModelInput.from_ints(tokenizer.encode(text))


def test_same_seed_same_tokens_and_counts(training):
    tok = training.get_tokenizer()
    sampler = training.save_weights_and_get_sampling_client()
    params = types.SamplingParams(max_tokens=12, seed=7)
    a = sampler.sample(prompt=prompt_of(tok), num_samples=3, sampling_params=params).result()
    b = sampler.sample(prompt=prompt_of(tok), num_samples=3, sampling_params=params).result()
    assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
    assert len(a.sequences) == 3
    assert len({tuple(s.tokens) for s in a.sequences}) > 1  # the samples of one request differ from each other
    for seq in a.sequences:
        assert len(seq.tokens) == len(seq.logprobs) <= 12
        assert all(lp <= 0 for lp in seq.logprobs)
    c = sampler.sample(prompt=prompt_of(tok), num_samples=3, sampling_params=types.SamplingParams(max_tokens=12, seed=8)).result()
    assert [s.tokens for s in c.sequences] != [s.tokens for s in a.sequences]


def test_seeded_request_is_independent_of_batch_company(training):
    tok = training.get_tokenizer()
    sampler = training.save_weights_and_get_sampling_client()
    params = types.SamplingParams(max_tokens=10, seed=3)
    alone = sampler.sample(prompt=prompt_of(tok), num_samples=2, sampling_params=params).result()
    other = sampler.sample(prompt=prompt_of(tok, "Compute 6 * 7."), num_samples=5,
                           sampling_params=types.SamplingParams(max_tokens=4, seed=1))
    together = sampler.sample(prompt=prompt_of(tok), num_samples=2, sampling_params=params)
    assert [s.tokens for s in together.result().sequences] == [s.tokens for s in alone.sequences]
    assert len(other.result().sequences) == 5


def test_max_tokens_and_stop_reasons(training):
    tok = training.get_tokenizer()
    sampler = training.save_weights_and_get_sampling_client()
    free = sampler.sample(prompt=prompt_of(tok), num_samples=1,
                          sampling_params=types.SamplingParams(max_tokens=6, seed=0, temperature=0)).result().sequences[0]
    assert free.stop_reason == "length" and len(free.tokens) == 6
    # stopping on the third greedy token ends the sequence there, stop token included
    stop_id = free.tokens[2]
    first = free.tokens.index(stop_id)
    stopped = sampler.sample(prompt=prompt_of(tok), num_samples=1, sampling_params=types.SamplingParams(
        max_tokens=6, seed=0, temperature=0, stop=[stop_id])).result().sequences[0]
    assert stopped.stop_reason == "stop" and stopped.tokens == free.tokens[: first + 1]
    # a stop string made of the text of greedy tokens 2..3 stops generation by token 4
    text = tok.decode(free.tokens[2:4])
    by_string = sampler.sample(prompt=prompt_of(tok), num_samples=1, sampling_params=types.SamplingParams(
        max_tokens=6, seed=0, temperature=0, stop=[text])).result().sequences[0]
    assert by_string.stop_reason == "stop" and len(by_string.tokens) <= 4
    assert text in tok.decode(by_string.tokens)


def test_greedy_equals_top_k_one_and_logprobs_match_a_forward_pass(training):
    tok = training.get_tokenizer()
    sampler = training.save_weights_and_get_sampling_client()
    prompt = prompt_of(tok)
    greedy = sampler.sample(prompt=prompt, sampling_params=types.SamplingParams(max_tokens=8, temperature=0)).result()
    top1 = sampler.sample(prompt=prompt, sampling_params=types.SamplingParams(max_tokens=8, top_k=1, seed=5)).result()
    assert greedy.sequences[0].tokens == top1.sequences[0].tokens
    seq = top1.sequences[0]
    full = prompt.append(types.EncodedTextChunk(tokens=seq.tokens))
    lps = sampler.compute_logprobs(full).result()
    assert lps[0] is None
    assert lps[prompt.length:] == pytest.approx(seq.logprobs, abs=1e-4)


def datums_for(prompt, seqs, advantages):
    ob_len = prompt.length - 1
    out = []
    for seq, adv in zip(seqs, advantages):
        mi = prompt.append(types.EncodedTextChunk(tokens=seq.tokens[:-1]))
        out.append(types.Datum(model_input=mi, loss_fn_inputs={
            "target_tokens": types.TensorData.from_torch(torch.tensor([0] * ob_len + seq.tokens)),
            "logprobs": types.TensorData.from_torch(torch.tensor([0.0] * ob_len + seq.logprobs)),
            "advantages": types.TensorData.from_torch(torch.tensor([0.0] * ob_len + [adv] * len(seq.tokens))),
        }))
    return out


def test_training_step_changes_the_adapter_and_the_samples(training):
    tok = training.get_tokenizer()
    prompt = prompt_of(tok)
    sampler = training.save_weights_and_get_sampling_client()
    seqs = sampler.sample(prompt=prompt, num_samples=4, sampling_params=types.SamplingParams(max_tokens=8, seed=1)).result().sequences
    datums = datums_for(prompt, seqs, [1.0, -1.0, 0.5, -0.5])
    out = training.forward_backward(datums, loss_fn="importance_sampling").result()
    # LoRA starts as the identity (B = 0): the trainer's logprobs are the sampler's
    ob_len = prompt.length - 1
    for datum_out, seq in zip(out.loss_fn_outputs, seqs):
        assert datum_out["logprobs"].tolist()[ob_len:] == pytest.approx(seq.logprobs, abs=1e-4)
    assert out.metrics["tokens:sum"] == sum(len(s.tokens) for s in seqs)
    assert abs(out.metrics["kl_sample_train:sum"]) < 1e-3
    before = training.trainer.lora_state_dict()
    step = training.optim_step(types.AdamParams(learning_rate=1e-2, grad_clip_norm=1.0)).result()
    assert step.metrics["grad_norm"] > 0
    after = training.trainer.lora_state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    new_lps = training.forward(datums, loss_fn="importance_sampling").result().loss_fn_outputs[0]["logprobs"].tolist()
    assert new_lps[ob_len:] != pytest.approx(seqs[0].logprobs, abs=1e-6)
    # a new sampling client sees the new weights; the old one keeps the old ones
    new_sampler = training.save_weights_and_get_sampling_client()
    full = prompt.append(types.EncodedTextChunk(tokens=seqs[0].tokens))
    assert new_sampler.compute_logprobs(full).result()[prompt.length:] == pytest.approx(new_lps[ob_len:], abs=1e-4)
    assert sampler.compute_logprobs(full).result()[prompt.length:] == pytest.approx(seqs[0].logprobs, abs=1e-4)


@pytest.mark.parametrize("loss_fn", ["ppo", "cispo", "cross_entropy"])
def test_other_losses_run_and_give_gradients(training, loss_fn):
    tok = training.get_tokenizer()
    prompt = prompt_of(tok)
    seqs = training.save_weights_and_get_sampling_client().sample(
        prompt=prompt, num_samples=2, sampling_params=types.SamplingParams(max_tokens=6, seed=2)).result().sequences
    datums = datums_for(prompt, seqs, [1.0, -1.0])
    if loss_fn == "cross_entropy":
        datums = [types.Datum(model_input=d.model_input, loss_fn_inputs={
            "target_tokens": d.loss_fn_inputs["target_tokens"],
            "weights": torch.tensor([float(a != 0) for a in d.loss_fn_inputs["advantages"].tolist()])}) for d in datums]
    out = training.forward_backward(datums, loss_fn=loss_fn, loss_fn_config={"clip_low_threshold": 0.9,
                                                                              "clip_high_threshold": 1.1}).result()
    grads = [p.grad for p in training.trainer.trainable_parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)
    assert out.loss_fn_output_type == loss_fn


def test_bad_inputs_are_refused_with_the_fix(training):
    tok = training.get_tokenizer()
    datum = types.Datum(model_input=prompt_of(tok), loss_fn_inputs={"target_tokens": [1, 2]})
    with pytest.raises(StropError, match="unknown loss_fn"):
        training.forward_backward([datum], loss_fn="dpo")
    with pytest.raises(StropError, match="missing"):
        training.forward_backward([datum], loss_fn="importance_sampling")
    n = prompt_of(tok).length
    short = types.Datum(model_input=prompt_of(tok), loss_fn_inputs={"target_tokens": [1] * (n - 1), "weights": [1.0] * n})
    with pytest.raises(StropError, match="one value per input position"):
        training.forward_backward([short], loss_fn="cross_entropy")
    with pytest.raises(StropError, match="max_tokens"):
        types.SamplingParams(max_tokens=0)
    with pytest.raises(StropError, match="empty prompt"):
        training.save_weights_and_get_sampling_client().sample(prompt=types.ModelInput.empty())


def test_save_weights_is_a_peft_adapter(training, tmp_path, tiny_model_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    for p in training.trainer.trainable_parameters():  # make the adapter non-trivial
        p.data.normal_(0, 0.05)
    path = training.save_weights(str(tmp_path / "adapter")).result().path
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["r"] == 4
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)), path).eval()
    ids = torch.tensor([training.get_tokenizer().encode("What is 2 + 3?")])
    with torch.no_grad():
        theirs = model(input_ids=ids).logits
        ours = training.trainer.model(input_ids=ids).logits
    assert torch.allclose(theirs, ours, atol=1e-5)
    # and a sampling client built from the directory matches the live adapter
    service = strop.ServiceClient()
    from_disk = service.create_sampling_client(base_model=str(tiny_model_dir), model_path=path)
    live = training.save_weights_and_get_sampling_client()
    mi = types.ModelInput.from_ints(ids[0].tolist())
    assert from_disk.compute_logprobs(mi).result()[1:] == pytest.approx(live.compute_logprobs(mi).result()[1:], abs=1e-4)


def test_state_round_trip_continues_identically(service, tiny_model_dir, tmp_path):
    def client():
        return service.create_lora_training_client(base_model=str(tiny_model_dir), rank=4, seed=1)

    def one_step(c):
        ids = c.get_tokenizer().encode("Compute 6 * 7. The answer is 42")
        d = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})
        c.forward_backward([d], loss_fn="cross_entropy").result()
        c.optim_step(types.AdamParams(learning_rate=1e-2, weight_decay=0.01)).result()

    a = client()
    one_step(a)
    path = a.save_state(str(tmp_path / "state")).result().path
    one_step(a)
    b = client()
    b.load_state(path).result()
    assert b.trainer.steps == 1
    one_step(b)
    sa, sb = a.trainer.lora_state_dict(), b.trainer.lora_state_dict()
    assert all(torch.allclose(sa[k], sb[k], atol=1e-6) for k in sa)  # Adam moments came back too


def test_batched_logprobs_match_one_at_a_time(training):
    tok = training.get_tokenizer()
    sampler = training.save_weights_and_get_sampling_client()
    inputs = [prompt_of(tok, text) for text in ("What is 2 + 3?", "Compute 6 * 7. Then add four to it, please.", "Hi")]
    together = sampler.compute_logprobs_many(inputs).result()
    for mi, lps in zip(inputs, together):
        alone = sampler.compute_logprobs(mi).result()
        assert len(lps) == mi.length and lps[0] is None
        assert lps[1:] == pytest.approx(alone[1:], abs=1e-5)


JUDGE_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["score", "reasoning"],
                "properties": {"score": {"type": "integer", "minimum": 0, "maximum": 5},
                               "reasoning": {"type": "string", "pattern": "[a-zA-Z0-9 ,.]{0,40}"}}}


def test_json_schema_holds_a_random_model_to_valid_json(training):
    tok = training.get_tokenizer()
    sampler = training.save_weights_and_get_sampling_client()
    free = types.SamplingParams(max_tokens=120, seed=5, temperature=1.0)
    held = types.SamplingParams(max_tokens=120, seed=5, temperature=1.0, json_schema=JUDGE_SCHEMA)
    unconstrained = sampler.sample(prompt=prompt_of(tok), num_samples=4, sampling_params=free)
    constrained = sampler.sample(prompt=prompt_of(tok), num_samples=4, sampling_params=held)
    for seq in unconstrained.result().sequences:  # the random model on its own never writes this JSON
        with pytest.raises(ValueError):
            json.loads(tok.decode(seq.tokens, skip_special_tokens=True))
    for seq in constrained.result().sequences:
        verdict = json.loads(tok.decode(seq.tokens, skip_special_tokens=True))
        assert set(verdict) == {"score", "reasoning"}
        assert isinstance(verdict["score"], int) and 0 <= verdict["score"] <= 5
        assert seq.stop_reason == "stop" and len(seq.logprobs) == len(seq.tokens)


def test_compiled_schemas_are_kept_in_a_bounded_cache(training):
    from strop.engine import sampler as engine_sampler
    sampler = training.save_weights_and_get_sampling_client()
    tok = training.get_tokenizer()
    for i in range(engine_sampler.GRAMMAR_CACHE_SIZE + 5):  # a server sees schemas from every client
        schema = {"type": "object", "properties": {f"field{i}": {"type": "integer"}}, "required": [f"field{i}"]}
        params = types.SamplingParams(max_tokens=12, seed=i, json_schema=schema)
        sampler.sample(prompt=prompt_of(tok), num_samples=1, sampling_params=params).result()
    cache = sampler._queue.engine._grammars
    assert len(cache) == engine_sampler.GRAMMAR_CACHE_SIZE
    assert any("field36" in key for key in cache) and not any('"field0"' in key for key in cache)  # oldest out


def test_a_schema_that_is_not_one_is_refused(training):
    with pytest.raises(StropError, match="json_schema"):
        types.SamplingParams(json_schema=["not", "a", "schema"])


def grpo_like_datums(prompts, group: int, seed: int = 0):
    """A GRPO group's layout: the prompt untrained (advantage 0), then completion tokens with the advantage."""
    import random
    rng = random.Random(seed)
    datums = []
    for prompt in prompts:
        for _ in range(group):
            toks = prompt + [rng.randrange(100, 400) for _ in range(rng.randrange(3, 10))]
            n, p = len(toks) - 1, len(prompt)
            datums.append(types.Datum(model_input=types.ModelInput.from_ints(toks[:-1]), loss_fn_inputs={
                "target_tokens": types.TensorData.from_torch(torch.tensor([0] * (p - 1) + toks[p:])),
                "logprobs": types.TensorData.from_torch(torch.full((n,), -3.0)),
                "advantages": types.TensorData.from_torch(torch.tensor([0.0] * (p - 1) + [rng.choice([-0.5, 0.5])] * (n - p + 1)))}))
    return datums


def test_shared_prompts_run_once_with_the_same_logprobs_and_gradients(tiny_model_dir, monkeypatch):
    import strop.engine.trainer as trainer_module
    prompts = [list(range(10 + 3 * i, 22 + 5 * i)) for i in range(3)]
    datums = grpo_like_datums(prompts, group=3) + grpo_like_datums([[5] * 9], group=1, seed=1)
    # one row's prompt targets differ from its group's: its prompt positions are scored, not copied
    odd = datums[1].loss_fn_inputs["target_tokens"].to_torch().clone()
    odd[0] = 7
    datums[1].loss_fn_inputs["target_tokens"] = types.TensorData.from_torch(odd)
    shared_runs, copied = [], []
    original = trainer_module._prefix_shared_hidden
    monkeypatch.setattr(trainer_module, "_prefix_shared_hidden", lambda *a: shared_runs.append(1) or original(*a))
    original_copies = trainer_module._repeated_prefix_rows
    monkeypatch.setattr(trainer_module, "_repeated_prefix_rows",
                        lambda *a: copied.append([b for b, _, _ in original_copies(*a)]) or copied[-1] and original_copies(*a))
    results = {}
    for min_prefix in (8, 10**9):  # 10**9: never share
        monkeypatch.setattr(trainer_module, "MIN_SHARED_PREFIX", min_prefix)
        trainer = trainer_module.LoraTrainer(tiny_model_dir, rank=4, seed=0)
        with torch.no_grad():  # lora_B starts at zero; make it not, so lora_A gets gradients as well
            gen = torch.Generator().manual_seed(1)
            for name, p in trainer.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
        out = trainer.forward_backward(datums, "importance_sampling")
        results[min_prefix] = (out, {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None})
    assert shared_runs == [1]  # the first configuration took the shared path, the second did not
    # every group member but the three owners and the row whose prompt targets differ reuses its owner's
    assert len(copied[0]) == 9 - 3 - 1
    (shared, g_shared), (plain, g_plain) = results[8], results[10**9]
    assert shared.metrics["loss:sum"] == pytest.approx(plain.metrics["loss:sum"], rel=1e-5)
    for a, b in zip(shared.loss_fn_outputs, plain.loss_fn_outputs):
        assert torch.allclose(a["logprobs"].to_torch(), b["logprobs"].to_torch(), atol=1e-5)
    assert g_shared.keys() == g_plain.keys() and len(g_plain) > 0
    for name in g_plain:
        assert torch.allclose(g_shared[name], g_plain[name], rtol=1e-4, atol=1e-7), name


def test_prefixes_are_shared_only_when_worth_it():
    from strop.engine.trainer import shared_prefixes

    def plan(rows, first_active):
        width = max(len(r) for r in rows)
        ids, mask, active = (torch.zeros((len(rows), width), dtype=dt) for dt in (torch.long, torch.bool, torch.bool))
        for b, (row, f) in enumerate(zip(rows, first_active)):
            ids[b, :len(row)] = torch.tensor(row)
            mask[b, :len(row)] = True
            active[b, f:len(row)] = True
        return shared_prefixes(ids, mask, active)
    prompt = list(range(1, 13))
    assert plan([prompt + [50, 51], prompt + [60]], [12, 12]) == ([12, 12], [0, 0], [0])
    assert plan([prompt + [50], [9] + prompt[1:] + [60]], [12, 12]) is None  # nothing in common
    assert plan([prompt[:5] + [50], prompt[:5] + [60]], [5, 5]) is None  # too short to pay for a second pass
    assert plan([prompt, prompt], [20, 20]) == ([11, 11], [0, 0], [0])  # untrained rows keep one position


def test_service_client_refuses_a_misspelt_option_by_name_and_takes_tinkers_own():
    with pytest.raises(StropError, match=r"unknown option\(s\) 'dtpye' \(did you mean 'dtype'\?\)"):
        strop.ServiceClient(dtpye="float32")
    with pytest.raises(StropError, match="'frobnicate'; it takes backend, dtype"):
        strop.ServiceClient(frobnicate=1)
    # code written for tinker.ServiceClient runs unchanged
    strop.ServiceClient(api_key="tml-x", base_url="http://127.0.0.1:1", user_metadata={"who": "me"}, project_id="p")


def test_scoring_projects_a_span_of_positions_at_a_time_with_the_whole_forwards_values(tiny_model_dir, monkeypatch):
    """prompt_logprobs and prompt_topk never hold a batch's B x T x V logits: the hidden states are projected a
    span at a time (LOGIT_SPAN_TOKENS rows x positions), and give what the whole forward pass's logits give."""
    from strop.engine import sampler as sampler_module
    from strop.engine.sampler import SamplerEngine
    from strop.tokenizer_utils import get_tokenizer
    engine = SamplerEngine(str(tiny_model_dir), tokenizer=get_tokenizer(str(tiny_model_dir)), dtype=torch.float32)
    assert engine.prompt_logprobs([[5]]) == [[None]] and engine.prompt_topk([[5]], 2) == [[None]]  # nothing to score
    sequences = [list(range(5, 5 + n)) for n in (3, 17, 40)]
    widest = []
    original = engine.model.lm_head.forward
    monkeypatch.setattr(engine.model.lm_head, "forward", lambda h: widest.append(h.shape[0] * h.shape[1]) or original(h))
    monkeypatch.setattr(sampler_module, "LOGIT_SPAN_TOKENS", 16)
    spans = engine.prompt_logprobs(sequences)
    top = engine.prompt_topk(sequences, 3)
    assert widest and max(widest) <= 16 and len(widest) > 2 * len(sequences)
    for seq, lps, topk in zip(sequences, spans, top):
        ids = torch.tensor([seq])
        with torch.no_grad():
            logp = torch.log_softmax(engine.model(input_ids=ids).logits[0, :-1].float(), -1)
        assert lps[0] is None and topk[0] is None and len(lps) == len(topk) == len(seq)
        assert lps[1:] == pytest.approx(logp.gather(-1, ids[0, 1:, None])[:, 0].tolist(), abs=1e-4)
        values, tokens = logp.topk(3, -1)
        assert [[t for t, _ in row] for row in topk[1:]] == tokens.tolist()
        assert [v for row in topk[1:] for _, v in row] == pytest.approx(values.flatten().tolist(), abs=1e-4)
