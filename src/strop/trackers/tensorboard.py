"""TensorBoard: the run folder's events/, written in the loop's thread (local files; `strop runs tensorboard
RUN` serves them). No sample table: TensorBoard has none."""

from __future__ import annotations

from pathlib import Path


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, folder: Path, start_step: int = 0):
        from torch.utils.tensorboard import SummaryWriter  # lazy: tensorboard is slow to import, read-only users skip it
        # purge_step hides events a dead process wrote past the checkpoint we resume from
        self.writer = SummaryWriter(str(folder), purge_step=start_step if start_step else None)

    def log_metrics(self, step: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()
