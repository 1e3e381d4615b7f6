"""What a server's start decides before anything loads: which memory savings it runs with (the same
plan as `worldrtc plan`). It may import the workers' planning code and server/common/settings.py, and
nothing else of server/."""
