"""LoRA training of a causal LM: forward_backward with strop's losses, AdamW steps, adapter and state files.

    trainer = LoraTrainer(model_dir, rank=32)
    out = trainer.forward_backward(datums, "importance_sampling")     # gradients accumulate
    trainer.optim_step(AdamParams(learning_rate=1e-4))                # apply and clear them
    trainer.save_weights(path)                                        # a PEFT adapter directory

Datums are packed into micro-batches of at most `max_tokens_per_batch` tokens (`strop.engine.micro_batch`, which
also computes each datum's loss), so a big batch never materialises all its B x T x V logits at once; the losses
are sums, so gradients add up across micro-batches exactly as one big batch would give. Rows of a micro-batch that
begin with the same untrained prefix (a GRPO group's prompt) run that prefix once (`shared_prefixes`); the
vocabulary head keeps the softmax of trained positions for backward up to HEAD_KEEP_BYTES a micro-batch and
recomputes it past that (`strop.engine.target_logprob`).

A datum whose loss is NaN or infinite (a NaN advantage, say) trains nothing and is counted (`nonfinite_loss:sum`);
the next optim_step is then skipped, as is one whose gradient is not finite, and says so (`skipped_nonfinite`):
one such update would make every adapter weight NaN (`strop.engine.finite`). No adapter with a non-finite weight
is saved or loaded.
"""

from __future__ import annotations

import copy
import json
import math
import warnings
from collections import Counter
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
from peft.tuners.lora import LoraLayer
from peft.utils import get_peft_model_state_dict
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from strop.engine import lora_linear
from strop.engine.finite import all_finite, nonfinite_names, refuse_nonfinite
from strop.engine.malloc import keep_freed_memory
from strop.engine.micro_batch import REQUIRED_INPUTS  # noqa: F401  (re-exported: what each loss_fn needs)
from strop.engine.micro_batch import check_datums, datum_losses, micro_batches, padded_batch
from strop.engine.precision import train_device
from strop.engine.resources import HEAD_CHUNK, HEAD_KEEP_BYTES, MAX_TOKENS_PER_MICRO_BATCH
from strop.engine.sample_types import AdapterWeights
from strop.engine.sampler import cache_keyword
from strop.engine.target_logprob import TargetLogprob as _TargetLogprob
from strop.errors import StropError
from strop.files import atomic_folder
from strop.types import AdamParams, Datum, ForwardBackwardOutput, TensorData

keep_freed_memory()

DEFAULT_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PEFT_PREFIX = "base_model.model."


def _head_logprobs(head, hidden_N_H, targets_N):
    """log p(target) and entropy for N positions, projecting onto the vocabulary HEAD_CHUNK at a time; with
    gradients, the first chunks within HEAD_KEEP_BYTES keep their softmax for the backward.

    A head that is itself trained (no LoRA model does this) goes through plain autograd instead."""
    lps, ents = [], []
    kept_bytes = 0
    for i in range(0, hidden_N_H.shape[0], HEAD_CHUNK):
        h, t = hidden_N_H[i:i + HEAD_CHUNK], targets_N[i:i + HEAD_CHUNK]
        if head.weight.requires_grad and torch.is_grad_enabled():
            logits_N_V = head(h).float()
            lse_N = torch.logsumexp(logits_N_V, dim=-1)
            lp = logits_N_V.gather(-1, t[:, None])[:, 0] - lse_N
            ent = (lse_N - (torch.softmax(logits_N_V, -1) * logits_N_V).sum(-1)).detach()
        else:
            chunk_bytes = h.shape[0] * head.weight.shape[0] * 4
            keep = torch.is_grad_enabled() and kept_bytes + chunk_bytes <= HEAD_KEEP_BYTES
            kept_bytes += chunk_bytes if keep else 0
            lp, ent = _TargetLogprob.apply(h, head.weight.detach(), t, keep)
        lps.append(lp)
        ents.append(ent)
    if not lps:
        return hidden_N_H.new_zeros(0), hidden_N_H.new_zeros(0)
    return torch.cat(lps), torch.cat(ents)


