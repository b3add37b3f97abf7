"""The tinker SDK's protobuf bodies, read into strop's types and written from them.

    data, loss_fn, config, forward_only, model_id = read_forward_backward(body_bytes, limits)
    body = write_forward_backward_output(strop_output)        # Accept: application/x-protobuf
    body = write_sample_response(strop_response, prompt_logprobs)

The message definitions are the SDK's own (`tinker.proto.tinker_public_pb2`, from the `tinker` package this server
is tested with), so the two sides cannot drift apart. Everything read is checked before it reaches the engine: a
token or tensor of the wrong type, shape or size is a `WireError` naming the datum and field, never a crash.
"""

from __future__ import annotations

import math

import numpy as np

from strop.engine.losses import LOSSES
from strop.types import Datum, EncodedTextChunk, ModelInput, TensorData


class WireError(ValueError):
    """A request the server will not run: `status` is the HTTP status, the message says what to fix."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


LOSS_INPUTS = {name: loss.inputs for name, loss in LOSSES.items()}   # the loss_fn_inputs names each loss takes
TOPK_MASK_LOGPROB = -99999.0   # the SDK's filler for a top-k slot with no token (tinker.types.topk_logprobs)


def proto():
    """The SDK's generated message module (imported on first use: it needs the `tinker` package)."""
    try:
        # lazy: the tinker SDK is an optional extra, needed only by `strop serve-tinker`
        from tinker.proto import tinker_public_pb2
    except ImportError:
        raise WireError("strop serve-tinker needs the tinker SDK's message definitions: pip install 'strop[tinker]'",
                        status=500) from None
    return tinker_public_pb2


_NUMPY = {1: np.float32, 2: np.int64, 3: np.int32}     # DTYPE_FLOAT32, DTYPE_INT64, DTYPE_INT32
_NAMES = {1: "float32", 2: "int64", 3: "int64"}


def _tensor(msg, where: str, max_values: int) -> np.ndarray:
    """A proto Tensor as a flat numpy array (dense or sparse CSR), checked against its declared shape."""
    dtype = _NUMPY.get(msg.dtype)
    if dtype is None:
        raise WireError(f"{where}: tensor dtype {msg.dtype} is not supported (float32 or int64)")
    shape = [int(s) for s in msg.shape]
    if any(s < 0 for s in shape):
        raise WireError(f"{where}: negative dimension in shape {shape}")
    size = math.prod(shape) if shape else None
    if size is not None and size > max_values:
        raise WireError(f"{where}: {size} values is more than this server takes ({max_values})", status=413)
    itemsize = np.dtype(dtype).itemsize
    if msg.WhichOneof("encoding") == "sparse_csr":
        csr = msg.sparse_csr
        if len(shape) != 2:
            raise WireError(f"{where}: a sparse tensor needs a 2-D shape, got {shape}")
        if len(csr.values) % itemsize or len(csr.crow_indices) % 8 or len(csr.col_indices) % 8:
            raise WireError(f"{where}: sparse tensor buffers are not whole numbers of elements")
        values = np.frombuffer(csr.values, dtype=dtype)
        crow = np.frombuffer(csr.crow_indices, dtype=np.int64)
        col = np.frombuffer(csr.col_indices, dtype=np.int64)
        rows, cols = shape
        if (len(crow) != rows + 1 or len(col) != len(values) or (len(crow) and (crow[0] != 0 or crow[-1] != len(values)))
                or np.any(np.diff(crow) < 0) or (len(col) and (col.min() < 0 or col.max() >= cols))):
            raise WireError(f"{where}: sparse tensor indices do not describe a {rows}x{cols} matrix")
        dense = np.zeros((rows, cols), dtype=dtype)
        row_of = np.repeat(np.arange(rows), np.diff(crow))
        dense[row_of, col] = values
        return dense.reshape(-1)
    if len(msg.dense) % itemsize:
        raise WireError(f"{where}: {len(msg.dense)} bytes is not a whole number of {_NAMES[msg.dtype]} values")
    values = np.frombuffer(msg.dense, dtype=dtype)
    if size is not None and values.size != size:
        raise WireError(f"{where}: {values.size} values for shape {shape}")
    if values.size > max_values:
        raise WireError(f"{where}: {values.size} values is more than this server takes ({max_values})", status=413)
    return values


def _tokens(chunks, where: str, vocab_size: int, max_tokens: int) -> list[int]:
    tokens: list[int] = []
    for c, chunk in enumerate(chunks):
        if chunk.WhichOneof("chunk") != "encoded_text":
            raise WireError(f"{where} chunk {c}: only text chunks (EncodedTextChunk) are supported; "
                            "this server's models read no images or audio")
        raw = chunk.encoded_text.tokens
        if len(raw) % 4:
            raise WireError(f"{where} chunk {c}: token bytes are not whole int32 values")
        tokens.extend(np.frombuffer(raw, dtype=np.int32).tolist())
        if len(tokens) > max_tokens:
            raise WireError(f"{where}: more than {max_tokens} tokens; this server's limit for one sequence", status=413)
    bad = [t for t in tokens if not 0 <= t < vocab_size]
    if bad:
        raise WireError(f"{where}: token id {bad[0]} is outside the model's vocabulary (0..{vocab_size - 1})")
    return tokens


def _compact(values: np.ndarray, dtype) -> np.ndarray:
    """A flat, read-only numpy copy: 4 or 8 bytes a value while queued (a tuple of Python floats took ~10x the
    body's size), and not a view of the request body."""
    array = np.array(values, dtype=dtype)
    array.flags.writeable = False
    return array


