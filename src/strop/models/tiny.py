"""A tiny random Llama with a real tokenizer, built offline in about a second, for tests and smoke runs.

`strop/tiny-random` stands in for SmolLM2-135M-Instruct wherever a test needs *a* causal LM but not a
good one: it has the same architecture family (Llama), the same special tokens at the same ids
(`<|endoftext|>`=0, `<|im_start|>`=1, `<|im_end|>`=2) and the same ChatML chat template, so code written
against one runs unchanged on the other. Its weights are noise, so its text is gibberish.

Everything is deterministic: building twice gives byte-identical `model.safetensors` and `tokenizer.json`.

    from pathlib import Path
    from strop.models.tiny import build_tiny_random
    path = build_tiny_random(Path("/tmp/tiny"))     # -> /tmp/tiny (config.json, model.safetensors, tokenizer.json, ...)

Chat template choice: the template is SmolLM2-Instruct's, character for character, *including* its default
system message ("You are a helpful AI assistant named SmolLM, trained by Hugging Face") inserted when a
conversation has none. Matching exactly means a renderer test that passes on the tiny model passes on
SmolLM2 too; the cost is a nonsensical system prompt for a model that is not SmolLM, which noise weights
cannot mind.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from strop.files import atomic_folder

# Bump when anything below changes what gets written, so caches built by an older strop are rebuilt.
TINY_BUILD_VERSION = 1
BUILD_MARKER = "strop-build.json"

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
VOCAB_SIZE = 1024
SEED = 0

# Identical to HuggingFaceTB/SmolLM2-135M-Instruct's tokenizer_config.json "chat_template".
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_COMMON_WORDS = """
the be to of and a in that have I it for not on with he as you do at this but his by from they we say her
she or an will my one all would there their what so up out if about who get which go me when make can like
time no just him know take people into year your good some could them see other than then now look only come
its over think also back after use two how our work first well way even new want because any these give day
most us is are was were been has had did does said made found went got came number numbers answer question
problem step steps think let first second third next last total each every many much more less left remain
remaining altogether together both half twice double triple quarter third percent price cost costs dollars
cents money pay paid buy buys bought sell sells sold spend spent save saved earn earns earned hour hours
minute minutes day days week weeks month months year years apple apples orange oranges book books pencil
pencils candy candies cookie cookies marble marbles ball balls car cars bird birds dog dogs cat cats egg eggs
cup cups box boxes bag bags page pages mile miles meter meters kilogram pound pounds student students class
friend friends mother father sister brother teacher school store shop farm garden tree trees flower flowers
""".split()

_MATH_WORDS = """
zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen twenty thirty
forty fifty sixty seventy eighty ninety hundred thousand million plus minus times multiplied divided by
equals equal sum difference product quotient add adds added subtract subtracts subtracted multiply divide
remainder fraction decimal integer even odd prime square root average ratio rate speed distance area
perimeter length width height solve solution therefore so final result compute calculate check correct
""".split()

_NAMES = ["Alice", "Bob", "Carla", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "James", "Kofi", "Lena"]
_ITEMS = ["apples", "marbles", "books", "cookies", "pencils", "stickers", "eggs", "cards"]
_PUNCTUATION = list(".,!?:;'\"()[]{}-+*/=%$#<>_&@^~|\\`") + ["\n", "\n\n", "  ", "\t"]


def _corpus() -> list[str]:
    """A fixed, generated training text: enough variety to learn ~760 merges, no randomness."""
    lines: list[str] = []
    lines.append(" ".join(_COMMON_WORDS))
    lines.append(" ".join(w.capitalize() for w in _COMMON_WORDS))
    lines.append(" ".join(_MATH_WORDS))
    lines.append(" ".join(w.capitalize() for w in _MATH_WORDS))
    lines.append(" ".join(_PUNCTUATION))
    lines.extend(
        f"{a} + {b} = {a + b}. {a} - {b} = {a - b}. {a} * {b} = {a * b}."
        for a in range(0, 40, 3)
        for b in range(1, 13)
    )
    # Word problems in the shape of GSM8K, so common problem phrasing gets single tokens.
    for (name, item), (a, b) in zip(
        itertools.product(_NAMES, _ITEMS), itertools.cycle(itertools.product(range(2, 20, 3), range(1, 9)))
    ):
        question = (
            f"{name} has {a} {item}. She buys {b} more {item}, then gives {b // 2 + 1} to a friend. "
            f"How many {item} does {name} have now?"
        )
        answer = (
            f"Let's think step by step. {name} starts with {a} {item}. "
            f"After buying, {name} has {a} + {b} = {a + b} {item}. "
            f"After giving some away, {a + b} - {b // 2 + 1} = {a + b - b // 2 - 1}. "
            f"The answer is {a + b - b // 2 - 1}.\n#### {a + b - b // 2 - 1}"
        )
        lines.append(f"{question} {answer}")
        # The same problem as a ChatML conversation, so role names and turn boundaries get their own tokens.
        lines.append(f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n{answer}<|im_end|>\n")
        lines.append(
            f"What is {a} times {b}? The product of {a} and {b} is {a * b}, "
            f"so the final answer is \\boxed{{{a * b}}}."
        )
    lines.append("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n")
    return lines


def _train_tokenizer():
    """Byte-level BPE shaped like SmolLM2's: digits split one by one, no prefix space, byte fallback free."""
    # lazy: tokenizers is heavy or optional, loaded only when this runs
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        # The full byte alphabet means any UTF-8 text encodes without an unknown token.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok


def _build_tokenizer():
    # lazy: transformers is heavy or optional, loaded only when this runs
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer(),
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|im_end|>",
        chat_template=CHATML_TEMPLATE,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )


def _build_model(vocab_size: int):
    # lazy: torch is heavy or optional, loaded only when this runs
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    # Construction draws from the global RNG; fork it so building a model never changes a caller's seed.
    with torch.random.fork_rng(devices=[]):
        model = LlamaForCausalLM(config)
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        # named_parameters() order is fixed by the module tree and tied weights appear once, so the same
        # generator stream lands on the same tensors every time.
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float32) * 0.02)
    model.generation_config.bos_token_id = 1
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 2
    return model.eval()


def build_tiny_random(dest: Path) -> Path:
    """Build `strop/tiny-random` into `dest` (created; must not already hold a model) and return `dest`.

    Files are written to a sibling temp folder and renamed into place, so a crash never leaves a half-built
    model where a later run would take it for a finished one.
    """
    dest = Path(dest)
    if (dest / "config.json").exists():
        raise FileExistsError(f"build_tiny_random: {dest} already holds a model; delete it first to rebuild it.")
    with atomic_folder(dest) as tmp:
        tokenizer = _build_tokenizer()
        model = _build_model(len(tokenizer))
        # lazy: transformers is heavy or optional, loaded only when this runs
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()  # a progress bar for a 560 KB file is noise
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        marker = {"model_id": "strop/tiny-random", "builder": "strop.models.tiny", "version": TINY_BUILD_VERSION}
        (tmp / BUILD_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return dest


def is_current_build(path: Path) -> bool:
    """True when `path` holds a tiny model built by this version of the builder."""
    try:
        marker = json.loads((Path(path) / BUILD_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("version") == TINY_BUILD_VERSION and (Path(path) / "config.json").exists()
