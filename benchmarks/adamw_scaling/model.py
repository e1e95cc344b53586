"""The study's small attention model for MNIST-1D sequences (the offline task).

Each MNIST-1D example is a length-40 signal; the model cuts it into patches (tokens), embeds
them with a learned position embedding and runs pre-LayerNorm transformer blocks (multi-head
self-attention and an MLP), then mean-pools the tokens into the 10 class logits. It is defined
once, in ``examples.models`` (where the trainer finds it as ``model='patch_transformer'``), and
imported here under the names the study has always used.
"""

from __future__ import annotations

from examples.models import Block, PatchTransformer, decay_mask

__all__ = ["Block", "PatchTransformer", "decay_mask"]
