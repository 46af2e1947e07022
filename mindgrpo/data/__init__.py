"""Prompt data: from a source file to the batches of prompts the trainer rolls out.

Flow: a source file (GSM8K jsonl, DeepScaleR json, DAPO-Math-17k parquet) -> `Record`s (`readers`) ->
`render_prompt` (`templates`) -> token ids (`tokenizer`) -> a MindRecord written by `convert_dataset`
(`mindrecord`; MindRLHF style: ids right-padded to a fixed length) -> `PromptDataset` (`dataset`), which the
trainer iterates in deterministic, data-parallel-sharded, resumable batches.

The names below are re-exported so that `from mindgrpo.data import PromptDataset` and the like keep working.
"""
from mindgrpo.data.dataset import PromptBatch, PromptDataset
from mindgrpo.data.mindrecord import ConversionSummary, convert_dataset, index_path
from mindgrpo.data.readers import READERS, DataError, Record, RowError, read_dataset, read_gsm8k
from mindgrpo.data.templates import PROMPT_TEMPLATES, render_prompt

__all__ = ["PROMPT_TEMPLATES", "READERS", "ConversionSummary", "DataError", "PromptBatch", "PromptDataset", "Record",
           "RowError", "convert_dataset", "index_path", "read_dataset", "read_gsm8k", "render_prompt"]
