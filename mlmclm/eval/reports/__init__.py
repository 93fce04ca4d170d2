"""Reports from run records: per-task / per-family summaries and stability, comparisons of runs (with TensorBoard
losses), results over pretraining seeds and their figures, data-efficiency curves, the paper's tables and figures
(with the paper's recorded numbers and the authors' released results beside ours). Imports `mlmclm.eval.data` and
`mlmclm.eval.finetune`, never `checks`."""
