"""What bench/theory_key_spread.py and bench/theory_gaussian_field.py share: reading the checkpoint of a transformer
without norms, its residual weights, and the GPT-2 GELU of its FFN (PyTorch, from the bench virtual environment:
bench/make-torch-venv.sh). Not a script of its own."""
import math
import tomllib
from dataclasses import dataclass

import h5py
import numpy as np
import torch


@dataclass
class Checkpoint:
    std: dict          # every weight tensor's std, by parameter name
    thirds: list       # per block: the packed QKV's stds by thirds (q, k, v)
    config_text: str   # the study, resolved, as the checkpoint stores it
    study: dict
    vocab: int
    width: int
    tokens: int
    layers: int
    heads: int


def read_checkpoint(path, fail):
    """The checkpoint's stds and study; `fail(message)` (which exits) for a file that is not a transformer checkpoint
    or a model the replicas do not build (norms, or an activation other than GELU)."""
    try:
        with h5py.File(path, "r") as f:
            params = f["tensors/param"]
            std = {k: float(np.std(params[k][:])) for k in params.keys() if k.endswith("weight")}
            config_text = f["strings/config"][()].decode()
            study = tomllib.loads(config_text)
            vocab, width = params["embed.token.weight"].shape
            tokens = params["embed.position.weight"].shape[0]
            model = study.get("model", {})
            layers, heads = model["layers"], model["heads"]
            thirds = [[float(np.std(w[i * width:(i + 1) * width])) for i in range(3)]
                      for w in (params[f"blocks.{l}.attn.qkv.weight"][:] for l in range(layers))]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as e:
        fail(f"{path}: not a proplab checkpoint of a transformer ({e})")
    for key, value in {"norm": "none", "activation": "gelu"}.items():
        if model.get(key) != value:
            fail(f"{path}: model.{key} = {model.get(key)!r}; the replica needs {value!r}")
    return Checkpoint(std, thirds, config_text, study, vocab, width, tokens, layers, heads)


def residual_weights(checkpoint, beta_sq, lambda_sq, fail):
    """(β², λ²) per sublayer: DeepScaleLM's 1/layers and 1 − β² unless given; a rule other than deepscalelm must give
    β² (`xavier`: β² = λ² = 1)."""
    if checkpoint.study.get("scaling", {}).get("rule") != "deepscalelm" and beta_sq is None:
        fail("scaling.rule is not deepscalelm; give --beta-sq (and --lambda-sq)")
    beta_sq = beta_sq if beta_sq is not None else 1.0 / checkpoint.layers
    lambda_sq = lambda_sq if lambda_sq is not None else 1.0 - beta_sq
    if beta_sq <= 0 or lambda_sq < 0:
        fail(f"--beta-sq {beta_sq}, --lambda-sq {lambda_sq}: need β² > 0 and λ² ≥ 0")
    return beta_sq, lambda_sq


def gelu(x):
    """GPT-2's tanh GELU, as proplab's models use it."""
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
