"""Studies: grids of ordinary training runs (arms x tasks x seeds), their aggregation with
spreads, degenerate-run counts and significance tests, and the orderings beside the paper's.

`t2t study NAME` runs `gin/studies/NAME.gin` (`t2t.studies.runner.run`); the pure parts are
`aggregate` (statistics), `baselines` (each task's constant baseline), `paper` (the paper's
numbers) and `report` (study.md, study.json, study.png).
"""
