"""Read back what W&B wrote offline: the records of a run's .wandb file (W&B's own framing of its protobuf
`Record`s, in the log format LevelDB uses: 32 KiB blocks of [crc32c:4][length:2][type:1][data] chunks after a
7-byte header ":W&B" + magic + version). The tests read the run files themselves, as `wandb sync` would.

    records = read_records(next(Path(wandb_dir).glob("wandb/offline-run-*/run-*.wandb")))
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2  # the test needs wandb: the dev install has it

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    records, pending, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0:
            break
        pending += data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def history(records) -> list[dict]:
    """Each history record as {key: value}, nested keys joined by '/' ('rollouts/_type'), `_step` included."""
    rows = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            rows.append({"/".join(item.nested_key) or item.key: json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def run_config(records) -> dict:
    """The config the run started with (its `run` record), W&B's own `_wandb` key left out."""
    for record in records:
        if record.WhichOneof("record_type") == "run":
            return {item.key: json.loads(item.value_json) for item in record.run.config.update
                    if item.key != "_wandb"}
    raise AssertionError("no run record")


def summary(records) -> dict:
    """The run's summary as its last summary records left it."""
    out = {}
    for record in records:
        if record.WhichOneof("record_type") == "summary":
            for item in record.summary.update:
                out["/".join(item.nested_key) or item.key] = json.loads(item.value_json)
    return out
