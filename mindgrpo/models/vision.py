"""Qwen2.5-VL's vision tower as MindSpore ops that run on CPU and Ascend, with its weights from the HF folder.

It computes what transformers' ``Qwen2_5_VisionTransformerPretrainedModel`` computes, from the image processor's
flattened patches (``pixel_values`` [patches, C*T*P*P]) and ``image_grid_thw`` to the merged image embeddings
[patches / 4, out_hidden_size] that replace the ``<|image_pad|>`` tokens:

1. patch embedding: HF's Conv3d has kernel = stride, so it is one matmul of each flattened patch with the flattened
   kernel (mindone uses ``mint`` Conv3d, which has no CPU kernel);
2. blocks of RMSNorm -> attention with 2-D rotary embedding -> RMSNorm -> gated SwiGLU MLP, where most blocks attend
   within windows of ``window_size`` pixels and the blocks in ``fullatt_block_indexes`` within a whole frame;
3. the patch merger (RMSNorm ``ln_q``, then an MLP over each 2x2 group of neighbouring patches), and the reverse
   of the window grouping, so merged tokens come out in the image's row-major order.

What depends only on ``image_grid_thw`` (rotary angles, the window grouping, which patches may attend to which) is
computed on the host in numpy by :func:`vision_inputs`, once per image batch, and enters the graph as tensors:
HF's ``cu_seqlens`` / ``cu_window_seqlens`` become per-patch segment ids, turned into block-diagonal attention
masks in the graph. The graph itself has no data-dependent shapes, so GRAPH mode compiles once per patch count,
and once per bucket when ``pad_to`` pads the patches to a fixed count.

Memory note: attention is dense over all patches of the batch with a block-diagonal mask ([heads, P, P] scores).
That is exact and simple; for many large images on Ascend a variable-length FlashAttention would save memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import numpy as np

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from mindgrpo.hf_config import CONFIG_FILE, VL_MODEL_TYPES, ModelConfigError, check_dtype
from mindgrpo.models.attention_bias import mask_bias
from mindgrpo.models.safetensors_io import SafetensorsReader
from mindgrpo.models.weights import VISION_PREFIXES, CheckpointMismatchError, checkpoint_files

PathLike = Union[str, Path]

# The tower's tensors live under weights.VISION_PREFIXES (the hub's `visual.*`, transformers >= 4.52's
# `model.visual.*`); its own Parameter names are the part after the prefix.
_NORM_EPS = 1e-6  # HF hard-codes eps=1e-6 for the vision RMSNorms; it is not in config.json
_ROPE_THETA = 10000.0  # likewise fixed in Qwen2_5_VisionRotaryEmbedding
_REQUIRED = ("depth", "hidden_size", "intermediate_size", "num_heads", "out_hidden_size")
_SHOWN = 8


@dataclass(frozen=True)
class VisionSpec:
    """The vision tower's architecture, from config.json's ``vision_config`` (names follow Hugging Face)."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    in_channels: int = 3
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    window_size: int = 112
    fullatt_block_indexes: Tuple[int, ...] = (7, 15, 23, 31)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_features(self) -> int:
        """Width of one flattened patch in ``pixel_values``: C * T * P * P."""
        return self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size

    @property
    def merge_unit(self) -> int:
        """Patches merged into one token (2x2)."""
        return self.spatial_merge_size * self.spatial_merge_size


