"""What an SDP offer must hold before aiortc is given it.

aiortc accepts some offers it cannot connect: without a DTLS fingerprint its connect task dies on
an assertion (an unretrieved task exception, and a session that hangs until its ICE timeout), and
with some odd section layouts it builds transceivers without a transport and fails later, inside
createAnswer or close. So an offer is read once here, with aiortc's own parser, and refused with a
reason unless every media section has ICE credentials and a DTLS fingerprint, there is a video
section to send on, and the sections are few (a viewer needs video and a data channel).
"""

from __future__ import annotations

import logging

from aiortc import sdp as aiortc_sdp

log = logging.getLogger(__name__)

MAX_MEDIA_SECTIONS = 8  # video, a data channel, perhaps audio: browsers offer 2-3


class OfferError(ValueError):
    """The offer cannot be used; the message says why."""


def validate_offer(text: str) -> None:
    """Raise OfferError unless the offer is one the server can answer and connect."""
    try:
        parsed = aiortc_sdp.SessionDescription.parse(text)
    except Exception as exc:  # the parser asserts and indexes freely: anything it raises is a bad offer
        log.info("unparsable offer: %s: %s", type(exc).__name__, exc)
        raise OfferError("could not parse the SDP offer; send the offer your WebRTC stack created, unchanged") from None
    media = parsed.media
    if not media:
        raise OfferError("the offer has no media sections")
    if len(media) > MAX_MEDIA_SECTIONS:
        raise OfferError(f"the offer has {len(media)} media sections; at most {MAX_MEDIA_SECTIONS} are accepted")
    if not any(m.kind == "video" for m in media):
        raise OfferError("the offer must include a video section (recvonly)")
    mids = [m.rtp.muxId for m in media]
    for group in parsed.group:
        # aiortc moves a BUNDLE group's media onto its first member's transport: if that member is
        # not in the offer, they are left with none.
        if group.semantic == "BUNDLE" and group.items and group.items[0] not in mids:
            raise OfferError(f"the BUNDLE group starts with mid {group.items[0]!r}, which no media section has")
    for i, m in enumerate(media):
        if m.ice is None or not m.ice.usernameFragment or not m.ice.password:
            raise OfferError(f"media section {i} ({m.kind}) has no ICE username fragment or password")
        if m.dtls is None or not m.dtls.fingerprints:
            raise OfferError(f"media section {i} ({m.kind}) has no DTLS fingerprint")
