"""Reinforcement learning: pure advantage functions (`strop.rl.advantages`; the losses are the engine's), one rollout
path for datasets and environments (`types`, `episodes`, `rollouts`), one training step (`step`), the GRPO loop
(`grpo`), run files (`metrics`, `checkpoints`).

    from strop.rl import GRPOConfig, run_grpo
"""


def __getattr__(name):
    # the loop pulls in models and data; importing strop.rl.advantages alone must stay light
    if name in ("GRPOConfig",):
        from strop.rl.config import GRPOConfig  # lazy, as the loop below
        return GRPOConfig
    if name in ("run_grpo", "RunResult"):
        from strop.rl import grpo  # lazy: the loop pulls in torch, transformers and peft
        return getattr(grpo, name)
    raise AttributeError(name)


__all__ = ["GRPOConfig", "run_grpo", "RunResult"]