def vision_spec(config: Mapping[str, Any], source: str = CONFIG_FILE) -> VisionSpec:
    """The :class:`VisionSpec` of a Qwen2.5-VL config dict. The ``vision_config`` group is spelled the same in the
    nested form transformers saves and the flat form of hub checkpoints; hub files write ``in_chans`` where
    transformers writes ``in_channels``. Defaults are transformers' for keys a config leaves out."""
    model_type = config.get("model_type")
    if model_type not in VL_MODEL_TYPES:
        raise ModelConfigError(f"{source}: model_type={model_type!r}; the vision tower is Qwen2.5-VL's "
                               f"({', '.join(VL_MODEL_TYPES)}). Qwen2-VL's tower (LayerNorm, no windows) differs")
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        raise ModelConfigError(f"{source}: no 'vision_config' object; copy config.json from the Qwen2.5-VL folder")
    missing = [key for key in _REQUIRED if key not in vision]
    if missing:
        raise ModelConfigError(f"{source}: vision_config lacks {', '.join(missing)}; copy config.json from the "
                               "original model folder")
    if vision.get("hidden_act", "silu") != "silu":
        raise ModelConfigError(f"{source}: vision_config.hidden_act={vision['hidden_act']!r} is not supported "
                               "(Qwen2.5-VL's vision MLP uses silu)")
    spec = VisionSpec(
        depth=int(vision["depth"]), hidden_size=int(vision["hidden_size"]),
        intermediate_size=int(vision["intermediate_size"]), num_heads=int(vision["num_heads"]),
        out_hidden_size=int(vision["out_hidden_size"]),
        in_channels=int(vision.get("in_channels", vision.get("in_chans", 3))),
        patch_size=int(vision.get("patch_size", 14)), temporal_patch_size=int(vision.get("temporal_patch_size", 2)),
        spatial_merge_size=int(vision.get("spatial_merge_size", 2)), window_size=int(vision.get("window_size", 112)),
        fullatt_block_indexes=tuple(int(i) for i in vision.get("fullatt_block_indexes", (7, 15, 23, 31))))
    if spec.hidden_size % spec.num_heads or spec.head_dim % 4:
        raise ModelConfigError(f"{source}: vision_config hidden_size={spec.hidden_size} / num_heads="
                               f"{spec.num_heads} must give a head_dim divisible by 4 (2-D rotary halves)")
    bad = [i for i in spec.fullatt_block_indexes if not 0 <= i < spec.depth]
    if bad:
        raise ModelConfigError(f"{source}: vision_config.fullatt_block_indexes {bad} are outside 0..{spec.depth - 1}")
    return spec


# ---------------------------------------------------------------------------------------------------------------
# Host side: everything that depends only on image_grid_thw.

@dataclass(frozen=True)
class VisionInputs:
    """The graph inputs derived from ``image_grid_thw`` (numpy), in the tower's window-grouped patch order.

    ``pad_to`` patches (>= the real count) lets one compiled graph serve image batches of different sizes: padded
    patches attend only to each other and their merged rows come after the real ones."""

    patch_order: np.ndarray      # int32 [P]: pixel_values row at each position of the window-grouped sequence
    cos: np.ndarray              # float32 [P, head_dim]: rotary cos of each position (h angles, w angles, twice)
    sin: np.ndarray              # float32 [P, head_dim]
    window_segments: np.ndarray  # int32 [P]: window of each position (HF cu_window_seqlens); pads are -1
    frame_segments: np.ndarray   # int32 [P]: image frame of each position (HF cu_seqlens); pads are -1
    merged_order: np.ndarray     # int32 [P / 4]: merged row of each output token, undoing the window grouping
    num_patches: int             # real patches (rows of pixel_values)
    num_tokens: int              # real merged tokens (the first rows of the tower's output)

    def tensors(self) -> Tuple[Tensor, ...]:
        return (Tensor(self.patch_order), Tensor(self.cos), Tensor(self.sin), Tensor(self.window_segments),
                Tensor(self.frame_segments), Tensor(self.merged_order))


def _grid(image_grid_thw, spec: VisionSpec) -> np.ndarray:
    grid = np.asarray(image_grid_thw.asnumpy() if isinstance(image_grid_thw, Tensor) else image_grid_thw)
    if grid.ndim != 2 or grid.shape[1] != 3 or len(grid) == 0:
        raise ValueError(f"image_grid_thw must be [images, 3] (t, h, w patches per image), got shape {grid.shape}")
    grid = grid.astype(np.int64)
    merge = spec.spatial_merge_size
    if (grid <= 0).any() or (grid[:, 1:] % merge).any():
        raise ValueError(f"image_grid_thw {grid.tolist()}: every t, h, w must be positive and h, w multiples of "
                         f"spatial_merge_size={merge} (what Qwen2VLImageProcessor produces)")
    return grid


