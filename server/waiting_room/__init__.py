"""The waiting room: the line of tickets in arrival order, their tokens, drops and wait estimate
(`line.py`), what a create admits (`admission.py`), and the usher (`usher.py`) that seats the head
ticket when a slot frees and ends turns while someone waits. It may import session/, snapshots/,
common/ and wire/; the usher sees the app's state only through the `SeatingServer` it names."""
