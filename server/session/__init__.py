"""A viewer's session (`session.py`: a state machine that owns its parts) and those parts: the
controls the engine samples (`control_source.py`), the driver's data-channel messages (`inbox.py`,
where a `prompt` or `control` message is handled), its engine session (`engine_link.py`), the media
line pacer → fan-out → recorder (`media_line.py`), its spectators and watch token (`audience.py`),
its deadlines (`timers.py`), what it generates from (`spec.py`), its stats (`stats.py`), what REST
says of it (`info.py`), its start image and the built-in scenes (`start_image.py`, `scenes.py`).
It may import snapshots/, peers/, media/, common/ and wire/."""
