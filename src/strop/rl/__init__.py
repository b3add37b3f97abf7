"""Reinforcement learning: pure advantage functions (`strop.rl.advantages`; the losses are the engine's), the GRPO loop
(`strop.rl.grpo`), run files (`metrics`, `checkpoints`).

    from strop.rl import GRPOConfig, run_grpo
"""


def __getattr__(name):
    # the loop pulls in models and data; importing strop.rl.advantages alone must stay light
    if name in ("GRPOConfig",):
        from strop.rl.config import GRPOConfig
        return GRPOConfig
    if name in ("run_grpo", "RunResult"):
        from strop.rl import grpo
        return getattr(grpo, name)
    raise AttributeError(name)


__all__ = ["GRPOConfig", "run_grpo", "RunResult"]
