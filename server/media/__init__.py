"""Frames to viewers and to disk: the pacer (`pacer.py`), one encode per session for every viewer
(`fanout.py`, `shared_encoder.py`, `video_track.py`, `codecs.py`), recordings (`recording.py`,
`recording_store.py`) and their MP4 (`mp4_writer.py`, `growing_file.py`), the stage timeline
(`timeline.py`). It may import common/ and wire/."""
