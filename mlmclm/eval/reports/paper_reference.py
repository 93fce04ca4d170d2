"""What the paper reports, recorded with where it was read, so a reproduction can print its distance from it.

Paper: Gisserot-Boukhlef et al., "Should We Still Pretrain Encoders with Masked Language Modeling?",
arXiv 2507.00994 (v1 1 Jul 2025; v2 4 Jul 2025; v3 = ICLR 2026 version).

Only values actually read in the paper's text (or in the authors' released material) belong here, each with its
source. Score tables are still EMPTY: the stored copies of the paper reachable from this project
(https://arxiv.org/html/2507.00994v2, .../v3, https://arxiv.org/abs/2507.00994) only showed the abstract and the
first lines of the introduction, not the result tables or figures, and the authors' blog post (BLOG below) gives the
study's design and direction of the results but no scores, so no per-family or per-task score could be read.
Fill `PAPER_SCORES` from the paper's tables (percent as printed, with the table/figure number as `source`); the
report then prints a distance column for every (model, column) recorded.

The authors also released every fine-tuning run's scores (github.com/hgissbkh/EncodEval, branch MLM_vs_CLM,
`results/<model>/<SC|TC|QA|IR>/<task>/[<train>_]lr<lr>_sd<seed>/results.json`, commit 7e03774 as stored). No
snapshot of that repository could be fetched here, so nothing derived from them is recorded in this file; with a
local copy, `tools/paper_report.py --reference-encodeval RESULTS` aggregates them by our rule at report time
(`encodeval_results.py`) and prints the distance from the authors' own runs.
"""
from __future__ import annotations

from dataclasses import dataclass

ARXIV = "https://arxiv.org/abs/2507.00994"
ARXIV_HTML_V2 = "https://arxiv.org/html/2507.00994v2"
RELEASED_MODELS = "https://huggingface.co/MLMvsCLM"
RELEASED_RESULTS = "https://github.com/hgissbkh/EncodEval/tree/MLM_vs_CLM/results"
# The authors' blog post (2 Jul 2025), read through a stored mirror of it
# (hg.istephan-squireso.workers.dev/blog/Nicolas-BZRD/encoders-should-not-be-only-pre-trained-with-mlm).
BLOG = "https://huggingface.co/blog/Nicolas-BZRD/encoders-should-not-be-only-pre-trained-with-mlm"

# The columns a reference score may name: a family (the main table's short names) or a paper task.
FAMILY_COLUMNS = ("SC", "TC", "QA", "IR")


@dataclass(frozen=True)
class ReferenceScore:
    """One score the paper prints: `column` is a family short name (SC/TC/QA/IR) or a task name; `value` is in
    percent, as printed; `source` says where (e.g. "arXiv 2507.00994v2, Table 3")."""

    model: str  # the released model's name, as in recipes/grid.py (e.g. "610m-mlm40-42k")
    column: str
    value: float
    source: str

    def __post_init__(self) -> None:
        if not self.model or not self.column or not self.source:
            raise ValueError(f"reference score needs model, column and source, got {self}")
        if not 0.0 <= self.value <= 100.0:
            raise ValueError(f"reference score {self.model}/{self.column} must be in percent (0..100), "
                             f"got {self.value}")


@dataclass(frozen=True)
class ReferenceFact:
    """A number the paper states about its setup (not a score), with its source."""

    what: str
    value: str
    source: str


# Scores read in the paper's tables/figures. None could be read (see the module docstring): left empty on purpose.
PAPER_SCORES: tuple[ReferenceScore, ...] = ()

# Numbers read in the abstract (arXiv pages above). v1's abstract says 30 models, v2 onwards 38.
PAPER_FACTS: tuple[ReferenceFact, ...] = (
    ReferenceFact("pretrained models", "38", f"{ARXIV_HTML_V2}, abstract (v1: 30)"),
    ReferenceFact("model sizes", "210M to 1B parameters", f"{ARXIV_HTML_V2}, abstract"),
    ReferenceFact("fine-tuning and evaluation runs", "over 15,000", f"{ARXIV_HTML_V2}, abstract"),
    ReferenceFact("headline finding", "MLM generally better on text-representation tasks; CLM more data-efficient "
                  "and more stable to fine-tune; CLM then MLM (biphasic) best under a fixed training budget",
                  f"{ARXIV_HTML_V2}, abstract"),
    ReferenceFact("compute", "110k GPU hours (over 30 models, more than 15,000 fine-tuning evaluations)",
                  f"{BLOG}, introduction"),
    ReferenceFact("biphasic study", "five splits, as the post lists them: 100% MLM, 75%-25%, 50%-50%, 25%-75%, "
                  "100% CLM; budgets of 12k, 22k and 42k steps; hybrids consistently above pure MLM, by a margin "
                  "that varies with task and budget (no numbers given)",
                  f"{BLOG}, 'Masked or Causal Language Modeling?'"),
)


def reference_lookup(scores: tuple[ReferenceScore, ...] = PAPER_SCORES) -> dict[tuple[str, str], ReferenceScore]:
    """(model, column) -> score; a pair recorded twice is an error (two sources disagreeing must be resolved)."""
    lookup: dict[tuple[str, str], ReferenceScore] = {}
    for score in scores:
        key = (score.model, score.column)
        if key in lookup:
            raise ValueError(f"reference score {key} recorded twice ({lookup[key].source}; {score.source})")
        lookup[key] = score
    return lookup
