"""English identification with langdetect, made deterministic across runs and workers.

The paper keeps pages that langdetect classifies as English with probability at least 0.99.
langdetect samples n-grams at random, so two calls on one text can disagree. Three things make
its answer a pure function of the text here:
  * the detector's random generator is seeded with a fixed value before every detection
    (langdetect seeds a per-detector `random.Random` from the factory's `seed`);
  * the language profiles are loaded in sorted file-name order, because langdetect's own loader
    follows `os.listdir` order, which varies between file systems, and that order changes the
    floating-point sums its convergence test uses;
  * the factory is private to this module (built once per process), so no other code that sets
    `langdetect.DetectorFactory.seed` or loads profiles can change the results.
Each detection creates its own detector, so concurrent calls from several threads are safe.

Counter names (namespace `langid`):
  detected:<lang>              pages whose most probable language is <lang>
  page_dropped:no_features     pages langdetect cannot judge (no letters)
  page_dropped:not_english     pages whose most probable language is not English
  page_dropped:low_confidence  English pages below the probability threshold
  page_kept                    English pages at or above the threshold
"""

import collections
import functools
import os

import langdetect
from langdetect import detector_factory, lang_detect_exception

MIN_ENGLISH_PROBABILITY = 0.99
_SEED = 0


@functools.lru_cache(maxsize=1)
def _factory() -> detector_factory.DetectorFactory:
    profile_dir = os.path.join(os.path.dirname(langdetect.__file__), "profiles")
    listed = os.listdir(profile_dir)  # local path: langdetect's data
    names = sorted(n for n in listed if not n.startswith("."))
    profiles = []
    for name in names:
        with open(
            os.path.join(profile_dir, name), encoding="utf-8"
        ) as f:  # local path: langdetect's data
            profiles.append(f.read())
    factory = detector_factory.DetectorFactory()
    factory.load_json_profile(profiles)
    factory.set_seed(_SEED)
    return factory


def language_probabilities(text: str) -> list[tuple[str, float]]:
    """Returns [(language code, probability)] for `text`, most probable first.

    Languages below langdetect's reporting threshold (0.1) are left out. The same text gives the
    same list in every process.

    Raises:
        lang_detect_exception.LangDetectException: when the text has no usable features.
    """
    detector = _factory().create()
    detector.append(text)
    return [(guess.lang, guess.prob) for guess in detector.get_probabilities()]


def is_english(
    text: str,
    counters: collections.Counter,
    min_probability: float = MIN_ENGLISH_PROBABILITY,
) -> bool:
    """Keeps pages that are English with probability at least `min_probability`.

    Example: "The quick brown fox jumps over the lazy dog near the river bank." is kept with
    counters `{"detected:en": 1, "page_kept": 1}`; "Le renard brun saute par-dessus le chien
    paresseux." is dropped with `{"detected:fr": 1, "page_dropped:not_english": 1}`.
    """
    try:
        guesses = language_probabilities(text)
    except lang_detect_exception.LangDetectException:
        counters["page_dropped:no_features"] += 1
        return False
    if not guesses:
        counters["page_dropped:low_confidence"] += 1
        return False
    lang, probability = guesses[0]
    counters[f"detected:{lang}"] += 1
    if lang != "en":
        counters["page_dropped:not_english"] += 1
        return False
    if probability < min_probability:
        counters["page_dropped:low_confidence"] += 1
        return False
    counters["page_kept"] += 1
    return True
