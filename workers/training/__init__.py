"""Training the embedded `gridworld` preset on the procedural world (workers/world), reproducibly.

`python -m workers.training` renders its data from the world renderer, trains the VAE, encodes the
DiT's data set with that VAE, trains the causal DiT, and exports the weights with a model card.
Every phase checkpoints and resumes; every random draw comes from a seed. See __main__.py.
"""
