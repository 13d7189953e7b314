"""Triton Python-backend model: prompt text -> token ids for the TensorRT-LLM step.

Runs inside the Triton image (which ships ``transformers`` and ``triton_python_backend_utils``);
the tokenizer is the one the engine-build Job copies next to the engines. Llama 3 has no pad
token, so the end-of-turn token pads ragged batches (the backend ignores ids past input_lengths).
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
        tokenizer_dir = params["tokenizer_dir"]["string_value"]
        self.add_special_tokens = params.get("add_special_tokens", {}).get("string_value", "true").lower() == "true"
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, legacy=False)
        self.end_id = int(self.tokenizer.eos_token_id)
        self.pad_id = int(self.tokenizer.pad_token_id) if self.tokenizer.pad_token_id is not None else self.end_id

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            queries = pb_utils.get_input_tensor_by_name(request, "QUERY").as_numpy()  # [batch, 1] bytes
            output_len = pb_utils.get_input_tensor_by_name(request, "REQUEST_OUTPUT_LEN").as_numpy()  # [batch, 1]
            ids = [
                self.tokenizer.encode(q[0].decode("utf-8"), add_special_tokens=self.add_special_tokens)
                for q in queries
            ]
            width = max(len(i) for i in ids)
            input_id = np.full((len(ids), width), self.pad_id, dtype=np.int32)
            for row, seq in enumerate(ids):
                input_id[row, : len(seq)] = seq
            batch = len(ids)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("INPUT_ID", input_id),
                pb_utils.Tensor("REQUEST_INPUT_LEN", np.array([[len(s)] for s in ids], dtype=np.int32)),
                pb_utils.Tensor("REQUEST_OUTPUT_LEN", output_len.astype(np.int32).reshape(batch, 1)),
                pb_utils.Tensor("OUT_END_ID", np.full((batch, 1), self.end_id, dtype=np.int32)),
                pb_utils.Tensor("OUT_PAD_ID", np.full((batch, 1), self.pad_id, dtype=np.int32)),
            ]))
        return responses
