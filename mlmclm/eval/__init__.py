"""Downstream evaluation: fine-tune and score HF encoder directories on four task families.

Four rooms, imports running one way (data < finetune < reports < checks; tests/test_import_graph.py):
- `data/`      the files the suite reads: hub layouts, fetch, data roots, retrieval sets, split rules
- `finetune/`  fine-tuning and scoring: task specs and loading, the protocol, training loop, heads, the four
               families (standard and EncodEval rules), metrics
- `reports/`   what is written from run records: summaries, comparisons, seed groups, data-efficiency curves, the
               paper's tables and figures, the authors' released results
- `checks/`    CPU-sized checks: the embedded smoke tasks and fill-mask scoring (`make demo`, the mini-replication)
"""
