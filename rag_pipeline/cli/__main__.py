"""``python -m rag_pipeline.cli``: the ``rag-pipeline`` command."""

from rag_pipeline.cli import main

if __name__ == "__main__":
    main(prog_name="rag-pipeline")
