"""Serve a base or tuned model as an OpenAI-compatible API (`/v1/chat/completions`, `/v1/models`)."""

from strop.serve.server import make_server

__all__ = ["make_server"]
