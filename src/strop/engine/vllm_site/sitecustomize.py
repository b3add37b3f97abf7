"""Put on PYTHONPATH for strop's vLLM worker and the processes vLLM starts: PyPI's torchvision, torchaudio and
torchcodec builds do not load against a CPU build of torch, and a text model needs none of them, so they are
made absent (an import raises ImportError, find_spec answers None)."""

import sys

for _name in ("torchvision", "torchaudio", "torchcodec"):
    sys.modules.setdefault(_name, None)
