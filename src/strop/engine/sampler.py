"""Batched generation with a KV cache and per-token logprobs.

A `SamplerEngine` owns one inference copy of a base model. LoRA adapters are *merged* into its weights when a
sampling client asks for them (W = W0 + s * B @ A), so sampling costs what the base model costs; switching
adapters restores W0 from a kept copy first, so nothing drifts however often we switch.

    engine = SamplerEngine(model_dir)
    [response] = engine.generate([SampleRequest(prompt_tokens=[...], num_samples=4, params=SamplingParams(max_tokens=32))])
    response.sequences[0].tokens, response.sequences[0].logprobs

Requests are expanded to one row per sample; rows that share a prompt share its prefill (the cache is
computed once per distinct prompt and repeated), and a prompt that extends one prefilled before (the next turn
of a tool-use episode) or shares a long prefix with the rest of its batch (a system prompt, tool schemas) runs
only its new tokens (`strop.engine.prefix_cache`). Each row draws from its own seeded generator, so a seeded
request gives the same tokens whatever else is in the batch. Logprobs are the model's own (temperature 1,
no top-k/top-p truncation): what the trainer computes for the same tokens, which makes them usable as the
behaviour policy for importance sampling when sampling at temperature 1.

Llama-style models (SmolLM2, Llama, Mistral) decode through `strop.engine.decode` (fused projections, KV buffers
grown in place as rows lengthen); others through HF's forward, which gives the same tokens, only slower.
The requests and rows are `strop.engine.sample_types`, the choice of each token `strop.engine.token_choice`, and
JSON-schema grammars `strop.engine.grammar`.
"""

from __future__ import annotations

import inspect
import random
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM
from transformers.cache_utils import DynamicCache
from transformers.utils import logging as hf_logging

from strop.engine import unmerged
from strop.engine.decode import SUPPORTED, LlamaDecoder
from strop.engine.grammar import GRAMMAR_CACHE_SIZE, Grammars, resume  # noqa: F401  (the cache size: re-exported)
from strop.engine.malloc import keep_freed_memory
from strop.engine.prefill import joined, prefill_parts
from strop.engine.prefix_groups import batch_order, common_prefix, prefix_groups  # noqa: F401  (re-exported)
from strop.engine.prefix_cache import MIN_REUSE, PrefixCache, default_budget
from strop.engine.resources import available_bytes
from strop.engine.sample_types import DEFAULT_MAX_TOKENS, AdapterWeights, SampleRequest, row_seed
from strop.engine.sample_types import Row as _Row
from strop.engine.token_choice import CDF_BLOCK, inverse_cdf, pick  # noqa: F401  (the draw's parts: re-exported)
from strop.types import SampledSequence, SampleResponse

keep_freed_memory()

# a decode batch's keys and values at their final length may take this share of the memory available when it
# starts. 64 finance-sql rows of ~2,000 positions (SmolLM2, float32: 5.9 GB a copy) were once killed for memory on
# a 24 GiB machine; at a sixth, 100 such episodes peaked at 20.5 GB, so a twelfth. The rows' cache is now copied
# from the prompts' a layer at a time, each layer freed once copied (`DecodeState`), which removed one copy; but a
# quarter was killed for memory in a GRPO run of 8 x 8 finance-sql episodes (the process at 24.3 GB in its third
# step's sampling): the prefill's activations grow with the batch too, and the memory this process freed and keeps
# counts as available without being one block. So a twelfth still
KV_SHARE = 1 / 12
LOGIT_SPAN_TOKENS = 1024  # rows x positions projected onto the vocabulary at once when scoring (200 MB for SmolLM2)


