"""Objective knobs from gin reach every task built on the objective (here the built-in corpus's),
and the BERT-style row defaults to the paper's 90% mask / 10% random split."""

import pytest

from t2t import runs
from t2t.data import pipeline

DEMO = "gin/experiments/tiny_builtin_demo.gin"
LENGTHS = {"inputs": 128, "targets": 128}


@pytest.fixture(scope="module", autouse=True)
def _builtin(builtin_tasks):
    return builtin_tasks


def first_batch(task, *bindings):
    runs.configure([DEMO], ["MODEL_DIR = '/tmp/unused'", *bindings])
    config = pipeline.PipelineConfig(
        task, LENGTHS, global_batch_size=16, pack=False, shuffle=False, num_epochs=1
    )
    return next(pipeline.InputPipeline(config))


def noise_fraction(batch):
    inputs = (batch["encoder_input_tokens"] > 0).sum()
    targets = (batch["decoder_target_tokens"] > 0).sum()
    return targets / (inputs + targets)  # targets hold the noise (and sentinels)


def test_a_gin_binding_sets_the_corruption_rate_of_a_registered_task():
    default = noise_fraction(first_batch("builtin_span_corruption"))
    half = noise_fraction(
        first_batch("builtin_span_corruption", "span_corruption.noise_density = 0.5")
    )
    assert 0.14 < default < 0.22 and 0.45 < half < 0.55, (default, half)
    import gin

    assert "span_corruption.noise_density = 0.5" in gin.operative_config_str()


def sentinel_ids(task):
    import seqio

    vocabulary = seqio.get_mixture_or_task(task).output_features["targets"].vocabulary
    size = vocabulary.vocab_size  # the extra ids are the top 100, extra_id_0 the highest
    return size - vocabulary.extra_ids, size - 1


def test_a_gin_binding_sets_the_mean_span_length():
    low, _ = sentinel_ids("builtin_span_corruption")

    def spans(batch):  # sentinels in the inputs: one per noise span
        return (batch["encoder_input_tokens"] >= low).sum()

    short = spans(first_batch("builtin_span_corruption"))
    long = spans(
        first_batch("builtin_span_corruption", "span_corruption.mean_noise_span_length = 10.0")
    )
    assert 2.5 < short / long < 4.0, (short, long)  # about 10 / 3 times fewer spans


def test_bert_style_defaults_to_the_papers_split_and_takes_berts():
    _, mask_id = sentinel_ids("builtin_bert_style")

    def shares(batch):  # of the corrupted tokens: masked, and changed at all
        inputs, targets = batch["encoder_input_tokens"], batch["decoder_target_tokens"]
        real = targets > 0
        masked = ((inputs == mask_id) & real).sum()
        changed = ((inputs != targets) & real).sum()
        return masked, changed, real.sum()

    masked, changed, total = shares(first_batch("builtin_bert_style"))
    # The paper's row: 15% corrupted, all of them changed, 90% to the mask token (the rest to
    # random tokens, a few of which happen to equal the original).
    assert masked / total == pytest.approx(0.15 * 0.9, abs=0.02)
    assert changed / total == pytest.approx(0.15, abs=0.02)
    bert = shares(first_batch("builtin_bert_style", "bert_style.mask_rate = 0.8"))
    # BERT's: 80% masked, 10% random, 10% kept as they were (corrupted but unchanged).
    assert bert[0] / bert[2] == pytest.approx(0.15 * 0.8, abs=0.02)
    assert bert[1] / bert[2] == pytest.approx(0.15 * 0.9, abs=0.02)
    # Those shares alone cannot tell 0.8 from 0.9 in one batch; paired they can: the same
    # tokens are corrupted under both splits, and BERT's masks 8/9 of what the paper's masks
    # and changes 9/10 of what it changes (an ignored binding gives 1 and 1; 0.7 gives 7/9).
    assert bert[2] == total
    assert bert[0] / masked == pytest.approx(0.8 / 0.9, abs=0.03)
    assert bert[1] / changed == pytest.approx(0.9, abs=0.03)
