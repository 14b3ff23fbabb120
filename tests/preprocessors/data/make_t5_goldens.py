"""Writes `t5_goldens.json`: TFDS-shaped records and the `t5` package's outputs for them.

The goldens of `tests/preprocessors/test_formats.py` come from the paper's own implementation,
the `t5` package (0.9.4), which needs its own environment (it pins old dependencies):

    python3 -m venv /work/venv-t5ref
    /work/venv-t5ref/bin/pip install "tensorflow==2.21.*" tensorflow-text seqio "protobuf<7" \
        "sentencepiece<0.2.3" gin-config babel scikit-learn sacrebleu rouge-score nltk pandas future
    /work/venv-t5ref/bin/pip install --no-deps t5==0.9.4 mesh-tensorflow
    /work/venv-t5ref/bin/python tests/preprocessors/data/make_t5_goldens.py

The records below are written by hand in the shape (feature names and dtypes) of the TFDS builders
`glue/*`, `super_glue/*`, `definite_pronoun_resolution`, `squad`, `cnn_dailymail` and
`wmt*_translate`. The script only calls the t5 package's public preprocessors and postprocessors.
"""

import json
import pathlib

import tensorflow as tf
import tensorflow_datasets as tfds
from t5.data import glue_utils, postprocessors, preprocessors

OUT = pathlib.Path(__file__).with_name("t5_goldens.json")

# feature -> dtype of the TFDS builders; strings unless listed.
DTYPES = {
    "label": "int64",
    "idx": "int32",
    "span1_index": "int32",
    "span2_index": "int32",
    "start1": "int32",
    "start2": "int32",
    "end1": "int32",
    "end2": "int32",
}

GLUE_RECORDS = {
    "cola": [
        {"sentence": "The book was written by John.", "label": 1, "idx": 0},
        {"sentence": "Book the was John by written.", "label": 0, "idx": 1},
        {"sentence": "Whom did you see?", "label": -1, "idx": 2},
    ],
    "sst2": [
        {"sentence": "a gorgeous , witty , seductive movie . ", "label": 1, "idx": 7},
        {"sentence": "it 's a bad sign when you 're rooting for the villain", "label": 0, "idx": 8},
    ],
    "mrpc": [
        {
            "sentence1": "He said the foodservice pie business doesn't fit.",
            "sentence2": 'The pie business "does not fit" our long-term growth.',
            "label": 1,
            "idx": 3,
        },
        {"sentence1": "Shares rose 5%.", "sentence2": "Revenue fell in Q3.", "label": 0, "idx": 4},
    ],
    "qqp": [
        {
            "question1": "Why do I easily get bored of my friends?",
            "question2": "Why do I get bored of friends so quickly?",
            "label": 1,
            "idx": 10,
        },
        {
            "question1": "How do I learn Python?",
            "question2": "What is Java?",
            "label": 0,
            "idx": 11,
        },
    ],
    "stsb": [
        {
            "sentence1": "A man is playing a flute.",
            "sentence2": "A man is playing a flute.",
            "label": 5.0,
            "idx": 0,
        },
        {
            "sentence1": "Three more US soldiers killed in Afghanistan",
            "sentence2": "NATO Soldier Killed in Afghanistan",
            "label": 1.8,
            "idx": 1,
        },
        {"sentence1": "A cat sits.", "sentence2": "A dog runs.", "label": 3.25, "idx": 2},
        {"sentence1": "a", "sentence2": "b", "label": 0.1, "idx": 3},
        {"sentence1": "c", "sentence2": "d", "label": 2.7, "idx": 4},
    ],
    "mnli": [
        {
            "premise": "Conceptually cream skimming has two basic dimensions - product and geography.",
            "hypothesis": "Product and geography are what make cream skimming work. ",
            "label": 1,
            "idx": 0,
        },
        {"premise": "He's not here.", "hypothesis": "He is here.", "label": 2, "idx": 1},
        {"premise": "The café is open.", "hypothesis": "Something is open.", "label": 0, "idx": 2},
    ],
    "mnli_matched": [
        {"premise": "You can leave now.", "hypothesis": "You may go.", "label": -1, "idx": 5},
    ],
    "qnli": [
        {
            "question": "When did the war end?",
            "sentence": "The war ended in 1945.",
            "label": 0,
            "idx": 0,
        },
        {"question": "Who wrote it?", "sentence": "It rained all day.", "label": 1, "idx": 1},
    ],
    "rte": [
        {
            "sentence1": "No Weapons of Mass Destruction Found in Iraq Yet.",
            "sentence2": "Weapons of Mass Destruction Found in Iraq.",
            "label": 1,
            "idx": 0,
        },
        {
            "sentence1": "A place of sorrow, after Pope John Paul II died.",
            "sentence2": "Pope John Paul II died.",
            "label": 0,
            "idx": 1,
        },
    ],
    "wnli": [
        {
            "sentence1": "The fish ate the worm. It was tasty.",
            "sentence2": "The worm was tasty.",
            "label": 1,
            "idx": 0,
        },
        {
            "sentence1": "I stuck a pin through a carrot. When I pulled the pin out, it had a hole.",
            "sentence2": "The pin had a hole.",
            "label": 0,
            "idx": 1,
        },
    ],
    "ax": [
        {
            "premise": "The cat sat on the mat.",
            "hypothesis": "The mat was sat on.",
            "label": -1,
            "idx": 0,
        },
    ],
}

