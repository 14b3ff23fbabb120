"""C4, the T5 paper's Colossal Clean Crawled Corpus, built from Common Crawl WET files on Beam.

`python -m c4_pipeline --wet_paths=... --output_dir=...` runs it; `pipeline.run(C4Config(...))`
does the same from Python. Each cleaning rule is a pure function in `rules` (and `badwords`,
`langid`, `dedup`) with named counters; `pipeline` wires them into Beam stages. The package does
not import JAX, Flax or t2t: it runs on Beam workers that only have Beam and langdetect.
"""

from c4_pipeline.page import Page
from c4_pipeline.pipeline import VARIANTS, C4Config, build, run

__all__ = ["C4Config", "Page", "VARIANTS", "build", "run"]
