"""Bridges the rules' plain counter dictionaries to Beam `Metrics` counters.

The rules and stages are pure functions `fn(element, counters, **kwargs) -> outputs` that record
what they did in a `collections.Counter`, so they are tested without Beam. `CountingFn` runs such
a function inside a pipeline and adds each count to the Beam counter of the same name in its
namespace; the runner aggregates them across workers and the pipeline writes them to the stats
file.
"""

import collections
from typing import Any, Callable, Iterable

import apache_beam as beam
from apache_beam.metrics import Metrics

StageFn = Callable[..., Iterable[Any]]


class CountingFn(beam.DoFn):
    """A DoFn running `fn(element, counters, **kwargs)` and exporting its counters.

    Args:
        namespace: the Beam metrics namespace (a section of the stats file).
        fn: returns (or yields) the outputs for one element; its counts are exported once the
            outputs are exhausted, so a generator may count as it goes.
        **kwargs: passed to `fn` after the counters.
    """

    def __init__(self, namespace: str, fn: StageFn, **kwargs):
        super().__init__()
        self._namespace = namespace
        self._fn = fn
        self._kwargs = kwargs
        self._metrics = {}

    def _counter(self, name: str):
        counter = self._metrics.get(name)
        if counter is None:
            counter = self._metrics[name] = Metrics.counter(self._namespace, name)
        return counter

    def process(self, element):
        counters = collections.Counter()
        yield from self._fn(element, counters, **self._kwargs)
        for name, count in counters.items():
            self._counter(name).inc(count)
