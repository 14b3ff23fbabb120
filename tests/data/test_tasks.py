"""Every registered task yields formatted, tokenized examples: TFDS ones under mock data, built-in
ones from the real corpus. Registered mixtures name only registered tasks and mix as the paper."""

import importlib

import numpy as np
import pytest
import seqio
import tensorflow_datasets as tfds

from t2t.data import mixing

PRETRAIN_LENGTHS = {"inputs": 128, "targets": 64}
SUPERVISED_LENGTHS = {"inputs": 256, "targets": 64}
# Each supervised task's input prefix (docs/spec.md section 10) and whether its targets are labels.
PREFIXES = {
    "glue_cola": "cola sentence: ",
    "glue_sst2": "sst2 sentence: ",
    "glue_mrpc": "mrpc sentence1: ",
    "glue_qqp": "qqp question1: ",
    "glue_stsb": "stsb sentence1: ",
    "glue_mnli": "mnli hypothesis: ",
    "glue_mnli_matched": "mnli hypothesis: ",
    "glue_mnli_mismatched": "mnli hypothesis: ",
    "glue_qnli": "qnli question: ",
    "glue_rte": "rte sentence1: ",
    "glue_wnli": "wnli sentence1: ",
    "glue_ax": "mnli hypothesis: ",
    "super_glue_boolq": "boolq passage: ",
    "super_glue_cb": "cb hypothesis: ",
    "super_glue_copa": "copa choice1: ",
    "super_glue_multirc": "multirc question: ",
    "super_glue_record": "record query: ",
    "super_glue_rte": "rte hypothesis: ",
    "super_glue_wic": "wic sentence1: ",
    "super_glue_wsc_simple_train": "wsc: ",
    "super_glue_wsc_simple_eval": "wsc: ",
    "dpr_simple": "wsc: ",
    "super_glue_axb": "rte sentence1: ",
    "super_glue_axg": "rte hypothesis: ",
    "squad": "question: ",
    "cnn_dailymail": "summarize: ",
    "wmt_ende": "translate English to German: ",
    "wmt_enfr": "translate English to French: ",
    "wmt_enro": "translate English to Romanian: ",
    "builtin_summarize": "summarize: ",
    "builtin_package": "package docstring: ",
}
LABEL_TASKS = {
    name
    for name in PREFIXES
    if name.startswith(("glue_", "super_glue_")) and "record" not in name and "wsc" not in name
} - {"glue_stsb"}


def _registered(module_name, vocabulary):
    module = importlib.import_module(f"t2t.data.tasks.{module_name}")
    names = module.register(vocabulary)  # again, with the test vocabulary (the default is remote)
    return [n for n in names if n in seqio.TaskRegistry.names()]


def _examples(task, lengths, n=2):
    split = "train" if "train" in task.splits else sorted(task.splits)[0]
    # NOTE: no in-memory caching: deciding it asks TFDS for split sizes, unknown under mock data.
    dataset = task.get_dataset(lengths, split=split, shuffle=False, seed=0, try_in_mem_cache=False)
    return list(dataset.take(n).as_numpy_iterator())


def _check_tokens(example, vocabulary, lengths):
    for key in ("inputs", "targets"):
        if key not in example:
            continue
        ids = example[key]
        assert ids.dtype == np.int32 and 0 < len(ids) <= lengths[key], key
        assert ids[-1] == vocabulary.eos_id or len(ids) == lengths[key], key
        assert 0 not in ids[:-1] and ids.max() < vocabulary.vocab_size, key


def _check_supervised(name, task, vocabulary):
    examples = _examples(task, SUPERVISED_LENGTHS)
    assert examples, f"{name} yielded nothing"
    for example in examples:
        _check_tokens(example, vocabulary, SUPERVISED_LENGTHS)
        inputs = example["inputs_pretokenized"].decode()
        assert inputs.startswith(PREFIXES[name]), (name, inputs[:60])
        if len(example["inputs"]) < SUPERVISED_LENGTHS["inputs"]:
            assert vocabulary.decode(example["inputs"][:-1].tolist()) == " ".join(inputs.split())
        target = example["targets_pretokenized"].decode()
        if name in LABEL_TASKS:
            label = task.postprocess_fn(target, example=example, is_target=True)
            label = label["value"] if isinstance(label, dict) else label  # MultiRC keeps its group
            assert label != -1, (name, target)
    _check_metrics_on_gold(name, task, examples)


