"""The LingBot-World model family (Wan DiT with camera control, Wan2.1 VAE, umT5) in torch."""
