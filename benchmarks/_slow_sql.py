"""finance-sql behind a network: every tool call first waits `latency_ms` (a database or API across the network),
for benchmarks/ray_scaling.py. A 'module:Class' environment: `_slow_sql:SlowFinanceSQL`, with benchmarks/ on
PYTHONPATH (the Ray actors read it too)."""

from __future__ import annotations

import time

from strop.envs.finance_sql import FinanceSQLEnv


class SlowFinanceSQL(FinanceSQLEnv):
    def __init__(self, latency_ms: float = 50.0, **options):
        super().__init__(**options)
        self.latency = latency_ms / 1000.0

    def step(self, call):
        time.sleep(self.latency)
        return super().step(call)