def cache_keyword(model) -> str:
    """The forward keyword for a KV cache: transformers 5 renamed past_key_values to cache."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class SamplerEngine:
    # a json_schema sample can be continued from its own output (SampleRequest.resumed)
    continues_grammar = True
    # a sample can be continued with its own random generator (SampleRequest.generators)
    continues_samples = True
    alive = True          # it lives in this process: it cannot die apart from it

    def __init__(self, model_dir: str | Path, tokenizer=None, dtype: torch.dtype = torch.float32, max_batch: int = 64,
                 fast_decode: bool = True, prefix_cache_bytes: int | None = None, device: str = "cpu"):
        """`device`: where the model computes ("cpu", or "cuda[:N]"); choosing each token (seeded generators,
        grammars, stop strings) stays on the CPU, so a seed draws the same tokens wherever the model ran, as far
        as the two devices' logits agree."""
        hf_logging.disable_progress_bar()
        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(self.device).eval()
        self.model.requires_grad_(False)
        # Llama-style models decode through strop's own step (see engine.decode); others through HF's forward
        self._decoder = LlamaDecoder.for_model(self.model) if fast_decode else None
        # transformers 5 renamed past_key_values to cache; speak whichever this version understands
        self._cache_kw = cache_keyword(self.model)
        self.tokenizer = tokenizer
        self.dtype = dtype
        self.max_batch = max_batch
        self._modules = dict(self.model.named_modules())
        self._base_weights: dict[str, torch.Tensor] = {}
        self._active: AdapterWeights | None = None
        self._unmerged: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # below float32: module -> (A, s * B)
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))
        self._grammars = Grammars()
        budget = default_budget() if prefix_cache_bytes is None else prefix_cache_bytes
        self.prefix_cache = PrefixCache(budget) if budget > 0 else None
        cfg = self.model.config
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.kv_bytes_per_token = 2 * cfg.num_hidden_layers * kv_heads * head_dim * torch.finfo(dtype).bits // 8
        self.facts: dict = {}  # the client records which engine samples; this one adds nothing

    def close(self) -> None:
        """Drop the prefix cache's keys and values; the weights go with the last reference to the engine."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    # ---- adapters -------------------------------------------------------------------------------------
    def activate(self, adapter: AdapterWeights | None) -> None:
        """Make the engine compute base + adapter (or the base alone for None).

        In float32 the adapter is merged into the weights. In a lower precision it is not: merging rounds
        W0 + s * B @ A to the weights' dtype, and W0 is already on that grid, so every element of the delta under
        half a bf16 step (most of them, after a few RL steps) vanished: measured, one bf16-trained adapter scored
        113/200 through merged bf16 weights and 141/200 in float32. There each adapted projection adds
        s * (x @ A^T) @ B^T itself, A and B in the compute dtype (`lora_linear.unmerged`)."""
        if adapter is self._active:
            return
        if self.prefix_cache is not None:
            self.prefix_cache.clear()  # its keys and values were computed under the old weights
        if self.dtype != torch.float32:
            self._set_unmerged(adapter)
            self._active = adapter
            return
        with torch.no_grad():
            for name, base in self._base_weights.items():
                self._modules[name].weight.copy_(base)
            if adapter is not None:
                for name in adapter.deltas:
                    if name not in self._modules:
                        raise KeyError(f"adapter targets module {name!r}, which the base model does not have")
                    weight = self._modules[name].weight
                    if name not in self._base_weights:
                        self._base_weights[name] = weight.detach().clone()
                    merged = self._base_weights[name].float() + adapter.delta(name).to(weight.device)
                    weight.copy_(merged.to(weight.dtype))
        self._active = adapter

    def _set_unmerged(self, adapter: AdapterWeights | None) -> None:
        for name in list(self._unmerged):
            unmerged.remove(self._modules[name])
        self._unmerged = {}
        if self._decoder is not None:
            self._decoder.set_lora({})
        if adapter is None:
            return
        for name in adapter.deltas:
            if name not in self._modules:
                raise KeyError(f"adapter targets module {name!r}, which the base model does not have")
        for name, (lora_a, lora_b) in adapter.deltas.items():
            scaled_b = (lora_b.float() * adapter.scaling).to(self.device, self.dtype)
            factors = (lora_a.to(self.device, self.dtype), scaled_b)
            unmerged.install(self._modules[name], *factors)
            self._unmerged[name] = factors
        if self._decoder is not None:
            self._decoder.set_lora(self._unmerged)

    # ---- generation -----------------------------------------------------------------------------------
    def generate(self, requests: list[SampleRequest]) -> list[SampleResponse]:
        rows = []
        for index, request in enumerate(requests):
            rows.extend(self._rows_for(index, request))
        # prompts that share a prefix (`strop.engine.prefix_groups`): kept once for all their rows of a batch
        shared = prefix_groups([r.prompt_tokens for r in requests], [r.num_samples for r in requests]) \
            if self._decoder is not None else []
        prefix_of = {i: (g, length) for g, (length, members) in enumerate(shared) for i in members}
        place = batch_order([len(r.prompt_tokens) for r in requests], shared)
        for batch in self._batches(sorted(rows, key=lambda row: place[row.prompt_index]), requests, prefix_of):
            self._generate_batch(batch, [requests[r.prompt_index].prompt_tokens for r in batch],
                                 [prefix_of.get(r.prompt_index) for r in batch])
        responses: list[list[SampledSequence]] = [[] for _ in requests]
        for row in rows:
            responses[row.prompt_index].append(SampledSequence(stop_reason=row.stop_reason, tokens=row.tokens, logprobs=row.logprobs))
        return [SampleResponse(sequences=seqs) for seqs in responses]

    def _batches(self, rows: list[_Row], requests: list[SampleRequest], prefix_of: dict[int, tuple[int, int]]):
        """Runs of at most max_batch rows (in order) whose keys and values fit KV_SHARE of the memory available now
        (at least one row a batch): each shared prefix once (`prefix_of`: request -> (group, length)), and every
        row at the batch's longest final length past its own prefix."""
        budget = available_bytes() * KV_SHARE / self.kv_bytes_per_token  # positions
        batch, groups, longest = [], set(), 0
        for row in rows:
            group, shared = prefix_of.get(row.prompt_index, (-1, 0))
            length = len(requests[row.prompt_index].prompt_tokens) - shared + row.max_tokens
            wider = max(longest, length)
            prefixes = sum(n for _, n in groups | {(group, shared)})
            if batch and (len(batch) == self.max_batch or (len(batch) + 1) * wider + prefixes > budget):
                yield batch
                batch, groups, wider = [], set(), length
            batch.append(row)
            groups.add((group, shared))
            longest = wider
        if batch:
            yield batch

    def _rows_for(self, index: int, request: SampleRequest) -> list[_Row]:
        params = request.params
        base_seed = params.seed if params.seed is not None else random.SystemRandom().randrange(2**62)
        stop_ids, stop_strings = self._split_stops(params.stop)
        rows = []
        if request.generators is not None and len(request.generators) != request.num_samples:
            raise ValueError(f"{len(request.generators)} generators for {request.num_samples} samples")
        for i in range(request.num_samples):
            generator = request.generators[i] if request.generators is not None else \
                torch.Generator().manual_seed(row_seed(base_seed, i))
            matcher = None
            if params.json_schema:
                matcher = self._grammars.matcher(params.json_schema, self.tokenizer, self.model.config.vocab_size,
                                                 self.eos_ids)
                resume(matcher, request.prompt_tokens[len(request.prompt_tokens) - request.resumed:])
            rows.append(_Row(prompt_index=index, generator=generator, params=params,
                             max_tokens=params.max_tokens or DEFAULT_MAX_TOKENS,
                             stop_ids=stop_ids, stop_strings=stop_strings, matcher=matcher))
        return rows

    def _split_stops(self, stop) -> tuple[frozenset[int], tuple[str, ...]]:
        ids, strings = set(self.eos_ids), []
        for item in stop or ():
            if isinstance(item, str):
                if self.tokenizer is None:
                    raise ValueError("stop strings need a tokenizer; give the sampler one or stop on token ids")
                strings.append(item)
            else:
                ids.add(int(item))
        return frozenset(ids), tuple(strings)

    @torch.inference_mode()
    def _generate_batch(self, rows: list[_Row], prompts: list[list[int]],
                        prefixes: list[tuple[int, int] | None] | None = None) -> None:
        """`prefixes[b]`: (group, length) of the prefix row b's prompt shares with other rows', or None."""
        # prefill each distinct prompt once, then repeat its cache for every row that samples from it
        distinct: dict[tuple[int, ...], int] = {}
        row_to_prompt = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
        groups: dict[int, tuple[int, set[int]]] = {}
        for prompt, prefix in zip(row_to_prompt, prefixes or []):
            if prefix is not None and all(prompt not in members for _, members in groups.values()):  # one group
                groups.setdefault(prefix[0], (prefix[1], set()))[1].add(prompt)
        logits_P_V, cache, mask = self._prefill(list(distinct))
        select = torch.tensor(row_to_prompt, dtype=torch.long, device=self.device)
        logits_B_V = logits_P_V[select]
        mask = mask[select]
        next_pos_B = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=self.device)
        state = None
        if self._decoder is not None:
            # the rows' keys and values go straight from the prompts' cache into the decoder's buffers, a layer at a
            # time, each layer of the cache freed once copied: never a second cache of every row
            state = self._decoder.start(cache, mask, max(r.max_tokens for r in rows), rows_of=select,
                                        prefixes=[(length, sorted(members)) for length, members in groups.values()])
            del cache
        else:
            cache.batch_select_indices(select)

        live = list(range(len(rows)))  # which rows the batch dimension holds, in order
        while True:
            tokens_B, logprobs_B = self._pick(logits_B_V.cpu(), [rows[i] for i in live])  # no copy on a CPU
            tokens_B = tokens_B.to(self.device)
            keep = []
            for b, i in enumerate(live):
                row = rows[i]
                token = int(tokens_B[b])
                row.tokens.append(token)
                row.logprobs.append(float(logprobs_B[b]))
                if row.matcher is not None and not row.matcher.is_terminated():
                    row.matcher.accept_token(token)
                if token in row.stop_ids or self._hit_stop_string(row) or (row.matcher is not None and row.matcher.is_terminated()):
                    row.stop_reason = "stop"
                elif len(row.tokens) >= row.max_tokens:
                    row.stop_reason = "length"
                else:
                    keep.append(b)
            if not keep:
                return
            if len(keep) < len(live):
                keep_t = torch.tensor(keep, dtype=torch.long, device=self.device)
                if state is not None:
                    state.select(keep_t)
                else:
                    cache.batch_select_indices(keep_t)
                tokens_B, mask, next_pos_B = tokens_B[keep_t], mask[keep_t], next_pos_B[keep_t]
                live = [live[b] for b in keep]
            if state is not None:
                logits_B_V = state.step(tokens_B, next_pos_B)
            else:
                mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
                out = self.model(input_ids=tokens_B[:, None], attention_mask=mask, position_ids=next_pos_B[:, None],
                                 use_cache=True, **{self._cache_kw: cache})
                logits_B_V = out.logits[:, -1, :].float()
            next_pos_B = next_pos_B + 1

    def _prefill(self, unique: list[tuple[int, ...]]) -> tuple[torch.Tensor, DynamicCache, torch.Tensor]:
        """Run the distinct prompts into a fresh cache; return the last position's logits [P, V] (float32), the
        cache and its attention mask [P, C + N]. Where the prefix cache holds a prompt's first n tokens, their keys
        and values are copied in and only the rest is run; every prompt is then added to the prefix cache.

        Rests of different lengths (a tool-use turn's reply and tool answer: 30-300 tokens) run in separate
        forwards, each padded only to its own longest (`strop.engine.prefill`; 32 such prompts: 0.5x in 4 parts)."""
        hits: list[tuple[tuple[int, ...] | None, int]] = [(None, 0)] * len(unique)
        if self.prefix_cache is not None:
            if len(unique) > 1:
                self._cache_shared_prefix(unique)
            hits = [self.prefix_cache.longest(p) for p in unique]
        parts = prefill_parts([len(p) - n for p, (_, n) in zip(unique, hits)])
        runs = [self._prefill_run([unique[i] for i in part], [hits[i] for i in part]) for part in parts]
        if self.prefix_cache is not None:  # after every part ran: a later part may read an entry this replaces
            for part, (_, cache, mask) in zip(parts, runs):
                valid = mask.bool()
                for j, i in enumerate(part):
                    if len(unique[i]) > MIN_REUSE:
                        layers = [(layer.keys[j][:, valid[j]], layer.values[j][:, valid[j]]) for layer in cache.layers]
                        self.prefix_cache.add(unique[i], layers, replaces=hits[i][0])
        return runs[0] if parts == [list(range(len(unique)))] else joined(parts, runs)

    def _prefill_run(self, prompts: list[tuple[int, ...]], hits) -> tuple[torch.Tensor, DynamicCache, torch.Tensor]:
        """One forward over `prompts`: each hit's n cached positions right-aligned in the first C slots (the gap
        before them masked), the rest run left-padded in the last N."""
        cached = max(n for _, n in hits)
        rests = [p[n:] for p, (_, n) in zip(prompts, hits)]
        width = max(len(r) for r in rests)
        input_ids = torch.zeros((len(prompts), width), dtype=torch.long)
        mask = torch.zeros((len(prompts), cached + width), dtype=torch.long)
        positions = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, (rest, (_, n)) in enumerate(zip(rests, hits)):
            input_ids[i, width - len(rest):] = torch.tensor(rest, dtype=torch.long)
            positions[i, width - len(rest):] = torch.arange(n, n + len(rest))
            mask[i, cached - n:cached] = 1
            mask[i, cached + width - len(rest):] = 1
        input_ids, mask, positions = (t.to(self.device) for t in (input_ids, mask, positions))
        cache = DynamicCache()
        if cached:
            self._fill_cache(cache, hits, cached)
        if self._decoder is not None:
            logits_P_V = self._decoder.prefill(input_ids, mask, positions, cache, self._cache_kw)
        else:
            logits_P_V = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                                    logits_to_keep=1, **{self._cache_kw: cache}).logits[:, -1, :].float()
        return logits_P_V, cache, mask

    def _fill_cache(self, cache: DynamicCache, hits, cached: int) -> None:
        """Each layer's keys and values [P, kv_heads, cached, head_dim]: a hit's n positions in its last n slots."""
        reference = self.prefix_cache.layers(next(key for key, n in hits if n))
        for index, (k0, _) in enumerate(reference):
            keys = k0.new_zeros((len(hits), k0.shape[0], cached, k0.shape[2]))
            values = torch.zeros_like(keys)
            for i, (key, n) in enumerate(hits):
                if n:
                    k, v = self.prefix_cache.layers(key)[index]
                    keys[i, :, cached - n:] = k[:, :n]
                    values[i, :, cached - n:] = v[:, :n]
            cache.update(keys, values, index)

    def _cache_shared_prefix(self, unique: list[tuple[int, ...]]) -> None:
        """Prefill the prefix every prompt of the batch shares (a system prompt, tool schemas) once, alone, into
        the prefix cache, unless the cache already holds most of it: then each prompt runs only its own rest."""
        first = torch.tensor(unique[0], dtype=torch.long)
        shared = min(len(p) for p in unique)
        for prompt in unique[1:]:
            differ = (torch.tensor(prompt[:shared], dtype=torch.long) != first[:shared]).nonzero()
            shared = int(differ[0]) if len(differ) else shared
            if shared <= MIN_REUSE:
                return
        if shared >= min(len(p) for p in unique):  # a prompt that is the prefix: it runs as itself
            shared -= 1
        if shared <= MIN_REUSE:
            return
        _, have = self.prefix_cache.longest(unique[0][:shared + 1])
        if have < shared - MIN_REUSE:
            self._prefill([unique[0][:shared]])

    def _mask_to_grammar(self, logits_B_V: torch.Tensor, b: int, matcher) -> None:
        self._grammars.mask(logits_B_V, b, matcher, self.model.config.vocab_size)

    def _hit_stop_string(self, row: _Row) -> bool:
        if not row.stop_strings:
            return False
        longest = max(len(s) for s in row.stop_strings)
        # a token decodes to at least one character, so this many trailing tokens hold any stop string
        tail = self.tokenizer.decode(row.tokens[-(longest + 2):])
        return any(s in tail for s in row.stop_strings)

    def _pick(self, logits_B_V: torch.Tensor, rows: list[_Row]) -> tuple[torch.Tensor, torch.Tensor]:
        """Choose each row's next token under its own sampling params; return tokens and model logprobs
        (`strop.engine.token_choice.pick`)."""
        return pick(logits_B_V, rows, self._mask_to_grammar)

    # ---- scoring --------------------------------------------------------------------------------------
    @torch.inference_mode()
    def prompt_logprobs(self, sequences: list[list[int]], max_batch_tokens: int = 8192) -> list[list[float | None]]:
        """Each token's logprob given the tokens before it (None for the first), for several sequences, run in
        right-padded batches of similar length."""
        results: list[list[float | None]] = [[] for _ in sequences]
        for batch, ids, spans in self._teacher_forced(sequences, max_batch_tokens):
            lp = torch.cat([logits.gather(-1, ids[:, start + 1:start + 1 + logits.shape[1], None])[..., 0]
                            - torch.logsumexp(logits, -1) for start, logits in spans], dim=1)
            for b, i in enumerate(batch):
                results[i] = [None] + lp[b, :len(sequences[i]) - 1].tolist()
        return results

    @torch.inference_mode()
    def prompt_topk(self, sequences: list[list[int]], k: int,
                    max_batch_tokens: int = 8192) -> list[list[list[tuple[int, float]] | None]]:
        """The `k` likeliest tokens and their logprobs at each position of each sequence, given the tokens before
        it (None for the first position): what a teacher's distribution over a student's text looks like."""
        results: list[list] = [[] for _ in sequences]
        for batch, _, spans in self._teacher_forced(sequences, max_batch_tokens):
            picked = [(logits - torch.logsumexp(logits, -1, keepdim=True)).topk(min(k, logits.shape[-1]), -1)
                      for _, logits in spans]
            values, tokens = torch.cat([v for v, _ in picked], dim=1), torch.cat([t for _, t in picked], dim=1)
            for b, i in enumerate(batch):
                n = len(sequences[i]) - 1
                results[i] = [None] + [list(zip(t, v)) for t, v in zip(tokens[b, :n].tolist(), values[b, :n].tolist())]
        return results

    def _teacher_forced(self, sequences: list[list[int]], max_batch_tokens: int):
        """(indices into `sequences`, token ids, and the batch's `_logit_spans`) per right-padded batch of similar
        lengths."""
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        start = 0
        while start < len(order):
            width, end = len(sequences[order[start]]), start
            while end < len(order) and len(sequences[order[end]]) * (end - start + 1) <= max(max_batch_tokens, width):
                width = len(sequences[order[end]])
                end += 1
            batch = order[start:end]
            ids = torch.zeros((len(batch), width), dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for b, i in enumerate(batch):
                ids[b, :len(sequences[i])] = torch.tensor(sequences[i], dtype=torch.long)
                mask[b, :len(sequences[i])] = 1
            ids, mask = ids.to(self.device), mask.to(self.device)
            yield batch, ids, self._logit_spans(ids, mask)
            start = end

    def _logit_spans(self, ids_B_T, mask_B_T):
        """(first position, float32 logits [B, span, V] predicting the token after each of its positions) over
        every position but the last, LOGIT_SPAN_TOKENS rows x positions at a time: a batch of 8,192 tokens never
        holds its B x T x V logits at once (SmolLM2's vocabulary: 1.6 GB in float32, and as much again for their
        logsumexp; beside a run's other engines, a GRPO step's KL to its start model reached the OOM killer).
        A model whose head is not a plain projection of the last hidden state (not a `decode.SUPPORTED` type)
        runs whole."""
        inner, head = getattr(self.model, "model", None), getattr(self.model, "lm_head", None)
        if inner is None or head is None or getattr(self.model.config, "model_type", None) not in SUPPORTED:
            yield 0, self.model(input_ids=ids_B_T, attention_mask=mask_B_T).logits[:, :-1].float()
            return
        hidden_B_T_H = inner(input_ids=ids_B_T, attention_mask=mask_B_T).last_hidden_state[:, :-1]
        span = max(1, LOGIT_SPAN_TOKENS // ids_B_T.shape[0])
        for start in range(0, max(1, hidden_B_T_H.shape[1]), span):  # one span even for one-token sequences
            yield start, head(hidden_B_T_H[:, start:start + span]).float()
