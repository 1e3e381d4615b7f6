"""The server's WebRTC ends: the driver's connection (`driver_peer.py`), a viewer's send-only peer
(`viewer_peer.py`) and a spectator (`spectator.py`), loopback ICE (`ice.py`), SCTP message bounds
(`sctp.py`), offer checks (`offer.py`) and WHEP's HTTP details (`whep_http.py`). It may import
media/, common/ and wire/."""
