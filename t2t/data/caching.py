"""Offline preprocessing of registered tasks into seqio caches, with Apache Beam.

A task whose preprocessors contain `seqio.CacheDatasetPlaceholder()` can run everything before
the placeholder once, offline, and training then reads the result (`use_cached=True`) instead of
tokenizing on the fly. This module builds those caches the way seqio's own `cache_tasks_main`
does (seqio's `beam_utils` transforms, the same file layout: TFRecord shards, `info.*.json`,
`stats.*.json` and `COMPLETED` per task), but as a function with t2t's messages, not an absl
program:

    t2t cache --task builtin_summarize --output_cache_dir /data/seqio_cache
    t2t train ... --seqio_cache_dir /data/seqio_cache --gin.t2t.runs.DataOptions.use_cached=True

Beam runs locally (DirectRunner) by default; any Beam pipeline option selects another runner,
e.g. `--pipeline_option=--runner=DataflowRunner --pipeline_option=--project=P
--pipeline_option=--region=R --pipeline_option=--temp_location=gs://B/tmp` (workers then need
t2t installed and the task modules named with `--module`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import seqio

from t2t import files
from t2t.errors import UserError

COMPLETED = "COMPLETED"


def tasks_to_cache(names: Sequence[str]) -> list[seqio.Task]:
    """The tasks of `names` (mixtures expanded, each task once), checked to support caching."""
    from t2t.data import registry

    tasks: dict[str, seqio.Task] = {}
    for name in names:
        for task in seqio.get_subtasks(registry.get_task_or_mixture(name)):
            tasks.setdefault(task.name, task)
    for task in tasks.values():
        if not task.supports_caching:
            raise UserError(
                f"Task {task.name} cannot be cached: its preprocessors have no "
                "seqio.CacheDatasetPlaceholder() (add one after the deterministic steps, e.g. "
                "after tokenization), or it depends on the sequence length before it."
            )
        registry.check_ready(task)
    return list(tasks.values())


def cache_tasks(
    names: Sequence[str],
    output_cache_dir: str,
    *,
    modules: Sequence[str] = (),
    pipeline_options: Sequence[str] = (),
    overwrite: bool = False,
    report: Callable[[str], None] = print,
) -> dict[str, str]:
    """Preprocesses every split of the tasks of `names` into `output_cache_dir`.

    Args:
      names: task or mixture names.
      output_cache_dir: the cache root; task T goes to `<root>/<seqio task dir of T>`.
      modules: modules registering the tasks, imported by Beam workers in other processes.
      pipeline_options: Beam pipeline options (default: the local DirectRunner).
      overwrite: rebuild tasks already cached under `output_cache_dir`.
      report: progress lines.

    Returns:
      {task name: its cache directory} for every task now cached there.
    """
    import apache_beam as beam

    tasks = tasks_to_cache(names)
    directories = {
        task.name: files.join(output_cache_dir, seqio.get_task_dir_from_name(task.name))
        for task in tasks
    }
    todo = []
    for task in tasks:
        directory = directories[task.name]
        if files.exists(files.join(directory, COMPLETED)) and not overwrite:
            report(f"{task.name}: already cached in {directory} (--overwrite rebuilds it)")
            continue
        files.rmtree(directory)  # an interrupted or replaced cache
        todo.append(task)
    if not todo:
        return directories
    start = time.time()
    options = beam.options.pipeline_options.PipelineOptions(list(pipeline_options))
    with beam.Pipeline(options=options) as pipeline:
        for task in todo:
            for split in task.splits:
                _cache_split(pipeline, task, split, directories[task.name], modules, report)
    for task in todo:  # written once every split is, so a half-built cache is never read
        files.write_text(files.join(directories[task.name], COMPLETED), "")
    report(f"cached {len(todo)} task(s) in {time.time() - start:.1f} s")
    return directories


def _cache_split(pipeline, task, split: str, directory: str, modules, report) -> None:
    """Adds one split's preprocessing to `pipeline`: its examples, info and statistics written
    where seqio reads a cache."""
    import apache_beam as beam
    from seqio import beam_utils

    label = f"{task.name}_{split}"
    preprocess = beam_utils.PreprocessTask(task, split, modules_to_import=list(modules))
    shards = len(preprocess.shards)
    report(f"{task.name}/{split}: {shards} source shard(s) -> {directory}")
    examples = (
        pipeline | f"{label}_preprocess" >> preprocess | f"{label}_shuffle" >> beam.Reshuffle()
    )
    _ = examples | f"{label}_write" >> beam_utils.WriteExampleTfRecord(
        seqio.get_cached_tfrecord_prefix(directory, split), num_shards=shards
    )
    _ = (
        examples
        | f"{label}_info" >> beam_utils.GetInfo(shards)
        | f"{label}_write_info"
        >> beam_utils.WriteJson(seqio.get_cached_info_path(directory, split))
    )
    _ = (
        examples
        | f"{label}_stats" >> beam_utils.GetStats(task.output_features)
        | f"{label}_write_stats"
        >> beam_utils.WriteJson(seqio.get_cached_stats_path(directory, split))
    )