def rotary_angles(spec: VisionSpec, grid: np.ndarray) -> np.ndarray:
    """HF ``rot_pos_emb``: per patch (in processor order) the row angles then the column angles, [P, head_dim/2].
    The processor lists patches by 2x2 merge group, so positions are permuted the same way."""
    merge = spec.spatial_merge_size
    dim = spec.head_dim // 2
    inv_freq = (1.0 / (np.float32(_ROPE_THETA) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))))
    inv_freq = inv_freq.astype(np.float32)
    rows = []
    for t, h, w in grid:
        grouped = (h // merge, merge, w // merge, merge)
        hpos = np.broadcast_to(np.arange(h)[:, None], (h, w)).reshape(grouped).transpose(0, 2, 1, 3).reshape(-1)
        wpos = np.broadcast_to(np.arange(w)[None, :], (h, w)).reshape(grouped).transpose(0, 2, 1, 3).reshape(-1)
        rows.append(np.tile(np.stack([hpos, wpos], axis=-1), (t, 1)))
    pos = np.concatenate(rows, axis=0)
    table = np.outer(np.arange(grid[:, 1:].max(), dtype=np.float32), inv_freq).astype(np.float32)
    return table[pos].reshape(len(pos), -1)


def window_index(spec: VisionSpec, grid: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """HF ``get_window_index``: the merge-group order that lists each window's groups together, and the window of
    each group in that order (HF's ``cu_window_seqlens`` as segment ids; empty windows simply never appear)."""
    merge = spec.spatial_merge_size
    size = spec.window_size // merge // spec.patch_size  # window side in merged tokens
    order, windows = [], []
    offset = window_offset = 0
    for t, h, w in grid:
        gh, gw = h // merge, w // merge
        pad_h, pad_w = size - gh % size, size - gw % size  # as HF: a full extra window when already divisible
        nh, nw = (gh + pad_h) // size, (gw + pad_w) // size
        index = np.full((t, gh + pad_h, gw + pad_w), -1, np.int64)
        index[:, :gh, :gw] = np.arange(t * gh * gw).reshape(t, gh, gw)
        index = index.reshape(t, nh, size, nw, size).transpose(0, 1, 3, 2, 4).reshape(t, nh * nw, size * size)
        window_of = np.broadcast_to(np.arange(t * nh * nw).reshape(t, nh * nw, 1), index.shape)
        real = index >= 0
        order.append(index[real] + offset)
        windows.append(window_of[real] + window_offset)
        offset += t * gh * gw
        window_offset += t * nh * nw
    return np.concatenate(order), np.concatenate(windows)


def vision_inputs(spec: VisionSpec, image_grid_thw, pad_to: Optional[int] = None) -> VisionInputs:
    """Host-side inputs of :class:`Qwen2_5VisionTower` for images of ``image_grid_thw`` (see :class:`VisionInputs`)."""
    grid = _grid(image_grid_thw, spec)
    unit = spec.merge_unit
    num_patches = int((grid[:, 0] * grid[:, 1] * grid[:, 2]).sum())
    total = num_patches if pad_to is None else int(pad_to)
    if total < num_patches or total % unit:
        raise ValueError(f"pad_to={pad_to}: must be a multiple of {unit} and at least the {num_patches} patches of "
                         f"image_grid_thw {grid.tolist()}")
    groups, group_window = window_index(spec, grid)
    patch_order = (groups[:, None] * unit + np.arange(unit)).reshape(-1)
    window_segments = np.repeat(group_window, unit)
    # HF's cu_seqlens: one segment per frame (t of each image), applied to positions of the grouped sequence; the
    # window grouping never crosses a frame, so a position's segment is the frame it came from.
    frame_sizes = np.repeat(grid[:, 1] * grid[:, 2], grid[:, 0])
    frame_segments = np.repeat(np.arange(len(frame_sizes)), frame_sizes)
    angles = rotary_angles(spec, grid)[patch_order]
    emb = np.concatenate([angles, angles], axis=-1)
    cos, sin = np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)
    merged_order = np.argsort(groups, kind="stable")
    extra = total - num_patches
    if extra:
        patch_order = np.concatenate([patch_order, np.arange(num_patches, total)])
        window_segments = np.concatenate([window_segments, np.full(extra, -1)])
        frame_segments = np.concatenate([frame_segments, np.full(extra, -1)])
        cos = np.concatenate([cos, np.ones((extra, spec.head_dim), np.float32)])
        sin = np.concatenate([sin, np.zeros((extra, spec.head_dim), np.float32)])
        merged_order = np.concatenate([merged_order, np.arange(num_patches // unit, total // unit)])
    i32 = lambda a: np.ascontiguousarray(a, dtype=np.int32)  # noqa: E731
    return VisionInputs(i32(patch_order), cos, sin, i32(window_segments), i32(frame_segments), i32(merged_order),
                        num_patches, num_patches // unit)


# ---------------------------------------------------------------------------------------------------------------
# The graph: Cells named like HF's modules, so Parameter names are the checkpoint's names after `visual.`.

class RMSNorm(nn.Cell):
    """Qwen2RMSNorm: normalise in float32, cast back, then scale."""

    def __init__(self, dim: int, dtype):
        super().__init__()
        self.weight = Parameter(Tensor(np.ones(dim, np.float32)).astype(dtype), name="weight")

    def construct(self, x):
        x32 = x.astype(ms.float32)
        x32 = x32 * ops.rsqrt(ops.mean(x32 * x32, -1, keep_dims=True) + _NORM_EPS)
        return self.weight * x32.astype(x.dtype)


def _dense(d_in: int, d_out: int, dtype) -> nn.Dense:
    # zeros, not random init: every weight is overwritten by the loader, and random init of a 7B tower is slow
    return nn.Dense(d_in, d_out, weight_init="zeros", bias_init="zeros", dtype=dtype)


class KernelIsStrideConv3d(nn.Cell):
    """HF's patch Conv3d (kernel = stride = [T, P, P], no bias) over already-flattened patches: each output is the
    dot product of one patch's C*T*P*P values with the kernel, so the conv is a single matmul. The Parameter keeps
    the checkpoint's 5-D shape so weights load and export without reshaping."""

    def __init__(self, spec: VisionSpec, dtype):
        super().__init__()
        shape = (spec.hidden_size, spec.in_channels, spec.temporal_patch_size, spec.patch_size, spec.patch_size)
        self.weight = Parameter(Tensor(np.zeros(shape, np.float32)).astype(dtype), name="weight")
        self.flat = (spec.hidden_size, spec.patch_features)

    def construct(self, patches):
        return ops.matmul(patches.astype(self.weight.dtype), self.weight.reshape(self.flat).T)


class PatchEmbed(nn.Cell):
    def __init__(self, spec: VisionSpec, dtype):
        super().__init__()
        self.proj = KernelIsStrideConv3d(spec, dtype)

    def construct(self, patches):
        return self.proj(patches)


class VisionAttention(nn.Cell):
    """Multi-head self-attention with 2-D rotary q/k and an additive mask (fused qkv with bias, proj with bias)."""

    def __init__(self, spec: VisionSpec, dtype):
        super().__init__()
        self.heads, self.head_dim, self.half = spec.num_heads, spec.head_dim, spec.head_dim // 2
        self.qkv = _dense(spec.hidden_size, 3 * spec.hidden_size, dtype)
        self.proj = _dense(spec.hidden_size, spec.hidden_size, dtype)
        self.scale = float(spec.head_dim) ** -0.5

    def rotate(self, x, cos, sin):
        """HF apply_rotary_pos_emb_vision on [P, heads, head_dim], in float32."""
        x32 = x.astype(ms.float32)
        rotated = ops.concat((-x32[..., self.half:], x32[..., :self.half]), -1)
        return (x32 * cos + rotated * sin).astype(x.dtype)

    def construct(self, x, cos, sin, bias):
        length = x.shape[0]
        qkv = self.qkv(x).reshape(length, 3, self.heads, self.head_dim)
        cos, sin = cos.expand_dims(1), sin.expand_dims(1)
        q = self.rotate(qkv[:, 0], cos, sin).transpose(1, 0, 2)  # [heads, P, head_dim]
        k = self.rotate(qkv[:, 1], cos, sin).transpose(1, 0, 2)
        v = qkv[:, 2].transpose(1, 0, 2)
        scores = ops.matmul(q, k.transpose(0, 2, 1)).astype(ms.float32) * self.scale + bias
        probs = ops.softmax(scores, -1).astype(v.dtype)
        out = ops.matmul(probs, v).transpose(1, 0, 2).reshape(length, -1)
        return self.proj(out)


class VisionMLP(nn.Cell):
    """Gated SwiGLU MLP with biases: down(silu(gate(x)) * up(x))."""

    def __init__(self, spec: VisionSpec, dtype):
        super().__init__()
        self.gate_proj = _dense(spec.hidden_size, spec.intermediate_size, dtype)
        self.up_proj = _dense(spec.hidden_size, spec.intermediate_size, dtype)
        self.down_proj = _dense(spec.intermediate_size, spec.hidden_size, dtype)

    def construct(self, x):
        return self.down_proj(ops.silu(self.gate_proj(x)) * self.up_proj(x))


class VisionBlock(nn.Cell):
    """Pre-norm transformer block; ``full_attention`` picks the frame mask over the window mask."""

    def __init__(self, spec: VisionSpec, dtype, full_attention: bool):
        super().__init__()
        self.norm1 = RMSNorm(spec.hidden_size, dtype)
        self.norm2 = RMSNorm(spec.hidden_size, dtype)
        self.attn = VisionAttention(spec, dtype)
        self.mlp = VisionMLP(spec, dtype)
        self.full_attention = full_attention

    def construct(self, x, cos, sin, window_bias, frame_bias):
        bias = frame_bias if self.full_attention else window_bias
        x = x + self.attn(self.norm1(x), cos, sin, bias)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Cell):
    """ln_q, then each 2x2 group of consecutive patches concatenated and passed through Linear-GELU-Linear."""

    def __init__(self, spec: VisionSpec, dtype):
        super().__init__()
        self.width = spec.hidden_size * spec.merge_unit
        self.ln_q = RMSNorm(spec.hidden_size, dtype)
        # HF's nn.Sequential(Linear, GELU, Linear): names mlp.0 and mlp.2, GELU exact (erf), not tanh
        self.mlp = nn.SequentialCell([_dense(self.width, self.width, dtype), nn.GELU(approximate=False),
                                      _dense(self.width, spec.out_hidden_size, dtype)])

    def construct(self, x):
        return self.mlp(self.ln_q(x).reshape(-1, self.width))


class Qwen2_5VisionTower(nn.Cell):
    """Qwen2.5-VL's vision tower (``visual`` in HF checkpoints). Its Parameter names are the checkpoint names after
    ``visual.`` / ``model.visual.``, so a model that holds it as ``self.visual`` has the hub's names.

    ``construct(pixel_values, *vision_inputs(spec, image_grid_thw).tensors())`` is the graph (for callers that
    compile it inside a larger Cell); :meth:`embed_images` is the host-side call from ``pixel_values`` and
    ``image_grid_thw``. A Qwen2.5-VL folder's model holds one with its weights (``build_model(...).vision``)."""

    def __init__(self, spec: VisionSpec, dtype: str = "float32"):
        super().__init__()
        self.spec = spec
        self.dtype = getattr(ms, check_dtype("dtype", dtype))
        self.patch_embed = PatchEmbed(spec, self.dtype)
        full = set(spec.fullatt_block_indexes)
        self.blocks = nn.CellList([VisionBlock(spec, self.dtype, i in full) for i in range(spec.depth)])
        self.merger = PatchMerger(spec, self.dtype)
        self.unit, self.hidden = spec.merge_unit, spec.hidden_size

    def construct(self, pixel_values, patch_order, cos, sin, window_segments, frame_segments, merged_order):
        x = ops.gather(self.patch_embed(pixel_values), patch_order, 0)  # window-grouped order
        window_bias = mask_bias(ops.equal(window_segments.expand_dims(1), window_segments.expand_dims(0))
                                .astype(ms.float32))
        frame_bias = mask_bias(ops.equal(frame_segments.expand_dims(1), frame_segments.expand_dims(0))
                               .astype(ms.float32))
        for block in self.blocks:
            x = block(x, cos, sin, window_bias, frame_bias)
        return ops.gather(self.merger(x), merged_order, 0)

    def embed_images(self, pixel_values, image_grid_thw, pad_to: Optional[int] = None) -> Tensor:
        """Merged image embeddings [tokens, out_hidden_size] for the processor's ``pixel_values`` and
        ``image_grid_thw``, in the images' order (what HF's ``model.visual(pixel_values, grid_thw)`` returns).
        Runs in the current execution mode; ``pad_to`` (patches) fixes the compiled shape across image batches."""
        inputs = vision_inputs(self.spec, image_grid_thw, pad_to)
        pixels = np.asarray(pixel_values.asnumpy() if isinstance(pixel_values, Tensor) else pixel_values,
                            dtype=np.float32)
        if pixels.shape != (inputs.num_patches, self.spec.patch_features):
            raise ValueError(f"pixel_values has shape {pixels.shape}; image_grid_thw "
                             f"{np.asarray(image_grid_thw).tolist()} needs ({inputs.num_patches}, "
                             f"{self.spec.patch_features}) (patches x C*T*P*P)")
        padded = np.zeros((len(inputs.patch_order), pixels.shape[1]), np.float32)
        padded[:len(pixels)] = pixels
        out = self(Tensor(padded), *inputs.tensors())
        return out if inputs.num_tokens == out.shape[0] else out[:inputs.num_tokens]


# ---------------------------------------------------------------------------------------------------------------
# Weights.

def vision_parameters(tower: nn.Cell) -> Dict[str, Parameter]:
    """The tower's Parameters by checkpoint name without the ``visual.`` prefix (e.g. ``blocks.0.attn.qkv.weight``)."""
    return dict(tower.parameters_and_names())


def _listing(names) -> str:
    names = sorted(names)
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more


def load_vision_weights(tower: nn.Cell, model_dir: PathLike) -> str:
    """Load the ``visual.*`` (hub) or ``model.visual.*`` (transformers >= 4.52) tensors of an HF folder (single file
    or sharded with an index; F32/F16/BF16) into ``tower``, strictly: a missing, unexpected or misshapen visual
    tensor is a :class:`CheckpointMismatchError` naming it. Returns the prefix the folder uses."""
    files = checkpoint_files(model_dir)
    found = {prefix: {name[len(prefix):]: name for name in files if name.startswith(prefix)}
             for prefix in VISION_PREFIXES}
    used = [prefix for prefix, names in found.items() if names]
    if len(used) != 1:
        problem = ("holds both " + " and ".join(f"'{p}*'" for p in used) + " tensors" if used
                   else f"has no {' or '.join(repr(p + '*') for p in VISION_PREFIXES)} tensors")
        raise CheckpointMismatchError(f"{model_dir}: the checkpoint {problem}; a Qwen2.5-VL folder has the vision "
                                      "tower under exactly one of these prefixes")
    prefix = used[0]
    stored = found[prefix]
    params = vision_parameters(tower)
    readers = {path: SafetensorsReader(path) for path in {files[name] for name in stored.values()}}
    problems = []
    missing = set(params) - set(stored)
    unexpected = set(stored) - set(params)
    if missing:
        problems.append(f"missing from the checkpoint: {_listing(prefix + n for n in missing)}")
    if unexpected:
        problems.append(f"not in the vision tower: {_listing(prefix + n for n in unexpected)}")
    shapes = []
    for name in sorted(set(params) & set(stored)):
        shape = readers[files[stored[name]]].shape(stored[name])
        if tuple(shape) != tuple(params[name].shape):
            shapes.append(f"{stored[name]} {tuple(shape)} vs {tuple(params[name].shape)} in the tower")
    if shapes:
        problems.append(f"shape mismatch: {_listing(shapes)}")
    if problems:
        raise CheckpointMismatchError(f"{model_dir}: vision weights do not fit the tower built from config.json's "
                                      "vision_config — " + " | ".join(problems))
    for name, param in params.items():
        array = readers[files[stored[name]]].read(stored[name])
        tensor = Tensor.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
        param.set_data(tensor if param.dtype == ms.float32 else tensor.astype(param.dtype))
    return prefix
