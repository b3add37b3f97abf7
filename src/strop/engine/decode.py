"""A lean decode step for Llama-style models (SmolLM2, Llama, Mistral): one new token per row, straight matmuls.

HF's forward pays, at every generated token, for things a sampler does not need: the KV cache grows by
concatenation (every layer's keys and values copied each step), the attention mask is rebuilt, K and V are
repeated to the query heads, and every projection is its own small matmul. On a CPU whose decode is
compute-bound at small batch, everything outside the matmuls was 28% of the step. `LlamaDecoder` keeps the
model's own modules and weights and runs the step itself:

- q, k and v are one matmul, and so are gate and up: their weights are made views into one fused buffer, so
  LoRA merging (which writes the modules' weights) updates the fused matmul with no copy;
- keys and values are written in place into buffers that grow GROW positions at a time (not a copy per step);
- RMSNorm, the activation and the rotary embedding are the model's own modules, so the numbers match HF's
  up to float summation order;
- a prefix that several rows' prompts start with is kept once, not once a row: the samples of one prompt share
  all of it, the turns of a GRPO group branched at one state share that state, every prompt of a batch shares
  its system prompt and tool schemas (`strop.engine.prefix_groups` chooses). Each layer's attention reads each group's prefix
  once for all its rows' queries, then each row's own positions, and joins the two by their log-sum-exps. At
  64 finance-sql rows the keys and values, read whole at every token, are most of a decode step's memory
  traffic;
- a key/value head's query heads attend as that many query positions of one head, masked for the left
  padding: no repeated keys and values, one fused attention kernel. (`enable_gqa=True`, which torch's CPU
  kernel runs as a plain matmul of repeated keys, was 5x slower in bfloat16 at 64 rows x 1,600 positions.)

    decoder = LlamaDecoder.for_model(model)          # None for an architecture it does not know
    state = decoder.start(cache, mask_B_T, max_new)  # after HF's prefill into a DynamicCache
    state = decoder.start(cache, mask_B_T, max_new, prefixes=prefix_groups(prompts))  # shared prefixes kept once
    logits_B_V = state.step(tokens_B, positions_B)   # one token per row
    state.select(keep_B)                             # drop finished rows
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


# architectures whose decoder layers are self_attn.{q,k,v,o}_proj without biases, mlp.{gate,up,down}_proj,
# input_layernorm and post_attention_layernorm, with a shared rotary embedding: Llama's layout (Qwen3 adds an
# RMSNorm over each head's queries and keys before the rotary embedding: self_attn.{q,k}_norm)
SUPPORTED = {"llama", "mistral", "qwen3"}
# where an unmerged adapter's factors go in a layer
LORA_MODULES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
                "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}


# torch's CPU attention kernel, which also returns each query's log-sum-exp (the public SDPA drops it): attention
# over a group's shared prefix and over a row's own positions then join exactly
_CPU_ATTENTION = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _fuse(modules: list[torch.nn.Linear]) -> torch.Tensor:
    """One [sum(out), in] buffer holding the modules' weights; each module's weight becomes a view into it."""
    fused = torch.cat([m.weight.detach() for m in modules], dim=0).contiguous()
    start = 0
    for m in modules:
        rows = m.weight.shape[0]
        m.weight = torch.nn.Parameter(fused[start:start + rows], requires_grad=False)
        start += rows
    return fused


class LlamaDecoder:
    def __init__(self, model):
        cfg = model.config
        self.model = model
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.scale = self.head_dim ** -0.5
        inner = model.model
        self.embed, self.norm, self.rotary, self.head = inner.embed_tokens, inner.norm, inner.rotary_emb, model.lm_head
        self.layers = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append({
                "qkv": _fuse([attn.q_proj, attn.k_proj, attn.v_proj]), "o": attn.o_proj,
                "gate_up": _fuse([mlp.gate_proj, mlp.up_proj]), "down": mlp.down_proj, "act": mlp.act_fn,
                "norm1": layer.input_layernorm, "norm2": layer.post_attention_layernorm,
                "intermediate": mlp.gate_proj.weight.shape[0],
                "q_norm": getattr(attn, "q_norm", None), "k_norm": getattr(attn, "k_norm", None),
            })

    @classmethod
    def for_model(cls, model) -> "LlamaDecoder | None":
        """A decoder for `model`, or None when its architecture (or a bias, sliding window...) is not Llama's."""
        cfg = model.config
        if getattr(cfg, "model_type", None) not in SUPPORTED or getattr(cfg, "attention_bias", False) \
                or getattr(cfg, "mlp_bias", False) or getattr(cfg, "sliding_window", None) \
                or any(kind != "full_attention" for kind in getattr(cfg, "layer_types", None) or []):
            return None
        inner = getattr(model, "model", None)
        if inner is None or not hasattr(inner, "rotary_emb") or not hasattr(model, "lm_head"):
            return None
        return cls(model)

    def prefill(self, input_ids_B_T, mask_B_T, positions_B_T, cache, cache_kw: str) -> torch.Tensor:
        """Run the prompts through HF's forward into `cache`; return the last position's logits [B, V] (float32).
        (HF's own head, given logits_to_keep=1, multiplies a strided slice as a batched matmul: ~5x slower here.)"""
        hidden = self.model.model(input_ids=input_ids_B_T, attention_mask=mask_B_T, position_ids=positions_B_T,
                                  use_cache=True, **{cache_kw: cache}).last_hidden_state
        return _linear(hidden[:, -1], self.head.weight).float()

    def set_lora(self, factors: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """An adapter to add beside the fused weights (`strop.engine.unmerged`), by module name; {} for none.

        Projections that read the same input share their adapter's two products: q, k and v's A factors are
        stacked into one [3r, in] matrix and their scaled B factors placed block-diagonally in one [q+k+v, 3r]
        (gate and up likewise), and each term is added into the projection's output in place (addmm). Per layer
        that is 8 small matmuls and no extra additions instead of 14 and 7: at SmolLM2's size in bf16, one
        product per adapted projection made sampling with an adapter 1.55x slower than without."""
        for i, layer in enumerate(self.layers):
            prefix = f"model.layers.{i}."
            lora = {short: factors[prefix + path] for short, path in LORA_MODULES.items() if prefix + path in factors}
            q_width, kv_width, inter = self.heads * self.head_dim, self.kv_heads * self.head_dim, layer["intermediate"]
            layer["lora_qkv"] = _joined([lora.get("q"), lora.get("k"), lora.get("v")], [q_width, kv_width, kv_width])
            layer["lora_gate_up"] = _joined([lora.get("gate"), lora.get("up")], [inter, inter])
            layer["lora_o"], layer["lora_down"] = lora.get("o"), lora.get("down")

    def start(self, cache, mask_B_T: torch.Tensor, max_new: int, rows_of: torch.Tensor | None = None,
              prefixes: list[tuple[int, list[int]]] = ()) -> "DecodeState":
        """The rows' decode state from a prefill's `cache`, which it empties (`DecodeState`); `rows_of[b]`: the
        cache row that row b starts from (several rows sampling one prompt), None: row b; `prefixes`: (length,
        cache rows) whose first `length` tokens are the same, kept once (`strop.engine.prefix_groups`)."""
        return DecodeState(self, cache, mask_B_T, max_new, rows_of, prefixes)


class SharedPrefix:
    """One group's shared first positions, kept once: `keys[i]`/`values[i]` [1, kv_heads, length, head_dim] for
    layer i, and `rows` the batch rows (ascending) whose prompts start with them."""

    def __init__(self, length: int, rows: torch.Tensor):
        self.length, self.rows = length, rows
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []


class DecodeState:
    """The rows being generated: their keys and values in buffers of the final length, and which slots are real.
    With shared prefixes (`SharedPrefix`), each is held once and a row's buffers hold only what follows its own."""

    GROW = 128  # positions added to the buffers at a time: rows that stop early never pay for max_new

    def __init__(self, decoder: LlamaDecoder, cache, mask_B_T: torch.Tensor, max_new: int,
                 rows_of: torch.Tensor | None = None, prefixes: list[tuple[int, list[int]]] = ()):
        """Copies the cache's keys and values into the buffers a layer at a time, dropping each layer of the cache
        once copied, so the two never both hold every layer; `rows_of` repeats the cache's rows for the samples.
        `prefixes`: (length, cache rows) whose first `length` real positions are the same tokens; their keys and
        values are taken once, from the group's first row, and each of the group's rows keeps the rest,
        left-padded (a prompt's slots hold its positions in order)."""
        self.d = decoder
        B, T = mask_B_T.shape
        device = mask_B_T.device
        source_B = rows_of if rows_of is not None else torch.arange(B, device=device)
        valid_B_T = mask_B_T.bool()
        self.prefixes: list[SharedPrefix] = []
        if prefixes:
            group_of = torch.full((int(source_B.max()) + 1,), -1, dtype=torch.long, device=device)
            for g, (_, members) in enumerate(prefixes):
                group_of[[m for m in members if m < len(group_of)]] = g
            group_B = group_of[source_B]
            length_G = torch.tensor([length for length, _ in prefixes] + [0], dtype=torch.long, device=device)
            shared_B = length_G[group_B]  # 0 for a row in no group (index -1: the appended 0)
            for g, (length, _) in enumerate(prefixes):
                rows = (group_B == g).nonzero()[:, 0]
                if len(rows):
                    self.prefixes.append(SharedPrefix(length, rows))
            # row b's own slots, after its first shared_B[b] real ones, right-aligned in `own` columns (padding: 0)
            count_B = valid_B_T.sum(1)
            if bool((count_B < shared_B).any()):
                raise ValueError("a row has fewer positions than the prefix it is said to share")
            rank_B_T = valid_B_T.cumsum(1) - 1  # a real slot's position in its row
            own_B = count_B - shared_B
            own = int(own_B.max())
            column_B_T = rank_B_T - shared_B[:, None] + (own - own_B)[:, None]
            keep_B_T = valid_B_T & (rank_B_T >= shared_B[:, None])
            slot_B_O = torch.zeros((B, own), dtype=torch.long, device=device)
            rows_B_T = torch.arange(B, device=device)[:, None].expand(B, T)
            slot_B_O[rows_B_T[keep_B_T], column_B_T[keep_B_T]] = torch.arange(T, device=device).expand(B, T)[keep_B_T]
            valid_B_T = torch.arange(own, device=device)[None, :] >= (own - own_B)[:, None]
            firsts = [(int(source_B[p.rows[0]]), mask_B_T[p.rows[0]].bool().nonzero()[:p.length, 0])
                      for p in self.prefixes]
            T = own
            if self.prefixes:
                self._place_shared(B, device)
        self.length, self.limit = T, T + max_new
        capacity = min(self.limit, T + self.GROW)
        self.valid_B_L = torch.zeros((B, capacity), dtype=torch.bool, device=device)
        self.valid_B_L[:, :T] = valid_B_T
        self.keys, self.values = [], []
        for layer in cache.layers:
            k = layer.keys.new_empty((B, decoder.kv_heads, capacity, decoder.head_dim))
            v = torch.empty_like(k)
            if prefixes:
                for prefix, (first, slots_S) in zip(self.prefixes, firsts):
                    prefix.keys.append(layer.keys[first][None, :, slots_S].contiguous())
                    prefix.values.append(layer.values[first][None, :, slots_S].contiguous())
                # [B, own, kv, hd] by advanced indexing around the heads' slice, then heads first again
                k[:, :, :T] = layer.keys[source_B[:, None], :, slot_B_O].transpose(1, 2)
                v[:, :, :T] = layer.values[source_B[:, None], :, slot_B_O].transpose(1, 2)
            elif rows_of is None:
                k[:, :, :T] = layer.keys
                v[:, :, :T] = layer.values
            else:
                k[:, :, :T] = layer.keys.index_select(0, rows_of)
                v[:, :, :T] = layer.values.index_select(0, rows_of)
            layer.keys = layer.values = None  # the caller's cache is spent: its memory goes back layer by layer
            self.keys.append(k)
            self.values.append(v)

    def _place_shared(self, B: int, device: torch.device) -> None:
        """`_shared_at[b]`: where row b's results are in the prefixes' outputs laid end to end; for a row in no
        group, one slot past them (a weight of 0)."""
        order = torch.cat([p.rows for p in self.prefixes])
        self._shared_at = torch.full((B,), len(order), dtype=torch.long, device=device)
        self._shared_at[order] = torch.arange(len(order), device=device)

    def _grow(self) -> None:
        old = self.valid_B_L.shape[1]
        if old >= self.limit:
            raise RuntimeError(f"decode buffers hold {old} positions; start() was given too small a max_new")
        new = min(self.limit, old + max(self.GROW, old // 2))
        self.valid_B_L = torch.cat([self.valid_B_L, self.valid_B_L.new_zeros((self.valid_B_L.shape[0], new - old))], 1)
        for buffers in (self.keys, self.values):
            for i, buf in enumerate(buffers):
                grown = buf.new_empty((*buf.shape[:2], new, buf.shape[3]))
                grown[:, :, :self.length] = buf[:, :, :self.length]
                buffers[i] = grown

    def select(self, keep_B: torch.Tensor) -> None:
        """Keep only the rows `keep_B` (their indices, ascending, or a mask); a prefix no kept row reads is freed."""
        B = self.valid_B_L.shape[0]
        if keep_B.dtype == torch.bool:
            keep_B = keep_B.nonzero()[:, 0]
        self.valid_B_L = self.valid_B_L[keep_B]
        self.keys = [k[keep_B] for k in self.keys]
        self.values = [v[keep_B] for v in self.values]
        if self.prefixes:
            moved = torch.full((B,), -1, dtype=torch.long, device=keep_B.device)
            moved[keep_B] = torch.arange(len(keep_B), device=keep_B.device)
            for prefix in self.prefixes:
                prefix.rows = moved[prefix.rows][moved[prefix.rows] >= 0]
            self.prefixes = [p for p in self.prefixes if len(p.rows)]
            if self.prefixes:
                self._place_shared(len(keep_B), keep_B.device)

    def step(self, tokens_B: torch.Tensor, positions_B: torch.Tensor) -> torch.Tensor:
        """Append one token per row at its position; return the next-token logits [B, V] (float32)."""
        d = self.d
        B, t = tokens_B.shape[0], self.length
        if t >= self.valid_B_L.shape[1]:
            self._grow()
        self.valid_B_L[:, t] = True
        n = t + 1
        groups = d.heads // d.kv_heads
        # additive mask [B, 1, 1, n]: 0 where a slot is real, -inf on left padding
        bias = torch.zeros((B, 1, 1, n), dtype=self.keys[0].dtype, device=tokens_B.device)
        bias.masked_fill_(~self.valid_B_L[:, None, None, :n], float("-inf"))
        h_B_1_H = d.embed(tokens_B[:, None])
        cos, sin = d.rotary(h_B_1_H, positions_B[:, None])  # [B, 1, head_dim]
        cos, sin = cos[:, None], sin[:, None]  # broadcast over heads
        q_width, kv_width = d.heads * d.head_dim, d.kv_heads * d.head_dim
        for i, layer in enumerate(d.layers):
            x = layer["norm1"](h_B_1_H)[:, 0]
            qkv = _linear(x, layer["qkv"])
            if (joined := layer.get("lora_qkv")) is not None:
                qkv.addmm_(F.linear(x, joined[0]), joined[1].t())
            q = qkv[:, :q_width].view(B, d.heads, 1, d.head_dim)
            k = qkv[:, q_width:q_width + kv_width].view(B, d.kv_heads, 1, d.head_dim)
            v = qkv[:, q_width + kv_width:].view(B, d.kv_heads, 1, d.head_dim)
            if layer["q_norm"] is not None:  # Qwen3: each head's query and key normalised before the rotation
                q, k = layer["q_norm"](q), layer["k_norm"](k)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            keys, values = self.keys[i], self.values[i]
            keys[:, :, t:n] = k
            values[:, :, t:n] = v
            # a key/value head's query heads as `groups` query positions: [B, kv, groups, hd] against [B, kv, n, hd]
            q_B_K_G_D = q.view(B, d.kv_heads, groups, d.head_dim)
            if self.prefixes:
                attn = self._attend_with_prefixes(i, q_B_K_G_D, keys[:, :, :n], values[:, :, :n], bias)
            else:
                attn = _attend_rows(q_B_K_G_D, keys[:, :, :n], values[:, :, :n], bias, d.scale)
            attn = attn.reshape(B, q_width)
            out_H_B = _linear_t(attn, layer["o"].weight)
            if (factors := layer.get("lora_o")) is not None:
                out_H_B.addmm_(factors[1], F.linear(attn, factors[0]).t())
            h_B_1_H = h_B_1_H + out_H_B.t()[:, None]
            # gate and up stay feature-major ([2 x inter, B]), so the widest output is never transposed; the
            # narrower product is, since MKL multiplies a [inter, B] right operand ~50% slower at 8 rows
            x = layer["norm2"](h_B_1_H)[:, 0]
            gate_up_T = _linear_t(x, layer["gate_up"])
            inter = layer["intermediate"]
            if (joined := layer.get("lora_gate_up")) is not None:
                gate_up_T.addmm_(joined[1], F.linear(x, joined[0]).t())
            mlp_B_I = (layer["act"](gate_up_T[:inter]) * gate_up_T[inter:]).t().contiguous()
            down_H_B = _linear_t(mlp_B_I, layer["down"].weight)
            if (factors := layer.get("lora_down")) is not None:
                down_H_B.addmm_(factors[1], F.linear(mlp_B_I, factors[0]).t())
            h_B_1_H = h_B_1_H + down_H_B.t()[:, None]
        self.length = n
        return _linear(d.norm(h_B_1_H)[:, 0], d.head.weight).float()

    def _attend_with_prefixes(self, i: int, q_B_K_G_D: torch.Tensor, keys_B_K_N_D: torch.Tensor,
                              values_B_K_N_D: torch.Tensor, bias_B_1_1_N: torch.Tensor) -> torch.Tensor:
        """Attention over each row's shared prefix and its own positions, as one softmax over both: a prefix's
        keys meet all its rows' queries in one kernel call, so they are read once a step, not once a row; the two
        parts are weighted by their log-sum-exps."""
        d = self.d
        B, kv, groups, hd = q_B_K_G_D.shape
        own_out, own_lse = _attention_lse(q_B_K_G_D, keys_B_K_N_D, values_B_K_N_D, bias_B_1_1_N, d.scale)
        outs, lses = [], []
        for prefix in self.prefixes:
            r = len(prefix.rows)
            q_1_K_RG_D = q_B_K_G_D.index_select(0, prefix.rows).transpose(0, 1).reshape(1, kv, r * groups, hd)
            out, lse = _attention_lse(q_1_K_RG_D, prefix.keys[i], prefix.values[i], None, d.scale)
            outs.append(out.view(kv, r, groups, hd).transpose(0, 1))
            lses.append(lse.view(kv, r, groups).transpose(0, 1))
        # a row in no group reads the appended slot: nothing, with log-sum-exp -inf (weight 0)
        outs.append(own_out.new_zeros((1, kv, groups, hd)))
        lses.append(own_lse.new_full((1, kv, groups), float("-inf")))
        shared_out = torch.cat(outs)[self._shared_at]
        shared_lse = torch.cat(lses)[self._shared_at]
        total = torch.logaddexp(own_lse, shared_lse)
        mixed = own_out.float() * (own_lse - total).exp()[..., None] \
            + shared_out.float() * (shared_lse - total).exp()[..., None]
        return mixed.to(q_B_K_G_D.dtype)


def _attend_rows(q_B_K_G_D: torch.Tensor, keys_B_K_N_D: torch.Tensor, values_B_K_N_D: torch.Tensor,
                 bias_B_1_1_N: torch.Tensor, scale: float) -> torch.Tensor:
    """Each row's queries over its own keys and values: torch's fused kernel, which reads the buffers' strided
    slices as they are (a bf16 matmul copies them first)."""
    return F.scaled_dot_product_attention(q_B_K_G_D, keys_B_K_N_D, values_B_K_N_D, attn_mask=bias_B_1_1_N, scale=scale)


def _attention_lse(q_B_H_L_D: torch.Tensor, keys_B_H_N_D: torch.Tensor, values_B_H_N_D: torch.Tensor,
                   bias: torch.Tensor | None, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T scale + bias) v, and each query's log-sum-exp [B, H, L] (float32): torch's fused CPU kernel
    where it runs, else the same in matmuls."""
    if q_B_H_L_D.device.type == "cpu" and _CPU_ATTENTION is not None:
        out, lse = _CPU_ATTENTION(q_B_H_L_D, keys_B_H_N_D, values_B_H_N_D, attn_mask=bias, scale=scale)
        return out, lse.float()
    scores = torch.matmul(q_B_H_L_D, keys_B_H_N_D.transpose(-1, -2)).float() * scale
    if bias is not None:
        scores = scores + bias.float()
    lse = scores.logsumexp(-1)
    return torch.matmul((scores - lse[..., None]).exp().to(values_B_H_N_D.dtype), values_B_H_N_D), lse


def _joined(factors: list[tuple[torch.Tensor, torch.Tensor] | None],
            widths: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The (A, sB) factors of projections that read one input, as one pair: the A's stacked [sum r, in], and the
    sB's block-diagonal [sum widths, sum r], zero where a projection has no adapter (None when none has)."""
    present = [(i, f) for i, f in enumerate(factors) if f is not None]
    if not present:
        return None
    a = torch.cat([f[0] for _, f in present], dim=0)
    b = a.new_zeros((sum(widths), a.shape[0]))
    starts = [sum(widths[:i]) for i in range(len(widths))]
    rank = 0
    for i, (_, sb) in present:
        b[starts[i]:starts[i] + widths[i], rank:rank + sb.shape[1]] = sb
        rank += sb.shape[1]
    return a, b


# The vocabulary head (more than SLICE_ABOVE outputs) is multiplied SLICE_ROWS outputs at a time: at 32 rows
# this CPU's MKL ran SmolLM2's whole [49152 x 576] head at ~55 GFLOP/s and 1,024-row slices of it at ~80.
SLICE_ABOVE = 16384
SLICE_ROWS = 1024


def _linear(x_B_I: torch.Tensor, weight_O_I: torch.Tensor) -> torch.Tensor:
    """x @ W^T computed as (W @ x^T)^T: with few rows, BLAS streams the big weight as its left operand and packs
    only the small x: in a micro-benchmark of these shapes with the weights streamed from memory (8-32 rows,
    this machine's MKL), 5-25% faster than F.linear, except a few shapes at 8 rows. A weight of more than
    SLICE_ABOVE outputs is multiplied a slice at a time into one buffer."""
    rows = weight_O_I.shape[0]
    if rows <= SLICE_ABOVE:
        return _linear_t(x_B_I, weight_O_I).t().contiguous()
    out_O_B = x_B_I.new_empty((rows, x_B_I.shape[0]))
    x_I_B = x_B_I.t()
    for start in range(0, rows, SLICE_ROWS):
        torch.mm(weight_O_I[start:start + SLICE_ROWS], x_I_B, out=out_O_B[start:start + SLICE_ROWS])
    return out_O_B.t().contiguous()


def _linear_t(x_B_I: torch.Tensor, weight_O_I: torch.Tensor) -> torch.Tensor:
    """(x @ W^T)^T, [O, B] and contiguous: for a consumer that can take its input feature-major."""
    return torch.mm(weight_O_I, x_B_I.t())


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
