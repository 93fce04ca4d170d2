"""The data the evaluation suite reads: hub-layout parquet/TSV readers, where each paper task comes from, fetching
it for offline runs, the folder a run reads from, EncodEval's id-keyed retrieval sets, and the split rules.
Imports nothing else of `mlmclm.eval`."""
