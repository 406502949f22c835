"""The index recipe (chunker, budget, embedding model, sparse encoder) and which recipe each
book is built and searched with: shared by ingestion, retrieval and the query service."""