def _check_metrics_on_gold(name, task, examples):
    """Postprocessors and metrics fit together: predicting the gold target text scores perfectly."""

    def post(value, example, is_target):
        return (
            task.postprocess_fn(value, example=example, is_target=is_target)
            if task.postprocess_fn
            else value
        )

    targets = [post(e["targets_pretokenized"].decode(), e, True) for e in examples]
    predictions = [post(e["targets_pretokenized"].decode(), e, False) for e in examples]
    for metric_fn in task.metric_fns:
        scores = metric_fn(targets, predictions)
        assert scores and all(isinstance(v, float) for v in scores.values()), (name, scores)
        for key in ("accuracy", "em", "exact_match"):
            if key in scores and "wsc" not in name:  # a WSC target is a label, not the gold text
                assert scores[key] == 100.0, (name, scores)


@pytest.fixture(scope="module")
def mocked():
    with tfds.testing.mock_data(num_examples=4, policy=tfds.testing.MockPolicy.USE_CODE):
        yield


@pytest.mark.parametrize("module_name", ["glue", "superglue", "generation"])
def test_supervised_tfds_tasks_under_mock_data(module_name, builtin_vocabulary, mocked):
    names = _registered(module_name, builtin_vocabulary)
    assert set(names) <= set(PREFIXES)
    for name in names:
        task = seqio.get_mixture_or_task(name)
        assert task.metric_fns or name in ("glue_ax", "super_glue_axb", "super_glue_axg"), name
        _check_supervised(name, task, builtin_vocabulary)


def test_c4_objective_tasks_under_mock_data(builtin_vocabulary, mocked):
    names = _registered("c4", builtin_vocabulary)
    assert "c4_span_corruption" in names and len(names) == 17
    first_sentinel = builtin_vocabulary.vocab_size - 1
    for name in names:
        examples = _examples(seqio.get_mixture_or_task(name), PRETRAIN_LENGTHS)
        assert examples, f"{name} yielded nothing"
        for example in examples:
            _check_tokens(example, builtin_vocabulary, PRETRAIN_LENGTHS)
            if name == "c4_full_lm":
                assert "inputs" not in example
            if "span_corruption" in name:
                assert example["inputs"].max() == example["targets"][0] == first_sentinel


def test_builtin_tasks_from_real_text(builtin_tasks, builtin_vocabulary):
    assert "builtin_span_corruption" in builtin_tasks and "builtin_summarize" in builtin_tasks
    for name in builtin_tasks:
        task = seqio.get_mixture_or_task(name)
        if isinstance(task, seqio.Mixture):
            assert sum(mixing.proportions(task).values()) == pytest.approx(1.0)
            continue
        assert (
            task.output_features["targets"].vocabulary.vocab_size == builtin_vocabulary.vocab_size
        )
        if name in PREFIXES:
            _check_supervised(name, task, builtin_vocabulary)
            continue
        examples = _examples(task, PRETRAIN_LENGTHS)
        for example in examples:
            _check_tokens(example, builtin_vocabulary, PRETRAIN_LENGTHS)
        if name in ("builtin_span_corruption", "builtin_unfiltered_span_corruption"):
            # full-length segments of real text
            assert [len(e["inputs"]) for e in examples] == [128, 128]


def test_builtin_package_targets_are_labels(builtin_tasks, builtin_corpus):
    labels = set(builtin_corpus.stats["package_labels"])
    task = seqio.get_mixture_or_task("builtin_package")
    examples = _examples(task, SUPERVISED_LENGTHS, n=20)
    assert {e["targets_pretokenized"].decode() for e in examples} <= labels


@pytest.fixture
def published_sizes(monkeypatch):
    """Sizes of each training split (the TFDS catalog), in place of TFDS metadata offline."""
    sizes = {
        "c4_span_corruption": 364_868_892,
        "glue_cola": 8_551,
        "glue_sst2": 67_349,
        "glue_mrpc": 3_668,
        "glue_qqp": 363_846,
        "glue_stsb": 5_749,
        "glue_mnli": 392_702,
        "glue_qnli": 104_743,
        "glue_rte": 2_490,
        "super_glue_boolq": 9_427,
        "super_glue_cb": 250,
        "super_glue_copa": 400,
        "super_glue_multirc": 27_243,
        "super_glue_record": 100_730,
        "super_glue_rte": 2_490,
        "super_glue_wic": 5_428,
        "super_glue_wsc_simple_train": 554,
        "dpr_simple": 1_322,
        "squad": 87_599,
        "cnn_dailymail": 287_113,
        "wmt_ende": 4_592_289,
        "wmt_enfr": 40_853_298,
        "wmt_enro": 610_320,
    }
    monkeypatch.setattr(seqio.Task, "num_input_examples", lambda task, split: sizes[task.name])
    return sizes


