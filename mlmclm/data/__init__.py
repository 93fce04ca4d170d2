"""Data: raw text -> packed webdataset shards -> deterministic, resumable loader."""
