"""Which handler serves a worker: the synthetic timing model's for every stage when it is on, else
the stage's own. One table, so adding a stage or a model kind is one line."""

from __future__ import annotations

from workers.parallel.group import StageGroup
from workers.runtime.decode_handler import DecodeHandler
from workers.runtime.dit_handler import DitHandler
from workers.runtime.encode_handler import EncodeHandler
from workers.runtime.handler import StageHandler
from workers.runtime.messages import Stage
from workers.runtime.spec import WorkerSpec
from workers.runtime.synthetic_handler import SyntheticHandler

HANDLERS: dict[Stage, type[StageHandler]] = {
    Stage.ENCODE: EncodeHandler,
    Stage.DIT: DitHandler,
    Stage.DECODE: DecodeHandler,
}


def build_handler(spec: WorkerSpec, group: StageGroup) -> StageHandler:
    handler = SyntheticHandler if spec.synthetic is not None else HANDLERS[spec.stage]
    return handler(spec, group)
