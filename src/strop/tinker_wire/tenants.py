"""Who a request is, for `strop serve-tinker`: its owner (whose records it sees and changes) and its quota holder
(whose share of sessions and training models it spends).

    tenancy = Tenancy(api_keys={"tml-a", "tml-b"})     # keyed: only these keys; each key is owner and quota holder
    tenancy = Tenancy(open_mode=True)                  # any tml- key; quotas per client address
    who = tenancy.owner(headers)                        # WireError 401 for a missing or wrong key
    holder = tenancy.quota_holder(who, client_host)

In open mode a key costs nothing to make up, so it cannot be what quotas count: six invented keys would take
every session and model. There the client's address is the holder (all keys from one address share its quota);
behind a proxy every client has the proxy's address, so an open server behind one is one tenant's.

A training run's record (`run.json`) is made here too, from what this request's owner chose and nothing else: a
checkpoint loaded from another run (another key's published one, or an older run of one's own) gives weights,
never identity, so the new run's saves belong to a store run of its own (`new_run_record`).
"""

from __future__ import annotations

import hmac
import time

from strop.tinker_wire.codec import WireError
from strop.tinker_wire.service import owner_of

LORA_FIELDS = ("train_attn", "train_mlp", "train_unembed", "seed")


class Tenancy:
    def __init__(self, api_keys: set[str] | None = None, *, open_mode: bool = False):
        if api_keys is None and not open_mode:
            raise ValueError("a tinker server needs api_keys (the keys it accepts) or open_mode=True (any key, "
                             "quotas per client address)")
        if api_keys is not None and open_mode:
            raise ValueError("api_keys and open_mode exclude each other: keys given means only those keys")
        self.api_keys = None if api_keys is None else {k.encode() for k in api_keys}
        self.open_mode = open_mode

    def owner(self, headers) -> str:
        key = headers.get("x-api-key")
        if key is None and headers.get("authorization", "").lower().startswith("bearer "):
            key = headers["authorization"][7:].strip()
        if not key:
            raise WireError("this server needs an API key: set TINKER_API_KEY (the SDK sends it as X-API-Key)", 401)
        if self.api_keys is not None and not any(hmac.compare_digest(key.encode(), k) for k in self.api_keys):
            raise WireError("wrong API key: use one this server was started with (strop serve-tinker --api-key-env)",
                            401)
        return owner_of(key)

    def quota_holder(self, owner: str, client_host: str | None) -> str:
        if not self.open_mode:
            return owner
        return f"address:{client_host or 'unknown'}"


def new_run_record(*, owner: str, base_model: str, lora_rank: int, lora: dict, project_id: str | None,
                   user_metadata: dict | None = None, loaded_from: str | None = None) -> dict:
    """A fresh run.json for a training run `owner` made: its LoRA shape, and no store run yet (its first saved
    checkpoint makes one). Deliberately built field by field, never copied from another run's record."""
    record = {"base_model": base_model, "owner": owner, "lora_rank": int(lora_rank),
              **{k: lora.get(k) for k in LORA_FIELDS}, "created": time.time(), "user_metadata": user_metadata,
              "project_id": project_id}
    if loaded_from is not None:
        record["loaded_from"] = loaded_from
    return record
