"""One session's text context on the DiT stage, and a prompt change applied from a chunk on.

A change arrives as the new prompt's umT5 embeddings (encoded on the encode stage, off the DiT's
path) and takes effect from the next chunk the DiT starts: the cross-attention K/V every block
reads are recomputed from it once, before that chunk's first forward. The self-attention caches
stay as they are: the frames already made were made under the old prompt, and the world goes on
from them.

Transition: with `transition_chunks` N > 1, chunk j = 1..N of the change reads the embeddings
(1 - j/N) * old + (j/N) * new, both padded with zero rows to the text length as the DiT pads them,
so the new prompt is whole from the N-th chunk on. The blend is of embeddings, not of K/V: the
DiT's text MLP and each block's key norm are nonlinear, so blended K/V would be keys no text maps
to, while blended embeddings go through the model's own layers (the cost: one text K/V pass per
transition chunk, small beside a chunk's forwards). Linear, not slerp: umT5's embeddings are not
normalised, so keeping a norm along the path (what slerp is for) buys nothing, and a linear weight
is exactly what the chunk's receipt reports. A change that comes mid-transition starts from what
the last chunk read.

The old prompt's embeddings are dropped once a transition is over: a session holds one padded
context ([text_len, text_dim]), two during a transition. Everything here is plain tensors and
numbers, so a snapshot of the session carries the prompt and the transition state with it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def _padded(embeddings: torch.Tensor, text_len: int) -> torch.Tensor:
    """[n, dim] -> a new [text_len, dim] tensor (zero rows after the prompt's tokens)."""
    if embeddings.shape[0] > text_len:
        raise ValueError(f"{embeddings.shape[0]} prompt tokens exceed the DiT's text length {text_len}")
    return F.pad(embeddings, (0, 0, 0, text_len - embeddings.shape[0])).clone()


class PromptContext:
    def __init__(self, text: str, embeddings: torch.Tensor, text_len: int) -> None:
        self.text_len = text_len
        self.text = text
        self.embeddings = _padded(embeddings, text_len)  # the prompt's own, once a transition is over
        self.from_text: str | None = None  # during a transition: the prompt it comes from
        self.from_embeddings: torch.Tensor | None = None
        self.transition_chunks = 1
        self.chunks_in = 0  # chunks of the transition started so far
        self.weight = 1.0  # the new prompt's weight in what the last chunk read
        self.pending = False  # the next chunk reads other embeddings than the last one did

    def change(self, text: str, embeddings: torch.Tensor, transition_chunks: int) -> None:
        """From the next chunk on, move to `text` over `transition_chunks` chunks (1: at once)."""
        if transition_chunks < 1:
            raise ValueError(f"transition_chunks must be at least 1, got {transition_chunks}")
        self.from_embeddings = self.read()
        self.from_text = self.text
        self.text = text
        self.embeddings = _padded(embeddings.to(self.from_embeddings), self.text_len)
        self.transition_chunks = transition_chunks
        self.chunks_in = 0
        self.weight = 0.0  # the last chunk read none of it
        self.pending = True

    def read(self) -> torch.Tensor:
        """The padded embeddings the last chunk read."""
        if self.from_embeddings is None or self.weight >= 1.0:
            return self.embeddings
        if self.weight <= 0.0:
            return self.from_embeddings
        return torch.lerp(self.from_embeddings, self.embeddings, self.weight)

    def next_chunk(self) -> torch.Tensor | None:
        """Advance to the chunk about to start: the embeddings its K/V come from when they differ
        from the last chunk's, else None (the K/V stay)."""
        if not self.pending:
            return None
        self.chunks_in += 1
        self.weight = self.chunks_in / self.transition_chunks
        current = self.read()
        if self.weight >= 1.0:
            self.from_embeddings = None  # whole: the old prompt is not needed again
            self.pending = False
        return current

    def receipt(self) -> dict[str, Any]:
        """What the last chunk read: the prompt, and during a transition its weight and the prompt it comes from."""
        if self.from_embeddings is None:
            return {"text": self.text}
        return {"text": self.text, "weight": round(self.weight, 6), "from": self.from_text}
