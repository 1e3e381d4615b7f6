"""Model code in torch: the LingBot-World family (Wan DiT with camera control, Wan2.1 VAE, umT5) and
Matrix-Game 2.0's action-driven DiT (`matrix_game/`) with the CLIP image encoder it conditions on
(`clip.py`)."""