SUPER_GLUE_RECORDS = {
    "boolq": [
        {
            "question": "is france the same timezone as the uk",
            "passage": "At the Liberation of France in the summer of 1944, Metropolitan France kept GMT+2.",
            "label": 0,
            "idx": 0,
        },
        {
            "question": "do iran and afghanistan speak the same language",
            "passage": "Persian (/ˈpɜːrʒən/), also known by its endonym Farsi.",
            "label": 1,
            "idx": 1,
        },
    ],
    "cb": [
        {
            "premise": "It was a complex language. Not written down but handed down.",
            "hypothesis": "the language was peeled down",
            "label": 0,
            "idx": 0,
        },
        {
            "premise": "Valence the void-brain, Valence the virtuous valet.",
            "hypothesis": "Valence was helping",
            "label": 1,
            "idx": 1,
        },
        {"premise": "I don't know if it's true.", "hypothesis": "it's true", "label": 2, "idx": 2},
    ],
    "copa": [
        {
            "premise": "My body cast a shadow over the grass.",
            "choice1": "The sun was rising.",
            "choice2": "The grass was cut.",
            "question": "cause",
            "label": 0,
            "idx": 0,
        },
        {
            "premise": "The woman tolerated her friend's difficult behavior.",
            "choice1": "The woman knew her friend was going through a hard time.",
            "choice2": "The woman felt that her friend took advantage of her kindness.",
            "question": "effect",
            "label": 1,
            "idx": 1,
        },
    ],
    "multirc": [
        {
            "paragraph": "<b>Sent 1: </b>The sky is blue.<br><b>Sent 2: </b>Grass is green.<br>",
            "question": "What color is the sky?",
            "answer": "Blue",
            "label": 1,
            "idx": {"paragraph": 0, "question": 0, "answer": 0},
        },
        {
            "paragraph": "<b>Sent 1: </b>The sky is blue.<br>",
            "question": "What color is the sky?",
            "answer": "Red",
            "label": 0,
            "idx": {"paragraph": 0, "question": 0, "answer": 1},
        },
    ],
    "rte": [
        {
            "premise": "Dana Reeve, the widow of the actor Christopher Reeve, has died of lung cancer.",
            "hypothesis": "Christopher Reeve had an accident.",
            "label": 1,
            "idx": 0,
        },
        {
            "premise": "Yet, we now are discovering that antibiotics are losing their effectiveness.",
            "hypothesis": "Bacteria is winning the war against antibiotics.",
            "label": 0,
            "idx": 1,
        },
    ],
    "wic": [
        {
            "word": "place",
            "sentence1": "Do you want to come over to my place later?",
            "sentence2": "A political system with no place for the less prominent groups.",
            "start1": 31,
            "start2": 27,
            "end1": 36,
            "end2": 32,
            "label": 0,
            "idx": 0,
        },
        {
            "word": "beat",
            "sentence1": "We beat the competition.",
            "sentence2": "Agassi beat Becker.",
            "start1": 3,
            "start2": 7,
            "end1": 7,
            "end2": 11,
            "label": 1,
            "idx": 1,
        },
    ],
    "axb": [
        {
            "sentence1": "The cat sat on the mat.",
            "sentence2": "The cat did not sit on the mat.",
            "label": 1,
            "idx": 0,
        },
    ],
    "axg": [
        {
            "premise": "The nurse notified the patient that his shift would be ending in an hour.",
            "hypothesis": "The patient's shift would be ending.",
            "label": 1,
            "idx": 0,
        },
    ],
}

