"""What leaves the trainer for its users: sentence-transformers model directories (sentence_transformers.py) and
the retriever the evaluation fine-tuned, kept as one (retriever.py)."""
