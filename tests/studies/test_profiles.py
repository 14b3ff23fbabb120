"""The study files' step counts under each profile: the arms that train longer, or pretrain and
fine-tune in one run, take the paper's multiples and sums of the baseline's steps (Section 3.5.2:
multi-task training for 2^19 + 2^18 steps, pretraining + fine-tuning; Section 3.6: 2x and 4x
the steps), whatever the profile's baseline is. The study files once wrote these counts
themselves and kept a former profile's (800 steps of multi-task training after the baseline
became 1,000 + 300)."""

import os
import re

import gin
import pytest

from t2t import runs

STEPS = re.compile(r"^TRAIN_STEPS = (\d+)$")


def _steps(stage) -> int | None:
    """The stage's TRAIN_STEPS (the last binding of it wins); None for an evaluation."""
    if stage.get("evaluate"):
        return None
    found, todo = [], list(stage.get("bindings", ()))
    while todo:
        item = todo.pop(0)
        if isinstance(item, gin.config.ConfigurableReference):  # a profile's macro
            item = item.scoped_configurable_fn()
        if isinstance(item, (list, tuple)):
            todo[:0] = list(item)
        elif match := STEPS.match(item):
            found.append(int(match.group(1)))
    assert found, f"stage {stage['name']!r} binds no TRAIN_STEPS: it would take its file's"
    return found[-1]


def _arms(study: str, profile: str) -> dict[str, list[int | None]]:
    root = os.path.join(runs.default_search_paths()[0], "studies")
    files = [os.path.join(root, f"{study}.gin"), os.path.join(root, "profiles", f"{profile}.gin")]
    runs.configure(files, [])
    try:  # the macros are read while the files are bound
        arms = gin.query_parameter("t2t.studies.run.arms")
        return {arm["name"]: [_steps(stage) for stage in arm["stages"]] for arm in arms}
    finally:
        gin.clear_config()


@pytest.mark.parametrize("profile", ["builtin_tiny", "t5_base_tfds"])
def test_longer_arms_take_the_papers_multiples_of_the_baseline_steps(profile):
    scaling = _arms("scaling", profile)
    pretrain, finetune = scaling["baseline"]
    assert scaling["4x training steps"] == [4 * pretrain, 4 * finetune]
    assert scaling["2x size, 2x steps"] == [2 * pretrain, 2 * finetune]
    assert scaling["4x batch size"] == scaling["4x size"] == [pretrain, finetune]

    mixing = _arms("mixing", profile)
    assert mixing.pop("pre-train, fine-tune") == [pretrain, finetune]
    assert len(mixing) == 7
    assert all(steps == [pretrain + finetune, None] for steps in mixing.values())

    multitask = _arms("multitask", profile)
    assert multitask["pre-train, fine-tune"] == [pretrain, finetune]
    assert multitask["multi-task training"] == [pretrain + finetune, None]
    for name in (
        "multi-task pre-training, fine-tune",
        "leave-one-out",
        "supervised multi-task pre-training",
    ):
        assert multitask[name] == [pretrain, finetune]
