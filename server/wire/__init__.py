"""The wire contract, torch-free: every message and body both ways (`protocol.py`) and when a
viewer's next chunk starts (`dispatch.py`). It imports nothing else of server/."""
