"""Retrieval evaluation on BEIR datasets, indexed through the same pipeline as every book."""