def read_forward_backward(body: bytes, *, vocab_size: int, max_tokens: int, max_datums: int, check_loss=None):
    """(model_id, seq_id, data, loss_fn, loss_fn_config, forward_only) from a ForwardBackwardRequest body;
    `check_loss(loss_fn, config)` runs before any datum is read."""
    pb = proto()
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as exc:  # the protobuf runtime raises DecodeError (or others for deep nesting)
        raise WireError(f"the forward_backward body is not a ForwardBackwardRequest protobuf ({exc})") from None
    if len(msg.data) == 0:
        raise WireError("forward_backward got no data; send at least one Datum")
    if len(msg.data) > max_datums:
        raise WireError(f"{len(msg.data)} datums in one request; this server takes at most {max_datums}", status=413)
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for key, value in msg.loss_fn_config_v2.items():
        config[key] = value.text if value.WhichOneof("value") == "text" else float(value.number)
    if check_loss is not None:
        check_loss(msg.loss_fn, config)
    allowed = LOSS_INPUTS.get(msg.loss_fn)
    data = []
    for i, datum in enumerate(msg.data):
        where = f"datum {i}"
        tokens = _tokens(datum.model_input, f"{where} model_input", vocab_size, max_tokens)
        inputs = {}
        for name, tensor in datum.loss_fn_inputs.items():
            if allowed is not None and name not in allowed:
                # refused before its values are read: a made-up name would otherwise be held until the job ran
                raise WireError(f"{where}: loss_fn_inputs[{name[:40]!r}] is not an input of loss_fn "
                                f"{msg.loss_fn!r}; it takes {', '.join(allowed)}")
            values = _tensor(tensor, f"{where} loss_fn_inputs[{name!r}]", max_tokens)
            if values.dtype.kind == "f" and not np.all(np.isfinite(values)):
                raise WireError(f"{where} loss_fn_inputs[{name!r}] holds NaN or infinity")
            if name == "target_tokens":
                values = values.astype(np.int64)
                if values.size and (values.min() < 0 or values.max() >= vocab_size):
                    raise WireError(f"{where} target_tokens: an id is outside the model's vocabulary (0..{vocab_size - 1})")
                inputs[name] = TensorData(data=_compact(values, np.int64), dtype="int64", shape=(values.size,))
            else:
                inputs[name] = TensorData(data=_compact(values, np.float32), dtype="float32", shape=(values.size,))
        data.append(Datum(model_input=ModelInput(chunks=(EncodedTextChunk(tokens=tokens),)), loss_fn_inputs=inputs))
    return msg.model_id, int(msg.seq_id), data, msg.loss_fn, config, bool(msg.forward_only)


def write_forward_backward_output(output) -> bytes:
    """A strop ForwardBackwardOutput as the SDK's ForwardBackwardOutput protobuf: one ArrayRecord whose fields
    are float32 BatchedTensors, each datum's values back to back with their byte offsets."""
    pb = proto()
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for key, value in output.metrics.items():
        msg.metrics[key] = float(value)
    outputs = output.loss_fn_outputs
    record = msg.loss_fn_outputs.add()
    record.type_tag = "ArrayRecord"
    record.num_datums = len(outputs)
    names = sorted({name for out in outputs for name in out})
    for name in names:
        arrays = [np.asarray(out[name].data, dtype=np.float32) if name in out else np.zeros(0, np.float32)
                  for out in outputs]
        offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([a.nbytes for a in arrays])
        field = record.fields[name]
        field.data = b"".join(a.tobytes() for a in arrays)
        field.offsets = offsets.tobytes()
        field.dtype = pb.DTYPE_FLOAT32
    return msg.SerializeToString()


def write_sample_response(response, prompt_logprobs: list | None = None, *, prompt_topk: list | None = None,
                          sample_topk: list | None = None) -> bytes:
    """A strop SampleResponse as the SDK's SampleResponse protobuf (prompt logprobs: NaN where there is none);
    top-k logprobs (per position a list of (token, logprob), or None) of the prompt and of each sequence's
    tokens, as the SDK's dense TopkLogprobs."""
    pb = proto()
    msg = pb.SampleResponse()
    for i, seq in enumerate(response.sequences):
        out = msg.sequences.add()
        out.stop_reason = pb.STOP_REASON_LENGTH if seq.stop_reason == "length" else pb.STOP_REASON_STOP
        out.tokens = np.asarray(seq.tokens, dtype=np.int32).tobytes()
        out.logprobs = np.asarray(seq.logprobs, dtype=np.float32).tobytes()
        if sample_topk is not None:
            _write_topk(out.topk_sampled_logprobs, sample_topk[i])
    if prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray([math.nan if v is None else v for v in prompt_logprobs],
                                         dtype=np.float32).tobytes()
    if prompt_topk is not None:
        _write_topk(msg.topk_prompt_logprobs, prompt_topk)
    return msg.SerializeToString()


def _write_topk(field, rows: list) -> None:
    """Rows of (token, logprob) pairs (None: no distribution there) as a TopkLogprobs message: two [length, k]
    matrices, the SDK's sentinel (token 0, logprob -99999) where a row has fewer than k pairs."""
    k = max((len(row) for row in rows if row), default=0)
    tokens = np.zeros((len(rows), k), dtype=np.int32)
    logprobs = np.full((len(rows), k), TOPK_MASK_LOGPROB, dtype=np.float32)
    for i, row in enumerate(rows):
        for j, (token, logprob) in enumerate(row or ()):
            tokens[i, j], logprobs[i, j] = token, logprob
    field.length, field.k = len(rows), k
    field.token_ids, field.logprobs = tokens.tobytes(), logprobs.tobytes()
