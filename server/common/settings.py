"""Server settings: command-line flags and WORLDRTC_* environment variables, validated once."""

from __future__ import annotations

import ipaddress
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from server.common.turn_credentials import TurnConfig
from server.wire.dispatch import DispatchPolicy
from workers.models.attention_backend import AttentionBackend
from workers.models.presets import DEFAULT_PRESET
from workers.models.savings import MAX_VAE_BANDS, Quantization, Savings, VAEDtype

if TYPE_CHECKING:
    from workers.models.kernels import KernelConfig


class TurnHandover(StrEnum):
    """How a turn hands the slot on (WORLDRTC_TURN_HANDOVER; the waiting room's usher acts on it)."""

    FRESH = "fresh"  # the next person starts their own world, as after any session
    CONTINUE = "continue"  # the next person takes over the same world where it is (a branch of a snapshot)


# Off loopback a session ends after 10 minutes unless the operator says otherwise: long enough to
# walk through a world (a 14B chunk is 0.75 s, so 800 chunks), short enough that a queue of visitors
# for a 2-slot GPU node waits minutes, not hours. TeleFuser's public demos use 120 s; these worlds are
# explored, not glimpsed.
DEFAULT_MAX_SESSION_S = 600.0


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="WORLDRTC_", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    model: str = DEFAULT_PRESET  # a preset, or "synthetic" (workers/runtime/synthetic.py)
    stage_ms: str | None = None  # synthetic model: "encode,dit,decode" hold times in ms
    synthetic_geometry: str | None = None  # synthetic model: the preset whose tensor shapes flow
    synthetic_state_mib: float = Field(default=0.0, ge=0)  # synthetic model: each session's DiT state
    placement: str = "cpu"
    # The release's directory as published; without it a released preset resolves its files through
    # the Hugging Face cache (workers/models/resolve.py). assets_dir: where a DiT-only release's VAE,
    # umT5 and tokenizer are (the 1.3B takes the 14B's).
    checkpoint_dir: str | None = None
    assets_dir: str | None = None
    weights_seed: int = 0
    # Seeded random weights for a preset that runs on released ones: its real shapes, timing and
    # memory on a machine without the checkpoint (the frames are noise). Excludes checkpoint_dir.
    random_weights: bool = False
    # DiT kernels (workers/models/kernels.py): attention backend, torch.compile, deterministic mode.
    attention: AttentionBackend = AttentionBackend.AUTO
    compile: bool = False
    deterministic: bool = False
    # Memory savings (workers/models/savings.py); the server adds more, cheapest first, when the
    # memory plan needs them to fit (workers/runtime/savings_plan.py), and says which.
    quantization: Quantization = Quantization.NONE
    text_encoder_on_cpu: bool = False
    vae_dtype: VAEDtype = VAEDtype.AUTO
    vae_bands: int = Field(default=1, ge=1, le=MAX_VAE_BANDS)
    max_sessions: int = Field(default=2, ge=1)
    # Spectators (server/peers/spectator.py) take no generation slot; each costs a peer connection and the
    # packetizing of frames encoded once for the session. 0 turns watching off.
    max_spectators_per_session: int = Field(default=16, ge=0)
    max_spectators: int = Field(default=64, ge=0)  # on this node, all sessions together
    # Snapshots (server/http/routes/snapshots.py): host memory for every worker's parts of them together, least
    # recently used evicted first; 0 turns snapshots off. With a spill directory, evicted snapshots
    # move there first, within snapshot_spill_gib (they are lost when a stage restarts or the server stops).
    snapshot_budget_gib: float = Field(default=4.0, ge=0)
    snapshot_spill_dir: Path | None = None
    snapshot_spill_gib: float = Field(default=16.0, ge=0)
    # Saves that outlive the server (server/snapshots/saves.py): with a directory, every snapshot is
    # also written there and read back at the next start; the oldest go first past the quota. None
    # (the default for an app built in code): snapshots live as long as the workers. `worldrtc serve`
    # defaults it to a folder under the user's state directory.
    snapshot_dir: Path | None = None
    snapshot_dir_quota_gib: float = Field(default=20.0, gt=0)
    # Memory the plan may use (workers/runtime/memory_plan.py): per GPU, and the host's for CPU
    # placements. None: what the device reports, and the host's available memory.
    device_memory_gib: float | None = Field(default=None, gt=0)
    host_memory_gib: float | None = Field(default=None, gt=0)
    fps: int | None = Field(default=None, ge=1, le=60)  # video frame rate; None: the model's
    dispatch: DispatchPolicy = DispatchPolicy.JIT  # when a viewer's next chunk starts (server/wire/dispatch.py)
    # JIT's slack between a chunk's predicted arrival and the moment the pacer needs it: each ms of it
    # is a ms of glass-to-glass latency; too little and a late chunk makes the pacer repeat frames.
    dispatch_margin_ms: float = Field(default=100.0, ge=0, le=2000)
    api_token: str | None = None
    # Browser origins (scheme://host:port) other than the server's own that may call the API; empty: none.
    cors_origins: list[str] = Field(default_factory=list)
    # WebRTC: nothing reaches outside by default. Each entry is an RTCIceServer-like dict.
    ice_servers: list[dict[str, object]] = Field(default_factory=list)
    # TURN with per-session time-limited credentials (server/common/turn_credentials.py): the TURN server's URLs and the
    # secret it shares (coturn: use-auth-secret, static-auth-secret). Both, or neither.
    # This node's base URL as clients reach it (e.g. "https://gpu-3.example.org"), when it runs behind
    # a balancer: a session's URLs point at the node that holds it (docs/deploy.md, "Many nodes").
    public_url: str | None = Field(default=None, pattern=r"^https?://[^/\s]+$")
    turn_urls: list[str] = Field(default_factory=list)
    turn_secret: str | None = None
    turn_ttl_s: float = Field(default=24 * 3600.0, gt=0)
    udp_port_min: int | None = Field(default=None, ge=1, le=65535)
    udp_port_max: int | None = Field(default=None, ge=1, le=65535)
    video_bitrate_bps: int = Field(default=1_500_000, ge=100_000, le=50_000_000)
    # Limits: every wait, body and message rate has one (docs/reliability.md, "Limits").
    offer_timeout_s: float = 30.0
    ice_timeout_s: float = 15.0
    # A viewer that vanishes without closing stops sending RTCP receiver reports (every client that
    # receives video sends them about every second): after this long without one, the session ends.
    peer_timeout_s: float = Field(default=4.5, gt=0)
    idle_timeout_s: float | None = Field(default=300.0, gt=0)  # no control message for this long ends a session
    disconnected_grace_s: float = 3.0
    rest_body_max_bytes: int = 64 * 1024
    # A start image is fitted to the model's resolution (832×480 at most): 4 MiB holds any sensible
    # photo, and the browser client scales larger ones down before it sends them.
    image_max_bytes: int = Field(default=4 * 1024 * 1024, ge=64 * 1024)
    image_max_pixels: int = Field(default=4096 * 4096, ge=1)  # read from the header, before decoding
    sdp_max_bytes: int = 32 * 1024
    control_rate_per_s: float = Field(default=120.0, gt=0)
    # Prompt changes a driver may send (burst: one second's worth). Faster than chunks they collapse
    # (the engine encodes the latest), so this only stops a flood: a page that sends as you type fits.
    prompt_rate_per_s: float = Field(default=60.0, gt=0)
    # Invalid data-channel messages a session may send in `abuse_window_s` before it is closed
    # (`protocol_abuse`); a client that follows the published contract sends none.
    abuse_limit: int = Field(default=50, ge=1)
    abuse_window_s: float = Field(default=10.0, gt=0)
    # Session creation (REST and WHEP) per client address: `create_burst` at once, then
    # `create_rate_per_min`. A browser that reloads now and then never meets it.
    create_rate_per_min: float = Field(default=30.0, gt=0)
    create_burst: int = Field(default=10, ge=1)
    # The longest a session may run. Unset: none on loopback (a developer's own machine), and
    # DEFAULT_MAX_SESSION_S off loopback, where a slot is a shared GPU. 0: no limit.
    max_session_s: float | None = Field(default=None, ge=0)
    drain_timeout_s: float = Field(default=30.0, ge=0)
    # The waiting room (server/waiting_room/line.py): with every slot taken, a REST create gets a ticket
    # (202) rather than 429, unless it sends "queue": false. WHEP offers never wait (no ticket to hold).
    queue: bool = True
    queue_max: int = Field(default=100, ge=1)  # tickets waiting at once; then 429 queue_full
    queue_per_client: int = Field(default=2, ge=1)  # tickets one address may hold at once
    ticket_silence_s: float = Field(default=30.0, gt=0)  # a ticket not polled this long is dropped
    connect_window_s: float = Field(default=60.0, gt=0)  # a ready ticket's holder offers within this
    queue_watch: bool = True  # tickets carry a watch URL and token for the world they wait for
    # Turns (server/waiting_room/usher.py): while someone waits, a driver's session ends after max_turn_s
    # (`turn_ending` turn_warning_s before, `done` turn_over); with nobody waiting it goes on. None: no
    # turns. fresh: the next person starts their own world; continue: they take over this one.
    max_turn_s: float | None = Field(default=None, gt=0)
    turn_warning_s: float = Field(default=10.0, ge=0)
    turn_handover: TurnHandover = TurnHandover.FRESH
    stats_interval_s: float = 1.0
    # A closed session stays listed this long, with its recording and video (server/media/recording.py):
    # time enough to download them after the end.
    closed_session_keep_s: float = 600.0
    # Where sessions' videos are written (None: a temporary directory that goes with the server), and
    # the most they may take there; the oldest finished video is removed first.
    record: bool = True  # keep each session's recording and video (server/media/recording.py)
    recordings_dir: str | None = None
    recordings_quota_mib: float = Field(default=2048.0, gt=0)

    @property
    def kernels(self) -> KernelConfig:
        from workers.models.kernels import KernelConfig  # torch: not needed to validate settings

        return KernelConfig(self.attention, self.compile, self.deterministic)

    @property
    def savings(self) -> Savings:
        return Savings(self.quantization, self.text_encoder_on_cpu, self.vae_dtype, self.vae_bands)

    @property
    def turn(self) -> TurnConfig | None:
        if self.turn_secret is None:
            return None
        return TurnConfig(tuple(self.turn_urls), self.turn_secret, self.turn_ttl_s)

    @field_validator("snapshot_dir", mode="before")
    @classmethod
    def _no_saves(cls, v: Any) -> Any:
        return None if v == "" else v  # WORLDRTC_SNAPSHOT_DIR= (empty): no saves on disk

    @field_validator("udp_port_max")
    @classmethod
    def _range(cls, v: int | None, info: ValidationInfo) -> int | None:
        lo = info.data.get("udp_port_min")
        if (v is None) != (lo is None):
            raise ValueError("set both udp_port_min and udp_port_max, or neither")
        if v is not None and lo is not None and v < lo:
            raise ValueError("udp_port_max must be >= udp_port_min")
        return v

    @model_validator(mode="before")
    @classmethod
    def _session_limit(cls, data: Any) -> Any:
        unset = isinstance(data, dict) and data.get("max_session_s") is None
        if unset and not is_loopback_host(str(data.get("host", "127.0.0.1"))):
            data = {**data, "max_session_s": DEFAULT_MAX_SESSION_S}
        return data

    @property
    def session_limit_s(self) -> float | None:
        """The longest a session may run (None: no limit)."""
        return self.max_session_s or None

    @model_validator(mode="after")
    def _token_off_loopback(self) -> Settings:
        if not self.is_loopback and not self.api_token:
            raise ValueError(
                f"binding {self.host} exposes the server beyond this machine: set WORLDRTC_API_TOKEN "
                "(or --api-token), or bind 127.0.0.1"
            )
        return self

    @model_validator(mode="after")
    def _one_weights_source(self) -> Settings:
        if self.random_weights and (self.checkpoint_dir is not None or self.assets_dir is not None):
            raise ValueError("--random-weights and --checkpoint-dir exclude each other: choose one")
        if self.assets_dir is not None and self.checkpoint_dir is None:
            raise ValueError("--assets-dir completes a --checkpoint-dir that holds a DiT alone: pass both")
        return self

    @model_validator(mode="after")
    def _turn_pair(self) -> Settings:
        if bool(self.turn_urls) != (self.turn_secret is not None):
            raise ValueError("set both WORLDRTC_TURN_URLS and WORLDRTC_TURN_SECRET, or neither")
        bad = [u for u in self.turn_urls if not u.startswith(("turn:", "turns:"))]
        if bad:
            raise ValueError(f"turn_urls must be turn: or turns: URLs, got {bad}")
        return self

    @property
    def is_loopback(self) -> bool:
        return is_loopback_host(self.host)


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
