"""Partitions: one dynamic partition per book folder, owned by the books sensor."""

from dagster import DynamicPartitionsDefinition

__all__ = ["BOOKS_PARTITIONS_NAME", "book_partitions_def"]

BOOKS_PARTITIONS_NAME = "books"
book_partitions_def = DynamicPartitionsDefinition(name=BOOKS_PARTITIONS_NAME)
