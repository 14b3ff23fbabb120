"""The committed tally says what the committed studies give: `CLAIMS.md` is the tally of every
`study.json` under studies/results/builtin_tiny/ as `python -m t2t.studies.claims` writes it,
and the README's row and docs/studies.md's table count the same (each study added to the tally
moves every Holm-adjusted p, so a stale count is the likely mistake)."""

import os
import re

import pytest

from t2t.studies import claims

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(REPO, "studies", "results", "builtin_tiny")


@pytest.fixture(scope="module")
def tally():
    return claims.read(RESULTS)


def _read(*path):
    with open(os.path.join(REPO, *path)) as f:
        return f.read()


def test_claims_md_is_the_tally_of_the_committed_studies(tally):
    assert _read(RESULTS, claims.CLAIMS_FILE) == claims.tally_markdown(tally), (
        "CLAIMS.md is stale: run `python -m t2t.studies.claims studies/results/builtin_tiny`"
    )
    assert tally["tested"] >= len(tally["per_study"])  # a study counted has a testable claim


def test_the_readme_and_the_studies_doc_count_what_claims_md_counts(tally):
    n, tested = len(tally["claims"]), tally["tested"]
    verdicts = tally["reproduced"], tally["contradicted"], tally["undecided"]
    readme = _read("README.md")
    assert f"{n} claims, {tested} testable: {verdicts[0]} reproduced" in readme
    assert f"{verdicts[1]} contradicted, {verdicts[2]} undecided" in readme
    assert f"not over all {tested}:" in readme

    doc = _read("docs", "studies.md")
    row = f"| **all** (Holm over the {tested} testable claims) | {n} | **{verdicts[0]}** | "
    assert row + f"**{verdicts[1]}** | **{verdicts[2]}** |" in doc
    table = doc[doc.index("| study | claims | reproduced | contradicted | undecided |") :]
    table = table[: table.index(row)]
    for name, counted in tally["per_study"].items():
        rows = re.findall(rf"^\| `{re.escape(name)}` \(.*$", table, flags=re.M)
        assert len(rows) == 1, (name, rows)  # its row in the table of claims
        cells = [cell.strip() for cell in rows[0].split("|")[1:-1]]
        got = [int(re.match(r"\d+", cell).group()) for cell in cells[2:5]]
        assert got == [counted[v] for v in claims.VERDICTS], (name, cells)
    # Every Holm-adjusted p over all claims quoted as such is one the tally gives.
    given = [float(claims._p(r["p_holm_all"])) for r in tally["claims"] if r["p_holm_all"]]
    claims_of_all = rf"over\s+all\s+{tested}\s+(?:testable\s+)?claims"
    quoted = re.findall(rf"{claims_of_all}(?:\s+of\s+the\s+tally)?,?\s+([0-9.e-]+)", doc)
    quoted += re.findall(rf"([0-9.e-]+)\s+{claims_of_all}", doc)
    assert len(quoted) >= 5, quoted
    for value in quoted:  # one p, or a range of them ("0.19-0.41")
        for number in re.findall(r"\d+(?:\.\d+)?(?:e-?\d+)?", value):
            assert float(number) in given, (value, sorted(given))
