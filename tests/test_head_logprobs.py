"""The chunked lm_head log-probs (mindgrpo.models.head_logprobs) against torch's plain
``log_softmax(h @ W.T / T)``: log-probs, entropies and the gradients of a loss using both, with respect to the
hidden states and the head, in PyNative and GRAPH, in one chunk and in uneven chunks. (Under tensor parallelism:
tests/test_tensor_parallel.py, whose training forwards use it.)"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

N, H, V = 13, 16, 50


def torch_reference(h, w, ids, a, b, temperature):
    ht, wt = torch.tensor(h, requires_grad=True), torch.tensor(w, requires_grad=True)
    logp_all = torch.log_softmax(ht @ wt.T / temperature, -1)
    logp = logp_all.gather(1, torch.tensor(ids, dtype=torch.long)[:, None])[:, 0]
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    (torch.tensor(a) * logp + torch.tensor(b) * entropy).sum().backward()
    return logp.detach().numpy(), entropy.detach().numpy(), ht.grad.numpy(), wt.grad.numpy()


@pytest.mark.parametrize("mode", ["pynative", "graph"])
@pytest.mark.parametrize("chunk_rows,entropy_gradient,temperature", [(N, True, 1.0), (4, True, 0.7), (5, False, 1.0)])
def test_log_probs_entropies_and_gradients_equal_torch(mode, chunk_rows, entropy_gradient, temperature):
    import mindspore as ms
    from mindspore import nn

    from mindgrpo.models.head_logprobs import HeadLogProbs
    from mindgrpo.parallel.layers import TPComm

    rng = np.random.default_rng(0)
    h = rng.standard_normal((N, H)).astype(np.float32)
    w = (rng.standard_normal((V, H)) * 0.5).astype(np.float32)
    ids = rng.integers(0, V, N).astype(np.int32)
    a, b = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)

    class Loss(nn.Cell):
        def __init__(self):
            super().__init__()
            self.head = HeadLogProbs(TPComm("", 1, 0), 0, temperature, entropy_gradient=entropy_gradient,
                                     chunk_bytes=4 * V * chunk_rows)

        def construct(self, rows, head, targets, wa, wb):
            logp, entropy, _ = self.head(rows, head, targets)
            return (wa * logp + wb * entropy).sum(), logp, entropy

    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    try:
        grad = ms.value_and_grad(Loss(), grad_position=(0, 1), has_aux=True)
        (_, logp, entropy), (d_rows, d_head) = grad(*(ms.Tensor(x) for x in (h, w, ids, a, b)))
    finally:
        ms.set_context(mode=previous)
    want = torch_reference(h, w, ids, a, b if entropy_gradient else np.zeros_like(b), temperature)
    np.testing.assert_allclose(logp.asnumpy(), want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(entropy.asnumpy(), want[1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(d_rows.asnumpy(), want[2], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(d_head.asnumpy(), want[3], rtol=1e-4, atol=1e-5)
