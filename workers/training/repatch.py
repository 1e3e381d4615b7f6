"""Warm-starting a DiT for a VAE of another spatial stride.

A token of gridworld's DiT is a 2×2 patch of 8-pixel latent cells; one of gridworld-4x's is a 4×4
patch of 4-pixel cells. Both cover the same 16×16 pixels, so the trained DiT's work between the token
embedding and the head carries over unchanged: the blocks (attention, FFN, the per-block camera scale
and shift), the time and text embeddings, and the camera path. The camera path's input is the same
Plücker rays of the same 16×16 pixels listed in another order, so its first linear layer is permuted
to read each pixel where it now lies: with the same poses it computes exactly what it did. Only the
patch embedding and the head speak the latent space, which is new, so they keep the new DiT's own
initialisation.
"""

from __future__ import annotations

import torch

from workers.models.dit import WanDiT

LATENT_SPACE_KEYS = ("patch_embedding.weight", "patch_embedding.bias", "head.head.weight", "head.head.bias")
CAMERA_IN = "patch_embedding_wancamctrl.weight"


def camera_pixel_order(cell_px: int, patch: int, channels: int) -> torch.Tensor:
    """For each input feature of the camera embedding, the (channel, row, column) of the pixel it
    reads inside its token's square, as one index c·S² + y·S + x (S = cell_px·patch). The features
    are ordered (channel, row in cell, column in cell, patch row, patch column): `plucker_cells`
    then `WanDiT.chunk_camera`."""
    c, i, j, pr, pc = torch.meshgrid(
        *(torch.arange(n) for n in (channels, cell_px, cell_px, patch, patch)), indexing="ij"
    )
    side = cell_px * patch
    return (c * side * side + (pr * cell_px + i) * side + (pc * cell_px + j)).flatten()


def source_patch(trained: dict[str, torch.Tensor]) -> int:
    return int(trained["patch_embedding.weight"].shape[-1])


def repatch(trained: dict[str, torch.Tensor], dit: WanDiT) -> dict[str, torch.Tensor]:
    """A trained DiT state for `dit`'s patch size: the latent-space layers from `dit` itself, the
    camera input permuted, the rest as trained. The identity when the patch sizes agree."""
    _, ph, pw = dit.cfg.patch_size
    old = source_patch(trained)
    if ph != pw:
        raise ValueError(f"square patches only, not {ph}×{pw}")
    if old == ph:
        return trained
    side = dit.cfg.camera_cell_pixels * ph
    if side % old:
        raise ValueError(f"a {old}×{old} patch cannot cover the {side}-pixel squares of this DiT's tokens")
    channels = dit.cfg.camera_channels
    # new feature f reads pixel new_order[f]; the trained layer read it at feature old_at[pixel]
    new_order = camera_pixel_order(dit.cfg.camera_cell_pixels, ph, channels)
    old_at = torch.empty_like(new_order)
    old_at[camera_pixel_order(side // old, old, channels)] = torch.arange(len(new_order))
    own = dit.state_dict()
    state = dict(trained) | {k: own[k].detach().clone() for k in LATENT_SPACE_KEYS}
    state[CAMERA_IN] = trained[CAMERA_IN][:, old_at[new_order]].clone()
    return state