MIN_SHARED_PREFIX = 8  # tokens; below this, a second forward pass costs more than the prefix it saves


def shared_prefixes(input_ids_B_T, mask_B_T, active_B_T):
    """Rows that begin with the same untrained prefix (a GRPO group's prompt): (prefix length per row, index of
    its distinct prefix per row, the distinct prefixes' row of origin), or None when no prefix is shared.

    A row's prefix is everything before its first trained position, so nothing in it needs a gradient of its
    own; it still passes gradients on to the later positions through its keys and values."""
    lengths = []
    for b in range(input_ids_B_T.shape[0]):
        hits = active_B_T[b].nonzero()
        first = int(hits[0]) if len(hits) else int(mask_B_T[b].sum())
        lengths.append(max(0, min(first, int(mask_B_T[b].sum()) - 1)))  # leave each row one position of its own
    keys, owner_of, prefix_of = {}, [], []
    for b, n in enumerate(lengths):
        key = tuple(input_ids_B_T[b, :n].tolist())
        if key not in keys:
            keys[key] = len(owner_of)
            owner_of.append(b)
        prefix_of.append(keys[key])
    rows_per_prefix = Counter(prefix_of)
    shared = [n for b, n in enumerate(lengths) if rows_per_prefix[prefix_of[b]] > 1]
    if not shared or min(shared) < MIN_SHARED_PREFIX or len(owner_of) == len(lengths):
        return None
    return lengths, prefix_of, owner_of


def _prefix_shared_hidden(inner, input_ids_B_T, mask_B_T, lengths, prefix_of, owner_of):
    """The transformer's last hidden states [B, T, H], running each distinct prefix once and each row's rest
    on top of its prefix's keys and values (repeated to the rows, so gradients from every row reach them)."""
    # lazy: transformers is heavy or optional, loaded only when this runs
    from transformers.cache_utils import DynamicCache
    B, T = input_ids_B_T.shape
    U, P = len(owner_of), max(lengths[b] for b in owner_of)
    device = input_ids_B_T.device
    prefix_ids = torch.zeros((U, P), dtype=torch.long, device=device)
    prefix_mask = torch.zeros((U, P), dtype=torch.long, device=device)
    for u, b in enumerate(owner_of):
        prefix_ids[u, :lengths[b]] = input_ids_B_T[b, :lengths[b]]
        prefix_mask[u, :lengths[b]] = 1
    cache, cache_kw = DynamicCache(), cache_keyword(inner)
    prefix_hidden = inner(input_ids=prefix_ids, attention_mask=prefix_mask, use_cache=True,
                          **{cache_kw: cache}).last_hidden_state
    cache.batch_select_indices(torch.tensor(prefix_of, device=device))
    rest = [int(mask_B_T[b].sum()) - lengths[b] for b in range(B)]
    S = max(rest)
    rest_ids = torch.zeros((B, S), dtype=torch.long, device=device)
    rest_mask = torch.zeros((B, P + S), dtype=torch.long, device=device)
    positions = torch.zeros((B, S), dtype=torch.long, device=device)
    for b in range(B):
        n, r = lengths[b], rest[b]
        rest_ids[b, :r] = input_ids_B_T[b, n:n + r]
        rest_mask[b, :n] = 1  # this row's prefix slots (the rest of the P are another prefix's padding)
        rest_mask[b, P:P + r] = 1
        positions[b] = torch.arange(n, n + S, device=device)
    rest_hidden = inner(input_ids=rest_ids, attention_mask=rest_mask, position_ids=positions, use_cache=True,
                        **{cache_kw: cache}).last_hidden_state
    # row b, position t: its prefix's hidden state for t < lengths[b], else its own rest's
    H = prefix_hidden.shape[-1]
    flat = torch.cat([prefix_hidden.reshape(U * P, H), rest_hidden.reshape(B * S, H)])
    index = torch.zeros((B, T), dtype=torch.long, device=device)
    for b in range(B):
        n, r = lengths[b], rest[b]
        index[b, :n] = prefix_of[b] * P + torch.arange(n, device=device)
        index[b, n:n + r] = U * P + b * S + torch.arange(r, device=device)
    return flat[index]


