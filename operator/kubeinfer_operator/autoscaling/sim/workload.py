"""Load traces and the requests drawn from them.

A trace gives the offered load per second in "replicas' worth": 1.0 is the request rate one replica serves
at full batch. That keeps the traces meaningful whatever the server constants are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Requests:
    arrival: np.ndarray  # seconds, sorted
    prompt: np.ndarray  # tokens
    output: np.ndarray  # tokens to generate


@dataclass(frozen=True)
class Shape:
    """Request sizes: log-normal, clipped; the means are those of the unclipped distribution."""

    prompt_mean: float = 256
    output_mean: float = 128
    sigma: float = 0.8
    prompt_max: int = 1024
    output_max: int = 512

    def draw(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        def lognormal(mean: float, hi: int) -> np.ndarray:
            mu = np.log(mean) - self.sigma**2 / 2
            return np.clip(np.round(rng.lognormal(mu, self.sigma, n)), 8, hi)

        return lognormal(self.prompt_mean, self.prompt_max), lognormal(self.output_mean, self.output_max)


def _step(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    # A sudden doubling that lasts, then a drop back: scale-up without cascade, then scale-down.
    return np.where((t >= 600) & (t < 1500), 8.0, 4.0)


def _ramp(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.interp(t, [0, 300, 1200, 1500, 2100, 2400], [2, 2, 12, 12, 2, 2])


def _diurnal(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    # A day compressed into an hour, with minute-scale wobble on top of the daily swing.
    wobble = np.repeat(rng.normal(0, 0.05, len(t) // 60 + 1), 60)[: len(t)]
    return (2 + 8 * (1 - np.cos(2 * np.pi * t / 3600)) / 2) * (1 + wobble)


def _bursts(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    # Steady base load with surges of 1.5-2x lasting 1-3 minutes, a few minutes apart.
    load = np.full(len(t), 5.0)
    start = 300.0
    while start < t[-1] - 300:
        length = rng.uniform(60, 180)
        load[(t >= start) & (t < start + length)] *= rng.uniform(1.5, 2.0)
        start += length + rng.uniform(240, 480)
    return load


TRACES: dict[str, tuple[float, Callable[[np.ndarray, np.random.Generator], np.ndarray]]] = {
    "step": (2400, _step),
    "ramp": (2400, _ramp),
    "diurnal": (3600, _diurnal),
    "bursts": (2400, _bursts),
}


def load_profile(trace: str, rng: np.random.Generator, duration: float | None = None) -> np.ndarray:
    """Offered load (replicas' worth) for each second of the trace."""
    natural, shape = TRACES[trace]
    return shape(np.arange(int(duration or natural), dtype=float), rng)


def make_requests(load: np.ndarray, replica_rps: float, shape: Shape, rng: np.random.Generator) -> Requests:
    """Poisson arrivals following the profile; replica_rps converts replicas' worth to requests/s."""
    counts = rng.poisson(load * replica_rps)
    arrival = np.sort(np.repeat(np.arange(len(load)), counts) + rng.random(counts.sum()))
    prompt, output = shape.draw(len(arrival), rng)
    return Requests(arrival, prompt, output)
