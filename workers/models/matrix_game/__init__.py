"""Matrix-Game 2.0 (SkyworkAI): a Wan-1.3B causal, few-step video DiT driven by keyboard and mouse.

- `config`: the shapes, and the three released distilled variants (universal, GTA drive, Temple Run).
- `actions`: which per-video-frame actions each latent frame reads.
- `action_module`: the mouse and keyboard paths inside the first blocks, with their own RoPE.
- `cache`: a session's rolling caches (self-attention, mouse, keyboard), staged and committed together.
- `dit`: the DiT, whose parameter names are the released checkpoint's.
- `controls`: our keys and mouse look -> each variant's per-frame actions, and a session's history.
"""