def _repeated_prefix_rows(plan, targets_B_T) -> list[tuple[int, int, int]]:
    """(row, owner row, prefix length) for each row whose shared prefix, targets included, is its owner's: its
    prefix positions have the owner's hidden states and targets, so their log-probabilities are the owner's and
    the vocabulary head (a quarter of a 135M model's forward per position) need not run on them again."""
    if plan is None:
        return []
    lengths, prefix_of, owner_of = plan
    copies = []
    for b, n in enumerate(lengths):
        owner = owner_of[prefix_of[b]]
        if owner != b and n and torch.equal(targets_B_T[b, :n], targets_B_T[owner, :n]):
            copies.append((b, owner, n))
    return copies


class SharedBase:
    """A base model's frozen weights, loaded once. `module_tree()` gives each trainer a model of its own (its own
    modules, for PEFT to wrap with its own adapter) whose weight and buffer tensors are these, not copies."""

    def __init__(self, model_dir: str | Path, dtype: torch.dtype, device: str = "cpu"):
        hf_logging.disable_progress_bar()
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(device)
        self.model.config.use_cache = False
        self.model.requires_grad_(False)

    def module_tree(self) -> torch.nn.Module:
        shared = {id(t): t for t in (*self.model.parameters(), *self.model.buffers())}
        return copy.deepcopy(self.model, shared)      # deepcopy finds each tensor in `shared` and keeps it


