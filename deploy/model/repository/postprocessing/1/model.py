"""Triton Python-backend model: generated token ids -> text.

``SEQUENCE_LENGTH`` says how many ids of each beam are real; the rest is padding and is never
decoded. With ``exclude_input_in_output`` set on the TensorRT-LLM model, the ids are the
completion only.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]
from transformers import AutoTokenizer  # type: ignore[import-not-found]


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        params = json.loads(args["model_config"])["parameters"]
        self.tokenizer = AutoTokenizer.from_pretrained(params["tokenizer_dir"]["string_value"], legacy=False)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()  # [batch, beams, len]
            lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()  # [batch, beams]
            texts = [
                [self.tokenizer.decode(beam[: int(n)], skip_special_tokens=True).encode("utf-8")
                 for beam, n in zip(row, row_lengths)]
                for row, row_lengths in zip(tokens, lengths)
            ]
            out = np.array(texts, dtype=object).reshape(len(texts), -1)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", out)]))
        return responses
