"""The signaling and streaming server (FastAPI + aiortc), in packages by job. From the top of the
import layering down (each may import only the ones below it; `make lint` checks it):

    http/          the app, its process (serve, drain, exit), dependencies, error responses, body
                   limits, and every route (`http/routes/`, one module per resource)
    state.py       what the app holds: its sessions, the line, the snapshot book, the engine
    waiting_room/  the line of tickets, admission, and the usher that seats the head ticket
    startup/       what a start decides before anything loads (the memory fit)
    session/       a viewer's session and its parts (controls, inbox, engine link, media line, timers)
    snapshots/     what a snapshot is, the book of who may open one, saves on disk, the shelf
    peers/         WebRTC and WHEP peers: driver, viewer, spectator, ICE, SCTP, offers
    media/         pacing, encoding, fan-out to viewers, recordings and their MP4
    common/        errors, settings, metrics, logs, rate limits, owned tasks, memory, phase, TURN
    wire/          the wire formats both ways and the dispatch policy (no torch)
"""
