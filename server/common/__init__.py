"""What every part of the server shares: errors (`errors.py`), settings (`settings.py`), metrics,
logs, rate limits, owned tasks, memory reclaiming, the server's phase and TURN credentials
(`turn_credentials.py`). It may import wire/ and nothing else of server/."""