class LoraTrainer:
    def __init__(self, model_dir: str | Path, *, rank: int = 32, alpha: float | None = None,
                 target_modules: list[str] | None = None, seed: int = 0,
                 compute_dtype: torch.dtype | None = None, max_tokens_per_batch: int = MAX_TOKENS_PER_MICRO_BATCH,
                 shared_base: SharedBase | None = None, device: str | None = None):
        """`shared_base`: take the frozen base weights from there instead of loading them, so several trainers on
        one base model (sessions of `strop serve-tinker`, an SFT warm start then GRPO) hold them once.
        `device`: where to compute (strop.engine.precision.train_device: a CUDA GPU when there is one); datums,
        outputs, adapters and files stay on the CPU side."""
        if rank < 1:
            raise StropError(f"LoRA rank must be a positive integer, got {rank}")
        self.model_dir = str(model_dir)
        hf_logging.disable_progress_bar()
        # bf16 compute: the frozen base in bf16; PEFT keeps the LoRA weights fp32 (autocast_adapter_dtype), and
        # lora_linear casts them for each product (strop.engine.precision)
        self.compute_dtype = compute_dtype or torch.float32
        self.device = (next(shared_base.model.parameters()).device if shared_base is not None
                       else torch.device(train_device(device)))
        base = (shared_base or SharedBase(self.model_dir, self.compute_dtype, self.device)).module_tree()
        present = {name.rsplit(".", 1)[-1] for name, _ in base.named_modules()}
        targets = target_modules or [t for t in DEFAULT_TARGETS if t in present]
        missing = [t for t in targets if t not in present]
        if missing:
            raise StropError(f"LoRA target modules {missing} are not in model {self.model_dir}; it has linear layers such as "
                             f"{sorted(n for n in present if n.endswith('proj'))[:12]}")
        self.config = LoraConfig(r=rank, lora_alpha=alpha if alpha is not None else rank, target_modules=targets,
                                 lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
        # PEFT draws lora_A from the global RNG: fork it so a seed gives the same adapter and leaves callers' RNG alone
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")  # PEFT calls a deprecated name
            torch.manual_seed(seed)
            self.model = get_peft_model(base, self.config)
        lora_linear.install(self.model)
        self.model.train()
        self.max_tokens_per_batch = max_tokens_per_batch
        self.facts: dict = {}  # it trains in this process: nothing to add to the client's facts
        self.optimizer: torch.optim.AdamW | None = None
        self.steps = 0
        self.skipped_steps = 0       # optim_steps skipped for a non-finite loss or gradient
        self.pending_nonfinite = 0   # datums with a non-finite loss since the last optim_step: it will be skipped

    # ---- forward / backward --------------------------------------------------------------------------
    def forward_backward(self, datums: list[Datum], loss_fn: str = "cross_entropy",
                         loss_fn_config: dict | None = None) -> ForwardBackwardOutput:
        return self._run(datums, loss_fn, loss_fn_config or {}, backward=True)

    def forward(self, datums: list[Datum], loss_fn: str = "cross_entropy",
                loss_fn_config: dict | None = None) -> ForwardBackwardOutput:
        return self._run(datums, loss_fn, loss_fn_config or {}, backward=False)

    def _run(self, datums, loss_fn, config, backward) -> ForwardBackwardOutput:
        check_datums(datums, loss_fn)
        outputs: list[dict[str, TensorData] | None] = [None] * len(datums)
        totals = {"loss:sum": 0.0, "tokens:sum": 0.0, "entropy:sum": 0.0, "kl_sample_train:sum": 0.0, "clipped:sum": 0.0,
                  "kl_sample_train:max": 0.0, "ratio_outside:sum": 0.0, "nonfinite_loss:sum": 0.0}
        for batch in micro_batches(datums, self.max_tokens_per_batch):
            grad = torch.enable_grad() if backward else torch.no_grad()
            with grad:
                loss, per_datum, stats = self._batch_loss([datums[i] for i in batch], loss_fn, config)
            if backward and loss.requires_grad:  # a micro-batch with nothing to train (all weights 0) has no graph
                loss.backward()
            for i, out in zip(batch, per_datum):
                outputs[i] = out
            totals["loss:sum"] += float(loss.detach())
            for key, value in stats.items():
                totals[key] = max(totals[key], value) if key.endswith(":max") else totals[key] + value
        if backward:
            self.pending_nonfinite += int(totals["nonfinite_loss:sum"])
        return ForwardBackwardOutput(loss_fn_output_type=loss_fn, loss_fn_outputs=outputs, metrics=totals)

    def _batch_loss(self, datums: list[Datum], loss_fn: str, config: dict):
        input_ids, mask, targets, active, inputs = padded_batch(datums, loss_fn, self.device)
        lp_B_T, entropy_B_T = self._target_logprobs(input_ids, mask, targets, active)
        return datum_losses(datums, loss_fn, config, lp_B_T, entropy_B_T, active, inputs, self.device)

    def _target_logprobs(self, input_ids, mask, targets, active):
        """log p(target) and the entropy at every position, without ever holding B x T x V logits.

        The transformer runs once; the vocabulary projection runs in chunks of HEAD_CHUNK positions, keeping at
        most HEAD_KEEP_BYTES of softmax for backward (see _TargetLogprob) for positions whose loss has a
        gradient, and without a graph for the rest (prompt tokens, padding)."""
        base = self.model.get_base_model()
        plan = shared_prefixes(input_ids, mask, active)
        if plan is None:
            hidden_B_T_H = base.model(input_ids=input_ids, attention_mask=mask.long()).last_hidden_state
        else:
            hidden_B_T_H = _prefix_shared_hidden(base.model, input_ids, mask, *plan)
        lp_B_T = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        entropy_B_T = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        grad_pos = active & mask if torch.is_grad_enabled() else torch.zeros_like(mask)
        copies = _repeated_prefix_rows(plan, targets)
        rest_pos = mask & ~grad_pos
        for b, _, n in copies:
            rest_pos[b, :n] = False
        with torch.no_grad():
            lp, ent = _head_logprobs(base.lm_head, hidden_B_T_H[rest_pos], targets[rest_pos])
            lp_B_T[rest_pos] = lp
            entropy_B_T[rest_pos] = ent
            for b, owner, n in copies:
                lp_B_T[b, :n] = lp_B_T[owner, :n]
                entropy_B_T[b, :n] = entropy_B_T[owner, :n]
        if grad_pos.any():
            lp, ent = _head_logprobs(base.lm_head, hidden_B_T_H[grad_pos], targets[grad_pos])
            lp_B_T = lp_B_T.index_put(grad_pos.nonzero(as_tuple=True), lp)
            entropy_B_T[grad_pos] = ent
        return lp_B_T, entropy_B_T

    # ---- optimizer -----------------------------------------------------------------------------------
    def close(self) -> None:
        """Nothing to stop: the model and optimiser go with the last reference to the trainer."""

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def optim_step(self, adam: AdamParams) -> dict[str, float]:
        """One AdamW step on the gradients accumulated since the last; skipped (the weights and the optimizer's
        state left as they were, the gradients dropped) when a datum's loss or the gradient was not finite, or the
        step itself would make a weight non-finite (possible only with eps 0: `_guarded_step`). A skipped step
        reports `skipped_nonfinite` 1 and no grad_norm (it is not a number); `skipped_nonfinite_total` counts the
        skipped steps over the trainer's life."""
        params = self.trainable_parameters()
        if self.optimizer is None:
            self.optimizer = torch.optim.AdamW(params, lr=adam.learning_rate)
        for group in self.optimizer.param_groups:
            group.update(lr=adam.learning_rate, betas=(adam.beta1, adam.beta2), eps=adam.eps,
                         weight_decay=adam.weight_decay)
        grads = [p.grad for p in params if p.grad is not None]
        grad_norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) if grads else 0.0
        if self.pending_nonfinite or not math.isfinite(grad_norm):
            return self._skip_step(adam)
        if adam.grad_clip_norm > 0 and grads:
            torch.nn.utils.clip_grad_norm_(params, adam.grad_clip_norm)
        if adam.eps == 0:
            return self._guarded_step(adam, params, grad_norm)
        # with eps > 0 and a finite gradient norm (so every squared gradient fits in float32), AdamW's update
        # m / (sqrt(v) + eps) is finite: the weights after the step are too, and need no check
        self.optimizer.step()
        return self._stepped(adam, grad_norm)

    def _guarded_step(self, adam: AdamParams, params, grad_norm: float) -> dict[str, float]:
        """A step with eps 0, which divides 0 by 0 where a second moment is 0 (a LoRA A whose B is still zero, a
        squared gradient below float32's range): NaN weights from finite gradients. The weights and the optimizer's
        state are kept (a copy of the adapter's size, ~0.3 s for SmolLM2's at rank 32 on 2 CPU cores) and put back
        if the step made any weight non-finite."""
        before = [p.detach().clone() for p in params]
        state = copy.deepcopy(self.optimizer.state_dict())
        self.optimizer.step()
        if not all_finite([p.detach() for p in params]):
            with torch.no_grad():
                for p, saved in zip(params, before):
                    p.copy_(saved)
            self.optimizer.load_state_dict(state)
            return self._skip_step(adam)
        return self._stepped(adam, grad_norm)

    def _stepped(self, adam: AdamParams, grad_norm: float) -> dict[str, float]:
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return {"grad_norm": grad_norm, "learning_rate": adam.learning_rate, "skipped_nonfinite": 0.0,
                "skipped_nonfinite_total": float(self.skipped_steps)}

    def _skip_step(self, adam: AdamParams) -> dict[str, float]:
        self.optimizer.zero_grad(set_to_none=True)
        self.pending_nonfinite = 0
        self.skipped_steps += 1
        return {"learning_rate": adam.learning_rate, "skipped_nonfinite": 1.0,
                "skipped_nonfinite_total": float(self.skipped_steps)}

    # ---- weights and state ---------------------------------------------------------------------------
    def adapter_weights(self) -> AdapterWeights:
        """A snapshot of the adapter (copies, so later steps do not change it) in the sampler's form."""
        deltas = {}
        for name, module in self.model.named_modules():
            if isinstance(module, LoraLayer) and "default" in module.lora_A:
                base_name = name[len(PEFT_PREFIX):] if name.startswith(PEFT_PREFIX) else name
                deltas[base_name] = (module.lora_A["default"].weight.detach().to("cpu", copy=True),
                                     module.lora_B["default"].weight.detach().to("cpu", copy=True))
        return AdapterWeights(deltas=deltas, scaling=self.config.lora_alpha / self.config.r)

    def save_weights(self, path: str | Path) -> Path:
        """Write a PEFT adapter directory (adapter_config.json + adapter_model.safetensors), atomically."""
        path = Path(path)
        self._refuse_nonfinite(f"save the adapter to {path}")
        with atomic_folder(path) as tmp:
            self.model.save_pretrained(str(tmp))
        return path

    def _refuse_nonfinite(self, what: str) -> None:
        refuse_nonfinite(nonfinite_names({n: p.detach() for n, p in self.model.named_parameters() if p.requires_grad}),
                         what)

    def save_state(self, path: str | Path) -> Path:
        """Adapter weights plus optimizer state and step count: everything `load_state` needs to continue."""
        path = Path(path)
        self._refuse_nonfinite(f"save the trainer's state to {path}")
        with atomic_folder(path) as tmp:
            self.model.save_pretrained(str(tmp))
            torch.save({"optimizer": self.optimizer.state_dict() if self.optimizer else None}, tmp / "optimizer.pt")
            (tmp / "trainer.json").write_text(json.dumps({"steps": self.steps, "model_dir": self.model_dir,
                                                           "rank": self.config.r, "alpha": self.config.lora_alpha}))
        return path

    def load_state(self, path: str | Path, with_optimizer: bool = True) -> None:
        path = Path(path)
        weights = path / "adapter_model.safetensors"
        if not weights.exists():
            raise StropError(f"{path} holds no adapter_model.safetensors; pass a folder written by save_state or save_weights")
        tensors = load_file(str(weights))
        refuse_nonfinite(nonfinite_names(tensors), f"load the adapter in {path}")
        result = set_peft_model_state_dict(self.model, tensors)
        if getattr(result, "unexpected_keys", None):
            raise StropError(f"{path} does not match this model's adapter: unexpected keys {result.unexpected_keys[:3]}")
        optimizer_file = path / "optimizer.pt"
        if with_optimizer and optimizer_file.exists():
            state = torch.load(optimizer_file, weights_only=False, map_location=self.device)["optimizer"]
            if state is not None:
                self.optimizer = torch.optim.AdamW(self.trainable_parameters())
                self.optimizer.load_state_dict(state)
        meta = path / "trainer.json"
        if meta.exists():
            self.steps = json.loads(meta.read_text())["steps"]

    def lora_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu", copy=True) for k, v in get_peft_model_state_dict(self.model).items()}


