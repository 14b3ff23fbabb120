"""docs/data.md's "Your own tasks, end to end", run as written: its module and gin file are
written from the page, its commands run (with fewer training steps), its HF snippet executed."""

import json
import random
import re
import shlex

import pytest

from t2t import cli

DOC = "docs/data.md"
TOPICS = {
    "cooking": "salt pan oven onion garlic simmer bake flour butter pepper".split(),
    "sailing": "wind sail boat harbor mast tide rope anchor deck wave".split(),
    "gardening": "soil seed rose water prune leaf root spade bloom compost".split(),
}
COMMON = "the a of and to in on with for it was we then".split()
# Appended to each training command: a few steps instead of the recipes' hundreds, on the
# suite's micro network (the fine-tuning takes the pretrained one's).
SHORT = [
    "--gin_file=models/micro.gin",
    "--gin.TRAIN_STEPS=2",
    "--gin.t2t.runs.LoopOptions.progress=False",
    "--gin.t2t.runs.EvalOptions.num_predictions=0",
]


def _blocks(text: str) -> dict[str, str]:
    """The code blocks marked `<!-- walkthrough:NAME -->`, by name."""
    found = re.findall(r"<!-- walkthrough:(\S+) -->\n```[a-z]*\n(.*?)```", text, re.DOTALL)
    return dict(found)


def _write_data(root) -> None:
    rng = random.Random(0)

    def sentence(words):
        length = rng.randint(8, 20)
        return " ".join(rng.choice(words + COMMON) for _ in range(length)).capitalize() + "."

    (root / "data").mkdir()
    for split, count in (("train", 32), ("validation", 4)):
        topics = [rng.choice(list(TOPICS.values())) for _ in range(count)]
        notes = [" ".join(sentence(words) for _ in range(3)) for words in topics]
        (root / "data" / f"notes_{split}.txt").write_text("\n".join(notes) + "\n")
        rows = [(sentence(words), topic) for topic, words in TOPICS.items() for _ in range(count)]
        (root / "data" / f"topic_{split}.tsv").write_text("".join(f"{t}\t{y}\n" for t, y in rows))
    (root / "questions.jsonl").write_text(
        json.dumps({"inputs": "topic: The boat left the harbor with the wind in its sail."}) + "\n"
    )


def test_the_walkthrough_runs_as_written(tmp_path, monkeypatch, capsys):
    with open(DOC) as f:
        blocks = _blocks(f.read())
    assert set(blocks) == {"my_tasks.py", "my_finetune.gin", "commands", "hf.py"}
    _write_data(tmp_path)
    (tmp_path / "my_tasks.py").write_text(blocks["my_tasks.py"])
    (tmp_path / "my_finetune.gin").write_text(blocks["my_finetune.gin"])
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))

    commands = [shlex.split(c) for c in blocks["commands"].replace("\\\n", " ").splitlines()]
    assert [c[:2] for c in commands] == [
        ["t2t", "train"],
        ["t2t", "train"],
        ["t2t", "eval"],
        ["t2t", "infer"],
        ["t2t", "export"],
    ]
    for command in commands:
        extra = SHORT if command[1] == "train" else []
        assert cli.main(command[1:] + extra) == 0, capsys.readouterr().err[-3000:]
    printed = capsys.readouterr().out
    assert "notes_topic/accuracy" in printed  # the fine-tuning decoded and scored its task
    answers = [json.loads(line) for line in open(tmp_path / "answers.jsonl")]
    assert len(answers) == 1 and isinstance(answers[0]["prediction"], str)
    assert (tmp_path / "release" / "notes_topic" / "model.safetensors").exists()

    from t2t.data import mixing

    assert mixing.proportions("notes_all") == pytest.approx(
        {"notes_span_corruption": 0.5, "notes_topic": 0.5}
    )
    exec(compile(blocks["hf.py"], "hf.py", "exec"), {})
    assert capsys.readouterr().out.startswith("[")  # the decoded batch