WSC_RECORDS = [
    {
        "text": "Mitchell asked Tom if he could lend some money.",
        "span1_index": 2,
        "span1_text": "Tom",
        "span2_index": 4,
        "span2_text": "he",
        "label": 0,
        "idx": 0,
    },
    {
        "text": "Mitchell asked Tom if he could lend some money.",
        "span1_index": 0,
        "span1_text": "Mitchell",
        "span2_index": 4,
        "span2_text": "he",
        "label": 1,
        "idx": 1,
    },
    {
        "text": "The trophy doesn't fit into the brown suitcase because it is too large.",
        "span1_index": 0,
        "span1_text": "The trophy",
        "span2_index": 9,
        "span2_text": "it",
        "label": 1,
        "idx": 2,
    },
    # The t5 package's two hand-written cases (the exact texts of super_glue/wsc.fixed): a
    # pronoun with punctuation attached, and a span2_index pointing at the word before it.
    {
        "text": "The boy continued to whip the pony , and eventually the pony threw him over. "
        'John laughed out quite loud. "Good for him," he said. ',
        "span1_index": 15,
        "span1_text": "John",
        "span2_index": 22,
        "span2_text": "him",
        "label": 1,
        "idx": 3,
    },
    {
        "text": "When they had eventually calmed down a bit , and had gotten home, Mr. Farley put "
        "the magic pebble in an iron safe . Some day they might want to use it , but really for "
        "now, what more could they wish for?",
        "span1_index": 16,
        "span1_text": "the magic pebble",
        "span2_index": 30,
        "span2_text": "it",
        "label": 1,
        "idx": 4,
    },
    # The pronoun as the last word (a space after it in the t5 package's output), and before
    # punctuation set apart by a space.
    {
        "text": "Tom gave Ralph a lift to school so Ralph wouldn't have to walk . Ralph thanked him",
        "span1_index": 0,
        "span1_text": "Tom",
        "span2_index": 16,
        "span2_text": "him",
        "label": 1,
        "idx": 5,
    },
    {
        "text": "Anna did a lot better than her good friend Lucy on the test because she had studied "
        "so hard .",
        "span1_index": 0,
        "span1_text": "Anna",
        "span2_index": 14,
        "span2_text": "she",
        "label": 1,
        "idx": 6,
    },
]

DPR_RECORDS = [
    {
        "sentence": "Bob asked Tom if he can lend some money.",
        "pronoun": "he",
        "candidates": ["Bob", "Tom"],
        "label": 1,
    },
    {
        "sentence": "The bee landed on the flower because it had pollen.",
        "pronoun": "it",
        "candidates": ["The bee", "the flower"],
        "label": 1,
    },
    {
        "sentence": "John hired Bill, so he paid him.",
        "pronoun": "he",
        "candidates": ["John", "Bill"],
        "label": 0,
    },
]

RECORD_RECORDS = [
    {
        "passage": "The harbor froze.\n@highlight\nShips stayed in port\n@highlight\nIce was thick.",
        "query": "@placeholder said the ice was thick.",
        "entities": ["Oslo", "Bergen", "Norway"],
        "answers": ["Oslo", "Norway"],
        "idx": {"passage": 0, "query": 0},
    },
    {
        "passage": "A quiet day in Paris.",
        "query": "@placeholder was quiet.",
        "entities": ["Paris"],
        "answers": [],
        "idx": {"passage": 1, "query": 3},
    },
]

SQUAD_RECORDS = [
    {
        "id": "56be4db0acb8001400a502ec",
        "title": "Oxygen",
        "context": "Hyperbaric (high-pressure) medicine uses special oxygen chambers to increase the "
        "partial pressure of O 2 around the patient and, when needed, the medical staff.",
        "question": "What does increased oxygen concentrations in the patient's lungs displace?",
        "answers": {"text": ["carbon monoxide", "carbon monoxide."], "answer_start": [10, 10]},
    },
]

CNNDM_RECORDS = [
    {
        "article": "(CNN) -- The city council voted on Monday to rebuild the bridge.",
        "highlights": "Council votes to rebuild bridge .",
        "publisher": "cnn",
        "id": "abc",
    },
]

