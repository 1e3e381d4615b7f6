"""A file served while it grows (a recording's MP4) is sent as it was when the request came: the body
is exactly the length the response declares, however much is appended meanwhile."""

from __future__ import annotations

import os
from pathlib import Path

from server.media.growing_file import CHUNK_BYTES, growing_file_response


async def test_appends_during_the_response_are_not_sent(tmp_path: Path) -> None:
    path = tmp_path / "video.mp4"
    first = os.urandom(3 * CHUNK_BYTES + 28)
    path.write_bytes(first)
    response = growing_file_response(path, "video/mp4", "worldrtc-s.mp4")
    assert response.headers["content-length"] == str(len(first))
    assert response.headers["content-disposition"] == 'attachment; filename="worldrtc-s.mp4"'
    with path.open("ab") as f:
        f.write(b"x" * 100)  # a fragment appended before the body starts
    sent = b""
    async for chunk in response.body_iterator:
        assert isinstance(chunk, bytes)
        sent += chunk
        with path.open("ab") as f:
            f.write(b"y" * CHUNK_BYTES)  # and one after every chunk sent
    assert sent == first


async def test_a_file_removed_after_it_was_opened_is_still_sent_whole(tmp_path: Path) -> None:
    path = tmp_path / "video.mp4"
    data = os.urandom(2 * CHUNK_BYTES + 5)
    path.write_bytes(data)
    body = aiter(growing_file_response(path, "video/mp4", "v.mp4").body_iterator)
    sent = await anext(body)
    path.unlink()  # the quota removes it mid-download
    async for chunk in body:
        assert isinstance(chunk, bytes)
        sent += chunk
    assert sent == data
