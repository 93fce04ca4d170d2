"""Fine-tuning and scoring: task specifications and loading, the paper's task presets and suite plan, the protocol
(LR grid x seeds, one JSON per run), the shared training loop and heads, the four families (classification, token
classification, QA, retrieval) under the standard or EncodEval's rules (its inputs, heads, scores, QA tagging, tag
schemes), and the metrics. Imports `mlmclm.eval.data` only, of the eval sub-packages."""
