"""`t2t export` and `t2t average`: run functions that turn checkpoints into a HF-format release
directory or into their mean."""

from __future__ import annotations

from collections.abc import Sequence

import gin

from t2t.runs.helpers import refuse_overwriting_inputs, require


@gin.configurable(module="t2t.runs")
def export(
    model_dir: str | None = None,
    output_dir: str | None = None,
    *,
    step: int | None = None,
    vocabulary_file: str | None = None,
    eval_results: str | None = None,
    overwrite: bool = False,
) -> str:
    """Writes a HF-format release directory from a checkpoint (see `t2t.release.export`)."""
    from t2t import release
    from t2t.data import vocab

    refuse_overwriting_inputs(
        {"--output_dir": output_dir},
        {"--vocabulary_file": vocabulary_file, "--eval_results": eval_results},
        {"--model_dir": model_dir},
    )
    if vocabulary_file is not None:
        vocab.check_model_file(vocabulary_file)
    path = release.export(
        require(model_dir, "--model_dir", "export.model_dir"),
        require(output_dir, "--output_dir", "export.output_dir"),
        step=step,
        vocabulary_file=vocabulary_file,
        eval_results=eval_results,
        overwrite=overwrite,
    )
    print(f"wrote the release directory {path}")
    return path


@gin.configurable(module="t2t.runs")
def average(
    model_dir: str | None = None,
    output_dir: str | None = None,
    *,
    last: int | None = None,
    steps: Sequence[int] | None = None,
) -> str:
    """Averages the last N (or the given) checkpoints into a new model directory."""
    from t2t.checkpoints import averaging

    refuse_overwriting_inputs({"--output_dir": output_dir}, model_dirs={"--model_dir": model_dir})
    averaged = averaging.average_checkpoints(
        require(model_dir, "--model_dir", "average.model_dir"), steps=steps, last=last
    )
    path = averaging.write_averaged(
        require(output_dir, "--output_dir", "average.output_dir"), averaged
    )
    print(f"averaged steps {averaged.steps} of {model_dir} into {path}")
    return path


@gin.configurable(module="t2t.runs")
def convert(
    source: str | None = None,
    destination: str | None = None,
    *,
    to: str | None = None,
    step: int | None = None,
    dtype: str | None = None,
    vocabulary_file: str | None = None,
) -> str:
    """Writes a checkpoint of any format t2t reads in another (see `t2t.conversion`)."""
    from t2t import conversion
    from t2t.data import vocab

    source = require(source, "SOURCE", "convert.source")
    destination = require(destination, "DESTINATION", "convert.destination")
    refuse_overwriting_inputs(
        {"DESTINATION": destination}, {"SOURCE": source, "--vocabulary_file": vocabulary_file}
    )
    if vocabulary_file is not None:
        vocab.check_model_file(vocabulary_file)
    written = [0]

    def progress(name: str) -> None:
        written[0] += 1
        if written[0] % 50 == 0:
            print(f"  {written[0]} arrays written ({name})", flush=True)

    path = conversion.convert(
        source,
        destination,
        require(to, "--to", "convert.to"),
        step=step,
        dtype=dtype,
        vocabulary_file=vocabulary_file,
        on_array=progress,
    )
    print(f"wrote the {to} checkpoint {path}")
    return path