def test_paper_mixtures(builtin_vocabulary, published_sizes):
    module = importlib.import_module("t2t.data.tasks.mixtures")
    for name in module.MIXTURES:
        mixture = seqio.get_mixture_or_task(name)
        shares = mixing.proportions(mixture)
        assert sum(shares.values()) == pytest.approx(1.0)
    capped = seqio.get_mixture_or_task("all_proportional_k524288")
    for task in capped.tasks:
        expected = seqio.mixing_rate_num_examples(task, maximum=2**19)
        assert capped.get_rate(task) == pytest.approx(expected)
    base = mixing.proportions(seqio.get_mixture_or_task("all_multitask_base"))
    supervised = sum(
        min(n, 1_000_000) if name in ("wmt_ende", "wmt_enfr") else n
        for name, n in published_sizes.items()
        if name != "c4_span_corruption"
    )
    assert base["c4_span_corruption"] == pytest.approx(2_620_000 / (2_620_000 + supervised))
    assert base["wmt_enfr"] == pytest.approx(1_000_000 / (2_620_000 + supervised))
    left_out = seqio.get_mixture_or_task("leave_one_out_glue")
    assert not {t.name for t in left_out.tasks} & set(module.glue.TRAIN_TASKS)
    glue_mix = mixing.proportions(seqio.get_mixture_or_task("glue"))
    assert glue_mix["glue_wnli"] == 0.0 and glue_mix["glue_mnli"] > glue_mix["glue_rte"] > 0


def test_record_metric_scores_each_query_once():
    # Same numbers as the `record_metric` docstring.
    from t2t.data.tasks import superglue

    targets = [{"group": (0, 1), "value": ["Ann", "Anne"]}] * 2
    scores = superglue.record_metric(targets, [{"value": "anne"}, {"value": "Bob"}])
    assert scores["em"] == 100.0


def test_parse_tsv_example():
    # Same numbers as the `text.parse_tsv` docstring.
    import tensorflow as tf

    from t2t.data.tasks import text

    lines = tf.data.Dataset.from_tensor_slices(["Adds two numbers.\tReturn a sum."])
    (row,) = text.parse_tsv(lines, field_names=("body", "summary")).as_numpy_iterator()
    assert row == {"body": b"Adds two numbers.", "summary": b"Return a sum."}


def test_text_file_tasks(tmp_path, builtin_corpus, builtin_vocabulary):
    from t2t.data.tasks import text

    train = tmp_path / "train.txt"
    train.write_text(
        "\n".join(open(builtin_corpus.corpus_path("validation")).read().splitlines()[:50])
    )
    names = text.register_text_file_tasks(
        "mytext",
        {"train": str(train)},
        builtin_vocabulary,
        objectives=("span_corruption", "full_lm"),
    )
    assert names == ["mytext_span_corruption", "mytext_full_lm"]
    task = seqio.get_mixture_or_task("mytext_span_corruption")
    assert task.num_input_examples("train") == 50
    for example in _examples(task, PRETRAIN_LENGTHS):
        _check_tokens(example, builtin_vocabulary, PRETRAIN_LENGTHS)
    assert "inputs" not in seqio.get_mixture_or_task("mytext_full_lm").output_features
    with pytest.raises(ValueError, match="No file matches"):
        text.register_text_file_tasks(
            "missing", {"train": str(tmp_path / "nope*.txt")}, builtin_vocabulary
        )


def test_each_name_leads_to_the_one_module_that_registers_it(builtin_tasks):
    """A run naming a task imports only its owner (`tasks.import_for`): every name each module
    registers maps back to that module, and an unknown name imports nothing."""
    from t2t.data import tasks

    for module_name in tasks.MODULES:
        module = importlib.import_module(f"t2t.data.tasks.{module_name}")
        names = getattr(module, "TASKS", ()) or module.MIXTURES
        if module_name == "builtin":
            names = [*names, *module.MIXTURES]
        assert names
        for name in names:
            assert tasks.module_for(name) == module_name, name
    assert tasks.module_for("colaa") is None and tasks.import_for(["colaa"]) == []
    assert tasks.import_for(["glue_cola", "wmt_ende", "glue"]) == ["generation", "glue"]
