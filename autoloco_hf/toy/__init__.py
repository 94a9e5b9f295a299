"""Small models and data that need nothing downloaded: the demo's, the benchmarks' and the tests'.

* :mod:`~autoloco_hf.toy.llama`: the tiny Llama, built from a config and a seed;
* :mod:`~autoloco_hf.toy.text`: Python's own documentation text, a tokenizer trained on it,
  its batches and losses;
* :mod:`~autoloco_hf.toy.padded`: right-padded token data and the tiny Llama the Trainer
  workers train on it;
* :mod:`~autoloco_hf.toy.pattern`: a plain-torch language model and its per-worker batches;
* :mod:`~autoloco_hf.toy.demo`: the demo's methods, scale and training loop.
"""