def load_adapter_weights(adapter_dir: str | Path) -> AdapterWeights:
    """Read a PEFT LoRA adapter directory into the sampler's form."""
    adapter_dir = Path(adapter_dir)
    config_file, weights_file = adapter_dir / "adapter_config.json", adapter_dir / "adapter_model.safetensors"
    if not config_file.exists() or not weights_file.exists():
        raise StropError(f"{adapter_dir} is not a LoRA adapter directory: it needs adapter_config.json and "
                         "adapter_model.safetensors (as TrainingClient.save_weights writes)")
    config = json.loads(config_file.read_text())
    rank, alpha = config["r"], config["lora_alpha"]
    scaling = alpha / (rank ** 0.5) if config.get("use_rslora") else alpha / rank
    tensors = load_file(str(weights_file))
    deltas: dict[str, list] = {}
    for key, value in tensors.items():
        for part, slot in ((".lora_A.weight", 0), (".lora_B.weight", 1)):
            if key.endswith(part):
                name = key[: -len(part)]
                name = name[len(PEFT_PREFIX):] if name.startswith(PEFT_PREFIX) else name
                deltas.setdefault(name, [None, None])[slot] = value
    return AdapterWeights(deltas={k: (a, b) for k, (a, b) in deltas.items()}, scaling=scaling)
