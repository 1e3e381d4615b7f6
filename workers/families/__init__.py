"""Model families: what each world-model family gives the stages and the server (`family.py`), one
module per family (`lingbot_world.py`, `matrix_game.py`), and the registry that picks a preset's
(`registry.py`). A family assembles its model code (workers/models) and its stage sessions
(workers/stages); the runtime and the server reach every family through `family_for(preset)` alone."""
