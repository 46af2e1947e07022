"""geo3k: the parquet reader, its bad rows by row number, and the MindRecord conversion with images (Qwen2.5-VL chat
prompts with one <|image_pad|> per merged patch, the image files stored beside the ids)."""
import json

import numpy as np
import pytest

from conftest import REPO
from mindgrpo.data import PromptDataset, Record, RowError, convert_dataset, read_dataset
from mindgrpo.data.images import ImageProcessorConfig
from mindgrpo.data.mindrecord import mindrecord_schema, stored_images
from mindgrpo.data.templates import render_vl_prompt
from mindgrpo.data.tokenizer import load_tokenizer

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("PIL")

GEO3K_INSTRUCTION = (" You FIRST think about the reasoning process as an internal monologue and then provide the final "
                     "answer. The reasoning process MUST BE enclosed within <think> </think> tags. The final answer "
                     "MUST BE put in \\boxed{}.")  # verl examples/data_preprocess/geo3k.py, instruction_following
SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"


@pytest.fixture(scope="module")
def tokenizer(vl_dir):
    return load_tokenizer(vl_dir)


@pytest.fixture(scope="module")
def pngs(vl_dir):
    return [(vl_dir / f"image_{i}.png").read_bytes() for i in range(2)]


def _image(data, path="x.png"):
    return [{"bytes": data, "path": path}]


def write_geo3k(path, pngs):
    """The fixture's three prompts (rows 1, 2 and 10, the last without an image) and one of each bad kind, rows 3 to
    9."""
    rows = [
        (_image(pngs[0]), "<image>How many squares are there? Answer in \\boxed{}.", "3"),
        (_image(pngs[1]), "<image>Count the squares.", "\\frac{40}{3}"),
        (_image(b"\x89PNG\r\n\x1a\nbroken"), "<image>Find x.", "2"),          # 3: undecodable image
        (_image(pngs[0]), None, "4"),                                        # 4: problem missing
        (_image(pngs[0]), "Find y.", "5"),                                   # 5: an image but no <image> tag
        ([], "<image>Find z.", "6"),                                         # 6: a tag but no image
        ([{"bytes": None, "path": "diagram.png"}], "<image>Find w.", "7"),   # 7: only a path, no bytes
        (_image(pngs[1]), "<image>Find v.", " "),                            # 8: empty answer
        (_image(pngs[0]), "<image>Find <|image_pad|> u.", "9"),              # 9: spells the image token
        (None, "What is 7 + 5? Think, then answer in \\boxed{}.", "12"),     # 10: text only, no image
    ]
    image_type = pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    table = pa.table({"images": pa.array([r[0] for r in rows], type=image_type),
                      "problem": [r[1] for r in rows], "answer": [r[2] for r in rows]})
    pq.write_table(table, path)
    return path


def test_reader_rows_and_errors(tmp_path, pngs):
    rows = list(read_dataset(write_geo3k(tmp_path / "geo3k.parquet", pngs), "geo3k"))
    records = [r for r in rows if isinstance(r, Record)]
    assert [(r.line_no, r.gold, r.images) for r in records] == [
        (1, "3", (pngs[0],)), (2, "\\frac{40}{3}", (pngs[1],)), (9, "9", (pngs[0],)), (10, "12", ())]
    errors = {r.line_no: r for r in rows if isinstance(r, RowError)}
    assert {n: e.kind for n, e in errors.items()} == {3: "bad_image", 4: "missing_field", 5: "bad_image",
                                                      6: "bad_image", 7: "bad_image", 8: "missing_field"}
    assert "cannot decode" in errors[3].reason and "'problem'" in errors[4].reason
    assert "0 <image> tag(s) but the row has 1 image" in errors[5].reason
    assert "1 <image> tag(s) but the row has 0 image" in errors[6].reason
    assert "no bytes" in errors[7].reason and "diagram.png" in errors[7].reason
    assert str(errors[3]).startswith(f"{tmp_path / 'geo3k.parquet'}:3: ")


def test_reader_refuses_other_files(tmp_path):
    from mindgrpo.data import DataError

    pq.write_table(pa.table({"problem": ["x"], "answer": ["1"]}), tmp_path / "noimages.parquet")
    with pytest.raises(DataError, match=r"no column\(s\) \['images'\]"):
        list(read_dataset(tmp_path / "noimages.parquet", "geo3k"))


