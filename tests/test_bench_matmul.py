"""tools/bench_matmul.py: the products it times are the model's (shapes per layout and role, per-step counts), its
direct oneDNN call computes the right product, and one real (slow) run."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))

import bench_matmul  # noqa: E402
from benchlib import SMALL  # noqa: E402


def _out_shape(case):
    return case.m, case.n


def test_every_layout_computes_forward_dx_and_dw_of_the_same_linear():
    tokens, width = 64, 128
    rows, vocab_rows = bench_matmul.phase_rows(tokens, width)["update"]
    assert (rows, vocab_rows) == (2 * width + 16 * tokens, 16 * tokens)
    cases = [c for c in bench_matmul.model_cases(tokens, width) if c.phase == "update"]
    for name, (out, inp, _) in bench_matmul.linears(SMALL).items():
        r = vocab_rows if name == "lm_head" else rows
        for layout in bench_matmul.LAYOUTS:
            by_role = {c.role: c for c in cases if c.linear == name and c.layout == layout}
            assert set(by_role) == {"fwd", "dx", "dW"}
            assert {c.flops for c in by_role.values()} == {2 * r * inp * out}
            # y, dx and dW have the shapes of y, x and W in this layout (row- or feature-major activations,
            # weights [out, in] or [in, out]); fwd contracts over in, dx over out, dW over the rows.
            y, dx, dw = (_out_shape(by_role[k]) for k in ("fwd", "dx", "dW"))
            assert y in {(r, out), (out, r)} and dx in {(r, inp), (inp, r)} and dw in {(out, inp), (inp, out)}
            assert (by_role["fwd"].k, by_role["dx"].k, by_role["dW"].k) == (inp, out, r)
            assert (y == (r, out)) == (dx == (r, inp))  # both row-major or both feature-major
    reference = [c for c in bench_matmul.model_cases(tokens, width) if c.phase == "reference"]
    assert {c.role for c in reference} == {"fwd"}


def test_rollout_products_are_the_engines_prefill_and_decode_shapes():
    width, hidden = 128, SMALL["hidden_size"]
    cases = bench_matmul.model_cases(64, width, decode_rows=(32, 128))
    by_phase = {}
    for case in cases:
        by_phase.setdefault(case.phase, []).append(case)
    assert list(by_phase) == ["prefill", "decode", "decode 128", "reference", "update"]
    gate = {c.layout: c for c in by_phase["decode"] if c.linear == "gate"}  # forward only, every layout
    assert {c.role for c in gate.values()} == {"fwd"} and set(gate) == set(bench_matmul.LAYOUTS)
    runs = gate[bench_matmul.STEP_LAYOUT["decode"]]  # the engine's: W[out, in] @ xT[in, B]
    assert (runs.trans, runs.m, runs.k, runs.n) == ("NN", SMALL["intermediate_size"], hidden, 32)
    assert {c.n for c in by_phase["decode 128"] if c.layout == "WxT"} == {128}
    prefill = {c.linear: c for c in by_phase["prefill"]}  # x [rows, in] @ W^T: 4 padded prompts, logits at the last
    assert (prefill["q"].trans, prefill["q"].m) == ("NT", bench_matmul.PROMPTS * width)
    assert prefill["lm_head"].m == bench_matmul.PROMPTS and len(by_phase["prefill"]) == len(prefill)


def test_phase_totals_count_layers_uses_and_micro_batches():
    cases = bench_matmul.model_cases(8, 16)
    seconds = {c: 1.0 for c in cases}
    totals = {(t["phase"], t["layout"], t["fused_qkv_gate_up"]): t["seconds"]
              for t in bench_matmul.phase_totals(cases, seconds)}
    layers = SMALL["num_hidden_layers"]
    per_layer = 1 + 2 + 1 + 2 + 1  # q, k and v, o, gate and up, down
    fused_per_layer = 1 + 1 + 1 + 1  # qkv, o, gate_up, down
    micro = bench_matmul.PROMPTS // bench_matmul.MICRO_GROUPS
    assert totals["reference", "xWt", False] == layers * per_layer + 1
    assert totals["reference", "xWt", True] == layers * fused_per_layer + 1
    assert totals["update", "WxT", False] == micro * 3 * (layers * per_layer + 1)
    assert totals["decode", "WxT", False] == layers * per_layer + 1  # one decoding step


@pytest.mark.parametrize("trans", ["NN", "NT", "TN"])
def test_direct_onednn_call_multiplies_like_numpy(trans):
    pytest.importorskip("mindspore")
    case = bench_matmul.Case("update", "q", "xWt", "fwd", 37, 19, 23, trans)
    a, b = bench_matmul._operands(case, np.random.default_rng(1))
    run = bench_matmul.OneDNN()(case, a, b)
    run()
    va, vb = bench_matmul._views(case, a, b)
    np.testing.assert_allclose(run.out, va @ vb, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_one_real_run_writes_every_backend_and_phase(tmp_path):
    out = tmp_path / "matmul.json"
    assert bench_matmul.main(["--tokens", "2", "--rounds", "1", "--block-gflop", "0.01", "--linears", "kv",
                              "--backends", "ms-graph", "numpy", "onednn-1t", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    run = report["runs"][0]
    assert {c["backend"] for c in run["cases"]} == {"ms-graph", "numpy", "onednn-1t"}
    assert all(c["gflops"] > 0 for c in run["cases"])
    # only kv was timed, so no phase total is complete
    assert run["phase_totals"] == {"ms-graph": [], "numpy": [], "onednn-1t": []}
