"""The only code that touches torch.distributed.rpc.

The roles see two small endpoints:
- `LearnerTransport`: receive() chunks, acknowledge() them, publish() weights, stop_collectors(), close();
- `CollectorTransport`: send() a chunk, poll_weights() / wait_weights(), stop_requested, close().
`transport.kind` chooses where their tensors live; the roles do not change with it.
"""

from rl_dqn.transport.rpc import (
    LEARNER_RANK,
    CollectorTransport,
    Delivery,
    LearnerTransport,
    TransportError,
    collector_rank,
    worker_name,
)

__all__ = ["LEARNER_RANK", "CollectorTransport", "Delivery", "LearnerTransport", "TransportError",
           "collector_rank", "worker_name"]