def test_convert_matches_fixture_prompts(tmp_path, vl_dir, tokenizer, pngs):
    """The stored ids are the fixture's reference input_ids (transformers' tokenizer on the expanded chat text)."""
    from mindspore.mindrecord import FileReader

    errors = []
    summary = convert_dataset(write_geo3k(tmp_path / "geo3k.parquet", pngs), tmp_path / "geo3k.mindrecord",
                              tokenizer, dataset_type="geo3k", prompt_template="chatml", max_prompt_length=80,
                              progress=False, on_error=errors.append,
                              image_config=ImageProcessorConfig.from_pretrained(vl_dir))
    assert (summary.rows_read, summary.rows_written) == (10, 3)
    assert summary.skipped == {"bad_image": 5, "missing_field": 2}
    assert [e.line_no for e in errors] == [3, 4, 5, 6, 7, 8, 9]
    assert "<|image_pad|>" in errors[-1].reason

    ref = np.load(vl_dir / "reference.npz")
    texts = json.loads((vl_dir / "reference_texts.json").read_text())["texts"]
    ds = PromptDataset(tmp_path / "geo3k.mindrecord")
    assert ds.golds == ["3", "\\frac{40}{3}", "12"] and ds.pad_token_id == tokenizer.pad_token_id
    assert ds.metadata["image_processor"]["max_pixels"] == 50176
    for k in range(3):
        expected = ref["input_ids"][k][ref["attention_mask"][k] == 1]
        assert ds[k].prompt_ids.tolist() == expected.tolist()
        assert tokenizer.decode(ds[k].prompt_ids, skip_special_tokens=False) == texts[k]

    reader = FileReader(str(tmp_path / "geo3k.mindrecord"), num_consumer=1)
    try:
        stored = sorted(reader.get_next(), key=lambda row: int(row["line_no"]))
    finally:
        reader.close()
    assert [int(row["line_no"]) for row in stored] == [1, 2, 10]
    for k, row in enumerate(stored):
        images, grid = stored_images(row)
        assert images == pngs[k:k + 1]  # the text-only row (k = 2) stores none
        np.testing.assert_array_equal(grid, ref["image_grid_thw"][k:k + 1])  # row 10: an empty [0, 3] grid


def test_geo3k_template_is_verls_prompt(tokenizer):
    """verl builds the prompt as problem + ' ' + instruction, split at <image> into image and text parts."""
    text = render_vl_prompt("geo3k", "<image>Find x. Round to the nearest tenth.", [4])
    assert text == (SYSTEM + "<|im_start|>user\n<|vision_start|>" + "<|image_pad|>" * 4 + "<|vision_end|>"
                    "Find x. Round to the nearest tenth." + GEO3K_INSTRUCTION + "<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.encode(text).count(tokenizer.backend.token_to_id("<|image_pad|>")) == 4
    # tags anywhere, several images: each block in its place
    two = render_vl_prompt("chatml", "Left <image> right <image>.", [1, 2])
    assert "Left <|vision_start|><|image_pad|><|vision_end|> right <|vision_start|><|image_pad|><|image_pad|>" in two
    with pytest.raises(ValueError, match="not one ChatML user turn"):
        render_vl_prompt("raw", "<image>x", [1])


def test_vl_chat_template_matches_transformers(tokenizer):
    """Our rendering of the Qwen2.5-VL template equals transformers' apply_chat_template with the same template."""
    transformers = pytest.importorskip("transformers")
    from mindgrpo.data.templates import QWEN25_VL_CHAT_TEMPLATE

    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Find x."}]}]
    expected = hf.apply_chat_template(messages, chat_template=QWEN25_VL_CHAT_TEMPLATE, tokenize=False,
                                      add_generation_prompt=True)
    assert render_vl_prompt("chatml", "<image>Find x.", [1]) == expected


def test_text_schema_unchanged():
    assert mindrecord_schema(16) == {"prompt_ids": {"type": "int32", "shape": [16]}, "prompt_length": {"type": "int32"},
                                     "gold": {"type": "string"}, "question": {"type": "string"},
                                     "line_no": {"type": "int32"}}


def test_cli_geo3k(tmp_path, vl_dir, pngs, capsys):
    import runpy

    main = runpy.run_path(str(REPO / "tools" / "rlhf_data.py"))["main"]
    src = write_geo3k(tmp_path / "geo3k.parquet", pngs)
    args = ["--tokenizer_dir", str(vl_dir), "--file_path", str(src), "--dataset_type", "geo3k",
            "--prompt_template", "geo3k", "--max_prompt_length", "200", "--no_progress"]
    assert main(args + ["--output_path", str(tmp_path / "out.mindrecord")]) == 0
    out = capsys.readouterr()
    assert "written 3, skipped 7" in out.out and f"{src}:3: image 1: cannot decode" in out.err
    assert main(args + ["--output_path", str(tmp_path / "strict.mindrecord"), "--strict"]) == 1
    assert f"{src}:3:" in capsys.readouterr().err and not (tmp_path / "strict.mindrecord").exists()
    # no image processor settings next to the tokenizer: a clear error, nothing written
    vocab_only = tmp_path / "tok"
    vocab_only.mkdir()
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        (vocab_only / name).write_bytes((vl_dir / name).read_bytes())
    assert main(["--vocab_path", str(vocab_only / "vocab.json"), "--merges_file_path", str(vocab_only / "merges.txt"),
                 "--file_path", str(src), "--dataset_type", "geo3k", "--prompt_template", "geo3k",
                 "--output_path", str(tmp_path / "none.mindrecord"), "--no_progress"]) == 1
    assert "preprocessor_config.json not found" in capsys.readouterr().err
