"""mindgrpo's parallel runtime, Megatron-style on explicit collectives (the same code on HCCL and on CPU in CI):
``groups`` (the data- and tensor-parallel process groups and the host collectives), ``layout`` (``TPLayout``: which
slice of each Hugging Face tensor a tensor-parallel rank holds; pure Python and numpy, read by the config checks,
the planner and the doctor), ``layers`` (the tensor-parallel regions, vocabulary-parallel embedding, log-probs and
entropy) and ``resharding`` (moving weights between tensor-parallel degrees, for the vLLM sync). It imports no
MindFormers and nothing of ``models``; its only other import is the light ``config.json`` reader
(:mod:`mindgrpo.hf_config`). Import the modules themselves: this package re-exports nothing, so reading a layout
never loads MindSpore.
"""
