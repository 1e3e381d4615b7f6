"""Snapshots on the server side: what one is and what it was made with (`snapshot.py`), the book of
which line may open which (`book.py`), saves on disk that outlive the server (`saves.py`: the
metadata and manifest beside the workers' parts), and the shelf that finds one in the book, the
engine's catalog or the saves (`shelf.py`). Taking one and writing a save are a route's work
(server/http/routes/snapshots.py). It may import media/, common/ and wire/."""
