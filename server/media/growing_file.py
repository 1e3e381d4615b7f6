"""An HTTP response for a file that may still be growing: a session's MP4 while its recorder appends
fragments to it.

Starlette's FileResponse declares the length the file has when the response starts and then reads
to the end of the file; a fragment appended between the two makes it send more bytes than it
declared, and the server aborts the connection mid-body. This response serves the file as it was
when the request came: exactly the length it declares, which for a fragmented MP4 is a video that
plays up to its last whole fragment. Range requests get the whole prefix (HTTP lets a server
ignore Range); the file is opened inside the body, so a response that never runs holds no file.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi.responses import StreamingResponse

CHUNK_BYTES = 64 * 1024


def growing_file_response(path: Path, media_type: str, filename: str) -> StreamingResponse:
    """`path`'s first bytes up to its length now, as a download named `filename`. The file may grow
    meanwhile, or be removed once the body has opened it (the open handle still reads it)."""
    size = os.stat(path).st_size

    async def body() -> AsyncIterator[bytes]:
        with path.open("rb") as f:
            left = size
            while left > 0:
                chunk = await asyncio.to_thread(f.read, min(CHUNK_BYTES, left))
                if not chunk:  # it shrank, which a recording never does: the client sees a short body
                    return
                left -= len(chunk)
                yield chunk

    headers = {"Content-Length": str(size), "Content-Disposition": f'attachment; filename="{filename}"'}
    return StreamingResponse(body(), media_type=media_type, headers=headers)