WMT_RECORDS = {
    ("en", "de"): [{"en": "That is good.", "de": "Das ist gut."}],
    ("en", "fr"): [{"en": "I like tea.", "fr": "J'aime le thé."}],
    ("en", "ro"): [{"en": "Thank you.", "ro": "Mulțumesc."}],
}

POSTPROCESS_INPUTS = {
    "labels": ["entailment", "not_entailment", "neutral", "Entailment", "", "yes", "<unk>"],
    "floats": ["3.2", "0.0", "5", "-1.4", "abc", "", "3.2.1", "1e1"],
    "wsc": [
        ["The boy", "boy"],
        ["fuzzy bunny", "the bunny"],
        ["Bob", "Bob's hat"],
        ["the", "dog"],
        ["cat", "the dog"],
        ["", "dog"],
    ],
}


def _column(key, values):
    """One feature of all records as a tensor with the TFDS dtype."""
    if isinstance(values[0], dict):
        return {k: _column(k, [v[k] for v in values]) for k in values[0]}
    if isinstance(values[0], list):
        dtype = tf.int32 if values[0] and isinstance(values[0][0], int) else tf.string
        return tf.ragged.constant(values, dtype=dtype)
    if isinstance(values[0], float):
        return tf.constant(values, tf.float32)
    if isinstance(values[0], int):
        return tf.constant(values, getattr(tf, DTYPES.get(key, "int32")))
    return tf.constant(values, tf.string)


def _dataset(records):
    return tf.data.Dataset.from_tensor_slices(
        {k: _column(k, [r[k] for r in records]) for k in records[0]}
    )


def _outputs(dataset):
    def plain(value):
        if isinstance(value, bytes):
            return value.decode()
        if hasattr(value, "tolist"):
            return plain(value.tolist())
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value

    return [{k: plain(v) for k, v in ex.items()} for ex in dataset.as_numpy_iterator()]


def main():
    goldens = {"dtypes": DTYPES, "tasks": {}}

    def add(name, records, outputs):
        goldens["tasks"][name] = {"records": records, "outputs": outputs}

    for builder, record_sets in (("glue", GLUE_RECORDS), ("super_glue", SUPER_GLUE_RECORDS)):
        configs = tfds.builder_cls(builder).builder_configs
        for config, records in record_sets.items():
            preprocess = glue_utils.get_glue_text_preprocessor(configs[config])
            add(f"{builder}/{config}", records, _outputs(preprocess(_dataset(records))))
    add(
        "super_glue/wsc.fixed:simple",
        WSC_RECORDS,
        _outputs(preprocessors.wsc_simple(_dataset(WSC_RECORDS))),
    )
    add(
        "super_glue/wsc.fixed:simple_train",
        WSC_RECORDS,
        _outputs(preprocessors.wsc_simple(_dataset(WSC_RECORDS), correct_referent_only=True)),
    )
    dpr = preprocessors.definite_pronoun_resolution_simple(_dataset(DPR_RECORDS))
    add("definite_pronoun_resolution", DPR_RECORDS, _outputs(dpr))
    add(
        "super_glue/record",
        RECORD_RECORDS,
        _outputs(preprocessors.record(_dataset(RECORD_RECORDS))),
    )
    add("squad", SQUAD_RECORDS, _outputs(preprocessors.squad(_dataset(SQUAD_RECORDS))))
    summaries = preprocessors.summarize(
        _dataset(CNNDM_RECORDS), article_key="article", summary_key="highlights"
    )
    add("cnn_dailymail", CNNDM_RECORDS, _outputs(summaries))
    for (source, target), records in WMT_RECORDS.items():
        translated = preprocessors.translate(
            _dataset(records), source_language=source, target_language=target
        )
        add(f"wmt:{source}-{target}", records, _outputs(translated))

    labels = ("entailment", "not_entailment")
    goldens["postprocessors"] = {
        "string_label_to_class_id": [
            [s, postprocessors.string_label_to_class_id(s, label_classes=labels)]
            for s in POSTPROCESS_INPUTS["labels"]
        ],
        "string_to_float": [
            [s, postprocessors.string_to_float(s)] for s in POSTPROCESS_INPUTS["floats"]
        ],
        "wsc_simple": [
            [p, r, postprocessors.wsc_simple(p, example={"targets_pretokenized": r.encode()})]
            for p, r in POSTPROCESS_INPUTS["wsc"]
        ],
    }
    OUT.write_text(json.dumps(goldens, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT} ({len(goldens['tasks'])} tasks)")


if __name__ == "__main__":
    main()
